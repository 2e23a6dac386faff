"""fsguard.landlock: pure policy at every ABI, and the real kernel enforcing it in forked children.

Every kernel test forks: Landlock can never be lifted, so pytest itself must never call apply().
Each child reports through a pipe as JSON and leaves with os._exit. Every blocked action is also run
in a control child that did NOT apply Landlock, where it must succeed - otherwise the test could pass
because the action was impossible anyway (wrong path, other filesystem, missing privilege).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsguard import landlock as ll
from fsguard.landlock import DEFAULT_DEVICES, LandlockError, Plan, abi_version, apply, handled_rights, plan

from ..support.kernelprobe import attempt, in_child

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
V1_WRITE = (
    WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_CHAR
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_BLOCK
    | MAKE_SYM
)
READ_SIDE = EXECUTE | READ_FILE | READ_DIR
FILE_VALID = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
ABIS = range(1, 8)


# ---------------------------------------------------------------------------------------------- pure policy


def test_constants_match_uapi_header() -> None:
    # Values from include/uapi/linux/landlock.h; a typo here would silently leave a right unhandled.
    assert (ll.ACCESS_FS_EXECUTE, ll.ACCESS_FS_WRITE_FILE, ll.ACCESS_FS_READ_FILE, ll.ACCESS_FS_READ_DIR) == (
        EXECUTE,
        WRITE_FILE,
        READ_FILE,
        READ_DIR,
    )
    assert (ll.ACCESS_FS_REMOVE_DIR, ll.ACCESS_FS_REMOVE_FILE, ll.ACCESS_FS_MAKE_CHAR, ll.ACCESS_FS_MAKE_DIR) == (
        REMOVE_DIR,
        REMOVE_FILE,
        MAKE_CHAR,
        MAKE_DIR,
    )
    assert (ll.ACCESS_FS_MAKE_REG, ll.ACCESS_FS_MAKE_SOCK, ll.ACCESS_FS_MAKE_FIFO, ll.ACCESS_FS_MAKE_BLOCK) == (
        MAKE_REG,
        MAKE_SOCK,
        MAKE_FIFO,
        MAKE_BLOCK,
    )
    assert (ll.ACCESS_FS_MAKE_SYM, ll.ACCESS_FS_REFER, ll.ACCESS_FS_TRUNCATE, ll.ACCESS_FS_IOCTL_DEV) == (
        MAKE_SYM,
        REFER,
        TRUNCATE,
        IOCTL_DEV,
    )
    assert (ll.SCOPE_ABSTRACT_UNIX_SOCKET, ll.SCOPE_SIGNAL) == (1, 2)
    assert (ll.LANDLOCK_CREATE_RULESET_VERSION, ll.LANDLOCK_RULE_PATH_BENEATH) == (1, 1)
    syscalls = (ll._SYS_LANDLOCK_CREATE_RULESET, ll._SYS_LANDLOCK_ADD_RULE, ll._SYS_LANDLOCK_RESTRICT_SELF)
    assert syscalls == (444, 445, 446)


def test_struct_layouts() -> None:
    assert ctypes.sizeof(ll._PathBeneathAttr) == 12  # packed: a padded 16-byte struct would misplace nothing, but
    assert ll._PathBeneathAttr.parent_fd.offset == 8  # the kernel copies exactly 12 bytes, so layout must match
    assert ctypes.sizeof(ll._RulesetAttr) == 24
    assert [ll._ruleset_attr_size(abi) for abi in ABIS] == [8, 8, 8, 16, 16, 24, 24]


@pytest.mark.parametrize("abi", ABIS)
def test_handled_rights_per_abi(abi: int) -> None:
    rights = handled_rights(abi)
    assert rights & V1_WRITE == V1_WRITE  # every ABI-1 write right, always
    assert bool(rights & REFER) == (abi >= 2)
    assert bool(rights & TRUNCATE) == (abi >= 3)
    assert bool(rights & IOCTL_DEV) == (abi >= 5)
    assert rights & READ_SIDE == 0  # reads are the mount namespace's job
    assert rights & ~((1 << 16) - 1) == 0  # nothing unknown to ABI 7 (the kernel would EINVAL)


def test_handled_rights_exact_values() -> None:
    assert handled_rights(0) == 0
    assert handled_rights(1) == V1_WRITE
    assert handled_rights(2) == V1_WRITE | REFER
    assert handled_rights(3) == handled_rights(4) == V1_WRITE | REFER | TRUNCATE
    assert handled_rights(5) == handled_rights(6) == handled_rights(7) == V1_WRITE | REFER | TRUNCATE | IOCTL_DEV


@given(st.integers(min_value=0, max_value=64))
def test_handled_rights_monotonic_and_write_only(abi: int) -> None:
    assert handled_rights(abi) & handled_rights(abi + 1) == handled_rights(abi)  # a newer kernel never loses a right
    assert handled_rights(abi) & READ_SIDE == 0


@pytest.mark.parametrize("bad", [-1, True, 1.0, "7"])
def test_handled_rights_rejects_bad_abi(bad: object) -> None:
    with pytest.raises(LandlockError):
        handled_rights(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("abi", ABIS)
def test_plan_per_abi(abi: int) -> None:
    p = plan(["/work", "/tmp/x"], abi=abi)
    assert p == Plan(abi=abi, write_roots=("/work", "/tmp/x"), write_files=DEFAULT_DEVICES, scope_ipc=abi >= 6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.abi = 0  # type: ignore[misc]  # frozen: nobody widens a plan after it was decided


@pytest.mark.parametrize("abi", ABIS)
def test_rule_rights_per_abi(abi: int) -> None:
    h = handled_rights(abi)
    device = ll._rule_rights(h, is_dir=False, device=True)
    assert device & ~FILE_VALID == 0  # or the kernel returns EINVAL for a file rule
    assert device & WRITE_FILE
    assert bool(device & TRUNCATE) == (abi >= 3) and bool(device & IOCTL_DEV) == (abi >= 5)
    assert ll._rule_rights(h, is_dir=False, device=False) & ~FILE_VALID == 0  # a single-file write root
    # Directories (write roots, /dev/pts, /dev/shm): every handled right except making device nodes.
    assert ll._rule_rights(h, is_dir=True, device=True) == h & ~(MAKE_CHAR | MAKE_BLOCK)
    assert ll._rule_rights(h, is_dir=True, device=False) == h & ~(MAKE_CHAR | MAKE_BLOCK)
    assert h & MAKE_CHAR and h & MAKE_BLOCK  # still handled: denied everywhere, not silently allowed
    assert ll._rule_rights(h, is_dir=True, device=False) & (MAKE_FIFO | MAKE_SOCK | MAKE_SYM | MAKE_REG) == (
        MAKE_FIFO | MAKE_SOCK | MAKE_SYM | MAKE_REG
    )


def test_default_devices() -> None:
    assert DEFAULT_DEVICES == (
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/dev/ptmx",
        "/dev/pts",
        "/dev/shm",
    )


def test_plan_defaults_to_running_kernel() -> None:
    p = plan(["/tmp"])
    assert p.abi == abi_version() and p.scope_ipc == (p.abi >= 6)


@given(st.lists(st.sampled_from(["/a", "/b", "/a/b", "/dev/null", "/ü n i"]), max_size=8))
def test_plan_keeps_order_and_dedupes(paths: list[str]) -> None:
    p = plan(paths, write_files=paths, abi=3)
    assert p.write_roots == p.write_files == tuple(dict.fromkeys(paths))


def test_plan_rejects_bad_paths() -> None:
    with pytest.raises(TypeError):
        plan("/tmp", abi=7)  # a str is a sequence of one-letter "paths" (so the type checker lets it through)
    with pytest.raises(LandlockError, match="absolute"):
        plan(["relative/dir"], abi=7)
    with pytest.raises(LandlockError, match="NUL"):
        plan(["/tmp/a\0b"], abi=7)
    with pytest.raises(LandlockError):
        plan(["/tmp"], abi=-1)


def test_error_message_is_one_line() -> None:
    with pytest.raises(LandlockError) as exc:
        plan(["rel\nx"], abi=7)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("Landlock")
    assert exc.value.errno == errno.EINVAL and isinstance(exc.value, OSError)


# ------------------------------------------------------------------------------------------ fork harness


def write(path: str | Path, mode: str = "w") -> None:
    with open(path, mode) as f:
        f.write("sandboxed")


def no_new_privs() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("NoNewPrivs:"):
            return int(line.split()[1])
    raise AssertionError("no NoNewPrivs line")


@pytest.fixture(scope="module")
def kernel_abi() -> int:
    abi = abi_version()
    if abi == 0:
        pytest.fail(
            "Landlock is unavailable on this kernel (abi_version() == 0); sandgate cannot restrict writes",
            pytrace=False,
        )
    return abi


@pytest.fixture
def scratch(kernel_abi: int) -> Iterator[Callable[[], tuple[Path, Path]]]:
    """Fresh (W, O) directory pairs on one filesystem, so EXDEV can only come from Landlock."""
    base = Path(tempfile.mkdtemp(prefix="sandgate-landlock-"))
    count = 0

    def make() -> tuple[Path, Path]:
        nonlocal count
        count += 1
        w, o = base / f"W{count}", base / f"O{count}"
        for d in (w, o, w / "sub", w / "emptydir"):
            d.mkdir()
        for f in ("existing.txt", "victim.txt", "a.txt", "mv-out.txt"):
            (w / f).write_text("inside")
        for f in ("target.txt", "via-link.txt", "linksrc.txt", "mv-in.txt", "victim.txt", "single.txt"):
            (o / f).write_text("outside")
        return w, o

    try:
        yield make
        # The parent must never have been restricted: it can still write outside every W.
        (base / "parent-was-never-restricted").write_text("ok")
        assert no_new_privs() == 0
    finally:
        shutil.rmtree(base)


def fs_actions(w: Path, o: Path) -> dict[str, Callable[[], object]]:
    """Run in order; inside-W actions first, then escapes."""
    return {
        "create_in_W": lambda: write(w / "new.txt"),
        "append_in_W": lambda: write(w / "existing.txt", "a"),
        "truncate_in_W": lambda: os.truncate(w / "existing.txt", 0),
        "mkdir_in_W": lambda: os.mkdir(w / "newdir"),
        "rmdir_in_W": lambda: os.rmdir(w / "emptydir"),
        "unlink_in_W": lambda: os.unlink(w / "victim.txt"),
        "rename_in_W": lambda: os.rename(w / "a.txt", w / "sub" / "a.txt"),  # across directories: needs REFER
        "mkfifo_in_W": lambda: os.mkfifo(w / "fifo"),
        "symlink_to_O_in_W": lambda: os.symlink(o / "via-link.txt", w / "escape"),
        "dev_null": lambda: write("/dev/null"),
        "append_outside": lambda: write(o / "target.txt", "a"),
        "create_outside": lambda: write(o / "new.txt"),
        "truncate_outside": lambda: os.truncate(o / "target.txt", 0),
        "unlink_outside": lambda: os.unlink(o / "victim.txt"),
        "mkdir_outside": lambda: os.mkdir(o / "newdir"),
        "write_through_symlink": lambda: write(w / "escape", "a"),
        "hardlink_O_into_W": lambda: os.link(o / "linksrc.txt", w / "hardlink.txt"),
        "rename_W_to_O": lambda: os.rename(w / "mv-out.txt", o / "mv-out.txt"),
        "rename_O_to_W": lambda: os.rename(o / "mv-in.txt", w / "mv-in.txt"),
    }


BLOCKED = {
    "append_outside": {"EACCES"},
    "create_outside": {"EACCES"},
    "truncate_outside": {"EACCES"},
    "unlink_outside": {"EACCES"},
    "mkdir_outside": {"EACCES"},
    "write_through_symlink": {"EACCES"},
    "hardlink_O_into_W": {"EXDEV", "EACCES"},
    "rename_W_to_O": {"EXDEV", "EACCES"},
    "rename_O_to_W": {"EXDEV", "EACCES"},
}


def run_fs_probe(w: Path, o: Path, restrict: bool) -> dict[str, str]:
    def probe() -> dict[str, object]:
        warnings = apply(plan([str(w)])) if restrict else None
        return {
            "warnings": warnings,
            "nnp": no_new_privs(),
            "results": {k: attempt(a) for k, a in fs_actions(w, o).items()},
        }

    out = in_child(probe)
    assert isinstance(out, dict)
    assert out["nnp"] == int(restrict)  # setuid binaries cannot regain privileges inside the sandbox
    if restrict:
        assert all("/dev/" in x for x in out["warnings"]), out["warnings"]  # only absent devices may be skipped
    results: dict[str, str] = out["results"]
    return results


def assert_outside_untouched(o: Path) -> None:
    assert sorted(p.name for p in o.iterdir()) == sorted(
        ["target.txt", "via-link.txt", "linksrc.txt", "mv-in.txt", "victim.txt", "single.txt"]
    )
    assert all(p.read_text() == "outside" for p in o.iterdir())


# ------------------------------------------------------------------------------------------ kernel tests


def test_kernel_reports_landlock() -> None:
    abi = abi_version()
    assert abi >= 1, "Landlock is unavailable on this kernel; sandgate cannot restrict writes"


def test_filesystem_writes_confined_to_write_root(scratch: Callable[[], tuple[Path, Path]]) -> None:
    cw, co = scratch()
    control = run_fs_probe(cw, co, restrict=False)
    assert control == {k: "ok" for k in fs_actions(cw, co)}, "every action must be possible without Landlock"

    w, o = scratch()
    restricted = run_fs_probe(w, o, restrict=True)
    for name, result in restricted.items():
        if name in BLOCKED:
            assert result in BLOCKED[name], f"{name}: {result}"
        else:
            assert result == "ok", f"{name}: {result}"
    assert_outside_untouched(o)
    assert (w / "new.txt").read_text() == "sandboxed" and (w / "sub" / "a.txt").exists()


@pytest.mark.parametrize("abi", ABIS)
def test_each_abi_on_real_kernel(abi: int, kernel_abi: int, scratch: Callable[[], tuple[Path, Path]]) -> None:
    """Older ABIs use smaller attr structs and fewer rights: the kernel must accept each and enforce exactly it."""
    parent = os.getpid()

    def probe(w: Path, o: Path, restrict: bool) -> Callable[[], dict[str, str]]:
        def run() -> dict[str, str]:
            if restrict:
                apply(plan([str(w)], abi=abi))
            return {
                "create_in_W": attempt(lambda: write(w / "new.txt")),
                "dev_null": attempt(lambda: write("/dev/null")),
                "create_outside": attempt(lambda: write(o / "new.txt")),
                "truncate_outside": attempt(lambda: os.truncate(o / "target.txt", 0)),
                "signal_parent": attempt(lambda: os.kill(parent, 0)),
            }

        return run

    cw, co = scratch()
    assert in_child(probe(cw, co, False)) == dict.fromkeys(
        ["create_in_W", "dev_null", "create_outside", "truncate_outside", "signal_parent"], "ok"
    )
    w, o = scratch()
    assert in_child(probe(w, o, True)) == {
        "create_in_W": "ok",
        "dev_null": "ok",
        "create_outside": "EACCES",
        "truncate_outside": "EACCES" if abi >= 3 else "ok",  # TRUNCATE exists from ABI 3 on
        "signal_parent": "EPERM" if abi >= 6 else "ok",  # scoping exists from ABI 6 on
    }


RNDGETENTCNT = 0x80045200  # _IOR('R', 0x00, int): a device ioctl any user may issue on /dev/(u)random


def test_device_ioctls_only_on_granted_devices(scratch: Callable[[], tuple[Path, Path]]) -> None:
    """IOCTL_DEV is handled, so it must be granted on /dev/ptmx, /dev/pts, ... (or terminals break) and nowhere else."""
    urandom_rdev = os.stat("/dev/urandom").st_rdev

    def probe(o: Path, restrict: bool) -> Callable[[], dict[str, str]]:
        def run() -> dict[str, str]:
            if restrict:
                apply(plan([]))

            def new_pty() -> None:
                m, s = os.openpty()  # /dev/ptmx + grantpt/unlockpt/ptsname ioctls + open /dev/pts/N
                termios.tcgetattr(s)  # TCGETS: what every interactive program does first
                fcntl.ioctl(m, termios.TIOCGWINSZ, b"\0" * 8)
                os.close(m)
                os.close(s)

            def entropy_count(path: Path | str) -> None:
                # Opening read-only is not a handled right: only IOCTL_DEV decides whether the ioctl runs.
                fd = os.open(path, os.O_RDONLY)
                try:
                    fcntl.ioctl(fd, RNDGETENTCNT, b"\0" * 4)
                finally:
                    os.close(fd)

            return {
                "new_pty": attempt(new_pty),
                "ioctl_dev_urandom": attempt(lambda: entropy_count("/dev/urandom")),
                "ioctl_outside_device_node": attempt(lambda: entropy_count(o / "urandom-copy")),
            }

        return run

    _, co = scratch()
    os.mknod(co / "urandom-copy", 0o600 | stat.S_IFCHR, urandom_rdev)
    assert in_child(probe(co, False)) == {"new_pty": "ok", "ioctl_dev_urandom": "ok", "ioctl_outside_device_node": "ok"}
    _, o = scratch()
    os.mknod(o / "urandom-copy", 0o600 | stat.S_IFCHR, urandom_rdev)
    assert in_child(probe(o, True)) == {
        "new_pty": "ok",
        "ioctl_dev_urandom": "ok",
        "ioctl_outside_device_node": "EACCES",
    }


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
CLONE_NEWNS, MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 1, 32, 4096, 16384, 1 << 18


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_mount_denied_even_as_root(scratch: Callable[[], tuple[Path, Path]]) -> None:
    assert os.geteuid() == 0, "this test needs root so the control child can mount"

    def probe(w: Path, restrict: bool) -> Callable[[], dict[str, str]]:
        def run() -> dict[str, str]:
            if _libc.unshare(CLONE_NEWNS) != 0:  # never attempt a mount in the host's namespace
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
            _mount(None, "/", MS_REC | MS_PRIVATE)  # and nothing propagates back to it
            if restrict:
                apply(plan([str(w)]))
            return {
                "bind_W": attempt(lambda: _mount(str(w), str(w), MS_BIND)),
                "remount_W_ro": attempt(lambda: _mount(None, str(w), MS_REMOUNT | MS_BIND | MS_RDONLY)),
            }

        return run

    cw, _ = scratch()
    assert in_child(probe(cw, False)) == {"bind_W": "ok", "remount_W_ro": "ok"}
    w, _ = scratch()
    assert in_child(probe(w, True)) == {"bind_W": "EPERM", "remount_W_ro": "EPERM"}


EXEC_WRITE = (
    "import errno,sys\ntry: open(sys.argv[1],'w')\n"
    "except OSError as e: print(errno.errorcode[e.errno])\nelse: print('ok')"
)


def test_descendants_inherit_restriction(scratch: Callable[[], tuple[Path, Path]]) -> None:
    def probe(w: Path, o: Path, restrict: bool) -> Callable[[], dict[str, object]]:
        def run() -> dict[str, object]:
            if restrict:
                apply(plan([str(w)]))

            def grandchild() -> dict[str, str]:
                return {
                    "create_in_W": attempt(lambda: write(w / "gc.txt")),
                    "create_outside": attempt(lambda: write(o / "gc.txt")),
                    "append_outside": attempt(lambda: write(o / "target.txt", "a")),
                    "dev_null": attempt(lambda: write("/dev/null")),
                }

            executed = subprocess.run(
                [sys.executable, "-I", "-S", "-c", EXEC_WRITE, str(o / "exec.txt")],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return {"forked": in_child(grandchild), "exec_create_outside": executed.stdout.strip()}

        return run

    cw, co = scratch()
    assert in_child(probe(cw, co, False)) == {
        "forked": {"create_in_W": "ok", "create_outside": "ok", "append_outside": "ok", "dev_null": "ok"},
        "exec_create_outside": "ok",
    }
    w, o = scratch()
    assert in_child(probe(w, o, True)) == {
        "forked": {"create_in_W": "ok", "create_outside": "EACCES", "append_outside": "EACCES", "dev_null": "ok"},
        "exec_create_outside": "EACCES",
    }
    assert_outside_untouched(o)


def test_scope_ipc_blocks_signals_and_abstract_sockets_to_outside(
    kernel_abi: int, scratch: Callable[[], tuple[Path, Path]]
) -> None:
    if kernel_abi < 6:
        pytest.fail(f"kernel Landlock ABI {kernel_abi} < 6: IPC scoping cannot be enforced")
    parent = os.getpid()
    name = f"\0sandgate-test-{parent}"

    def probe(w: Path, abi: int | None) -> Callable[[], dict[str, object]]:
        def run() -> dict[str, object]:
            if abi is not None:
                apply(plan([str(w)], abi=abi))
            out: dict[str, object] = {"signal_parent": attempt(lambda: os.kill(parent, 0))}

            def connect(addr: str) -> None:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(addr)

            out["connect_parent_abstract"] = attempt(lambda: connect(name))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as own:  # created inside the same domain
                own.bind(f"{name}-inner-{os.getpid()}")
                own.listen(1)
                out["connect_own_abstract"] = attempt(lambda: connect(f"{name}-inner-{os.getpid()}"))
            r, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(wfd)
                os.read(r, 1)  # blocks until killed
                os._exit(0)
            os.close(r)
            out["signal0_own_child"] = attempt(lambda: os.kill(pid, 0))
            out["sigkill_own_child"] = attempt(lambda: os.kill(pid, signal.SIGKILL))
            _, status = os.waitpid(pid, 0)
            os.close(wfd)
            out["own_child_died_of_sigkill"] = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            return out

        return run

    allowed = {
        "signal_parent": "ok",
        "connect_parent_abstract": "ok",
        "connect_own_abstract": "ok",
        "signal0_own_child": "ok",
        "sigkill_own_child": "ok",
        "own_child_died_of_sigkill": True,
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(name)
        srv.listen(16)
        w, _ = scratch()
        assert in_child(probe(w, None)) == allowed  # control: no Landlock at all
        assert in_child(probe(w, 5)) == allowed  # Landlock without scoping: the scope is what blocks below
        assert in_child(probe(w, kernel_abi)) == {
            **allowed,
            "signal_parent": "EPERM",
            "connect_parent_abstract": "EPERM",
        }


def test_single_file_write_root_and_missing_paths(scratch: Callable[[], tuple[Path, Path]]) -> None:
    """A file as write root gets only file-valid rights (else EINVAL); missing paths warn and grant nothing."""

    def probe(o: Path, restrict: bool) -> Callable[[], dict[str, object]]:
        def run() -> dict[str, object]:
            warnings = (
                apply(plan([str(o / "single.txt"), str(o / "missing")], ["/dev/null", str(o / "gone")]))
                if restrict
                else []
            )
            return {
                "warnings": warnings,
                "append_single": attempt(lambda: write(o / "single.txt", "a")),
                "truncate_single": attempt(lambda: os.truncate(o / "single.txt", 0)),
                "create_next_to_single": attempt(lambda: write(o / "new.txt")),
                "create_missing_root": attempt(lambda: os.mkdir(o / "missing")),
            }

        return run

    _, co = scratch()
    assert in_child(probe(co, False)) == {
        "warnings": [],
        "append_single": "ok",
        "truncate_single": "ok",
        "create_next_to_single": "ok",
        "create_missing_root": "ok",
    }
    _, o = scratch()
    out = in_child(probe(o, True))
    assert isinstance(out, dict)
    assert out.pop("warnings") == [
        f"landlock: write root {str(o / 'missing')!r} does not exist; no write access granted there",
        f"landlock: write file {str(o / 'gone')!r} does not exist; no write access granted there",
    ]
    assert out == {
        "append_single": "ok",
        "truncate_single": "ok",
        "create_next_to_single": "EACCES",
        "create_missing_root": "EACCES",
    }


def test_apply_fails_closed(kernel_abi: int) -> None:
    """Each refusal happens before any side effect, with a one-line message."""

    def probe() -> dict[str, object]:
        out: dict[str, object] = {}
        for label, p in {
            "abi0": Plan(abi=0, write_roots=("/tmp",), write_files=(), scope_ipc=False),
            "newer_than_kernel": Plan(abi=kernel_abi + 1, write_roots=("/tmp",), write_files=(), scope_ipc=True),
            "scope_without_abi6": Plan(abi=5, write_roots=("/tmp",), write_files=(), scope_ipc=True),
            "relative_root": Plan(abi=kernel_abi, write_roots=("tmp",), write_files=(), scope_ipc=False),
        }.items():
            try:
                apply(p)
                out[label] = "applied"
            except LandlockError as e:
                out[label] = [e.errno, "\n" not in str(e), no_new_privs()]
        return out

    assert in_child(probe) == {
        "abi0": [errno.EOPNOTSUPP, True, 0],
        "newer_than_kernel": [errno.EOPNOTSUPP, True, 0],
        "scope_without_abi6": [errno.EINVAL, True, 0],
        "relative_root": [errno.EINVAL, True, 0],
    }


def test_no_device_nodes_in_write_roots(scratch: Callable[[], tuple[Path, Path]]) -> None:
    """v1 review: root mknod'ed the root disk in the workspace. MAKE_BLOCK/MAKE_CHAR are handled but never granted."""
    assert os.geteuid() == 0, "this test needs root so the control child can mknod"
    disk = os.stat("/").st_dev  # the block device backing / (its major:minor)
    null = os.stat("/dev/null").st_rdev

    def probe(w: Path, o: Path, restrict: bool) -> Callable[[], dict[str, str]]:
        def run() -> dict[str, str]:
            if restrict:
                apply(plan([str(w)]))

            def bind_socket() -> None:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.bind(str(w / "sock"))

            return {
                "mknod_block_in_W": attempt(lambda: os.mknod(w / "disk", 0o600 | stat.S_IFBLK, disk)),
                "mknod_char_in_W": attempt(lambda: os.mknod(w / "null", 0o666 | stat.S_IFCHR, null)),
                "mknod_block_outside": attempt(lambda: os.mknod(o / "disk", 0o600 | stat.S_IFBLK, disk)),
                "mkfifo_in_W": attempt(lambda: os.mkfifo(w / "fifo")),
                "mknod_fifo_in_W": attempt(lambda: os.mknod(w / "fifo2", 0o600 | stat.S_IFIFO)),
                "socket_in_W": attempt(bind_socket),
                "symlink_in_W": attempt(lambda: os.symlink("fifo", w / "link")),
            }

        return run

    cw, co = scratch()
    try:
        assert in_child(probe(cw, co, False)) == dict.fromkeys(
            [
                "mknod_block_in_W",
                "mknod_char_in_W",
                "mknod_block_outside",
                "mkfifo_in_W",
                "mknod_fifo_in_W",
                "socket_in_W",
                "symlink_in_W",
            ],
            "ok",
        )  # control: root can make every one of them here
        assert stat.S_ISBLK((cw / "disk").lstat().st_mode) and (cw / "disk").lstat().st_rdev == disk
    finally:
        for node in (cw / "disk", cw / "null", co / "disk"):  # never leave a raw-disk node behind
            node.unlink(missing_ok=True)
    w, o = scratch()
    try:
        assert in_child(probe(w, o, True)) == {
            "mknod_block_in_W": "EACCES",
            "mknod_char_in_W": "EACCES",
            "mknod_block_outside": "EACCES",
            "mkfifo_in_W": "ok",
            "mknod_fifo_in_W": "ok",
            "socket_in_W": "ok",
            "symlink_in_W": "ok",
        }
    finally:
        for node in (w / "disk", w / "null", o / "disk"):
            node.unlink(missing_ok=True)
    assert stat.S_ISFIFO((w / "fifo").lstat().st_mode) and stat.S_ISSOCK((w / "sock").lstat().st_mode)
