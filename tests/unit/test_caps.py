"""fsguard.caps: the capability sets a sandboxed command keeps, proven by real effects in forked children.

Dropping capabilities is irreversible, so every kernel test FORKS and pytest itself keeps its sets (an
autouse fixture checks). Each dropped capability is shown to matter: the same action succeeds in a
control child that did not drop it, and fails with EPERM in one that did.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import re
import socket
import stat
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fsguard import caps, seccomp
from fsguard.caps import CapsError

from ..support.kernelprobe import attempt, exec_in_child, in_child

# Written out independently of the module, so a wrong constant there cannot hide here.
KEEP_NAMES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
]
KEEP_MASK = 0x405FB  # bits 0,1,3,4,5,6,7,8,10,18
SYS_ADMIN, NET_ADMIN, NET_RAW, MKNOD, DAC_READ_SEARCH = 21, 12, 13, 27, 2
MACHINE = platform.machine()
# (name_to_handle_at, open_by_handle_at, keyctl) per arch, from the uapi unistd tables.
NRS = {"x86_64": (303, 304, 250), "aarch64": (264, 265, 219)}
KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
PR_SET_KEEPCAPS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 47, 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


# ---------------------------------------------------------------------------------------------- pure


def test_keep_is_what_a_build_needs_and_nothing_else() -> None:
    assert caps.names(caps.mask(caps.KEEP)) == KEEP_NAMES
    assert caps.mask(caps.KEEP) == KEEP_MASK
    for dropped in (
        "CAP_NET_ADMIN",
        "CAP_SYS_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_DAC_READ_SEARCH",
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_SYS_MODULE",
        "CAP_SYS_BOOT",
        "CAP_SYS_TIME",
        "CAP_AUDIT_WRITE",
        "CAP_SETFCAP",
    ):
        cap = next(n for n, name in caps.NAMES.items() if name == dropped)
        assert cap not in caps.KEEP, dropped
        assert len(caps.WHY_DROPPED[cap]) > 10, f"{dropped}: no threat named"
    assert not set(caps.WHY_DROPPED) & caps.KEEP


def test_constants_match_the_kernel_header() -> None:
    header = "/usr/include/linux/capability.h"
    if not os.path.exists(header):
        pytest.skip(f"{header} not installed (apt-get install linux-libc-dev)")
    with open(header) as f:
        table = {m[1]: int(m[2]) for m in re.finditer(r"^#define (CAP_\w+)\s+(\d+)\s*$", f.read(), re.MULTILINE)}
    table = {k: v for k, v in table.items() if k not in ("CAP_LAST_CAP",)}
    assert {v: k for k, v in table.items()} == caps.NAMES
    assert (SYS_ADMIN, NET_ADMIN, NET_RAW, MKNOD, DAC_READ_SEARCH) == (
        caps.CAP_SYS_ADMIN,
        caps.CAP_NET_ADMIN,
        caps.CAP_NET_RAW,
        caps.CAP_MKNOD,
        caps.CAP_DAC_READ_SEARCH,
    )


def test_names_mask_and_status_parsing() -> None:
    assert caps.names(0) == []
    assert caps.names((1 << 21) | 1 | (1 << 50)) == ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_50"]
    assert caps.mask([0, 21]) == (1 << 21) | 1
    for bad in (-1, 64, True, "1"):
        with pytest.raises(ValueError):
            caps.mask([bad])  # type: ignore[list-item]
    text = (
        "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t00000000000405fb\nCapEff:\t00000000000405fb\n"
        "CapBnd:\t000001fffeffffff\nCapAmb:\t0000000000002000\nNoNewPrivs:\t0\n"
    )
    assert caps.parse_status(text) == {
        "CapInh": 0,
        "CapPrm": KEEP_MASK,
        "CapEff": KEEP_MASK,
        "CapBnd": 0x1FFFEFFFFFF,
        "CapAmb": 1 << 13,
    }
    with pytest.raises(ValueError, match="CapAmb"):
        caps.parse_status(text.replace("CapAmb", "Other"))
    assert caps.last_cap() >= 40  # CAP_CHECKPOINT_RESTORE exists on every kernel we support
    with pytest.raises(ValueError):
        caps.drop_bounding(frozenset({99}))  # validated before anything irreversible (in pytest: dropped nothing)


def test_ctypes_layout_matches_the_kernel_abi() -> None:
    assert ctypes.sizeof(caps._CapHeader) == 8 and ctypes.sizeof(caps._CapData) == 12
    assert ctypes.sizeof(caps._CapDataV3) == 24  # two u32 words per set: 64 capabilities


# ------------------------------------------------------------------------------------- fork harness


@pytest.fixture(autouse=True)
def _pytest_process_keeps_its_capabilities() -> Iterator[None]:
    """A drop in the pytest process itself could never be undone: fail loudly if one happened."""
    before = caps.current()
    yield
    assert caps.current() == before, "a capability call ran in the pytest process, not in a forked child"


def exec_status(prepare: Callable[[], None]) -> dict[str, int]:
    """Fork, run prepare(), exec `cat /proc/self/status`: the sets the exec'd program really gets."""

    def argv() -> list[str]:
        prepare()
        return ["/bin/cat", "/proc/self/status"]

    text = exec_in_child(argv)[1].decode(errors="replace")
    try:
        return caps.parse_status(text)
    except ValueError:
        pytest.fail(f"exec'd child did not report its status:\n{text}", pytrace=False)


def sandbox_caps() -> None:
    """What the launcher does for a root-inside command (steps 2, 3, 5 of the module docstring)."""
    caps.clear_ambient()
    caps.drop_bounding()
    caps.limit_current()


def _syscall(nr: int, *args: object) -> int:
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(ret)


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the capability tests need root: their controls show each capability at work", pytrace=False)


# -------------------------------------------------------------------------------------- kernel: sets


def test_drop_and_limit_leave_exactly_keep() -> None:
    def body() -> dict[str, dict[str, int]]:
        before = caps.current()
        sandbox_caps()
        return {"before": before, "after": caps.current()}

    out = in_child(body)
    # Control: the child started with far more than KEEP (the test could see a drop that did nothing).
    assert out["before"]["CapBnd"] & ~KEEP_MASK and out["before"]["CapEff"] & (1 << SYS_ADMIN)
    assert out["after"] == {"CapInh": 0, "CapPrm": KEEP_MASK, "CapEff": KEEP_MASK, "CapBnd": KEEP_MASK, "CapAmb": 0}


def test_drop_bounding_is_idempotent_and_fails_closed_without_setpcap() -> None:
    def body() -> dict[str, Any]:
        caps.drop_bounding()
        caps.drop_bounding()  # nothing left to drop: no CAP_SETPCAP needed, no error
        twice = caps.current()["CapBnd"]
        pid = os.fork()
        if pid == 0:  # an ordinary uid holds no CAP_SETPCAP: dropping more must raise, not pass silently
            try:
                os.setuid(65534)
                caps.drop_bounding(frozenset())
                os._exit(0)
            except CapsError as e:
                os._exit(10 + (e.errno == errno.EPERM))
            finally:
                os._exit(2)
        return {"twice": twice, "exit": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}

    assert in_child(body) == {"twice": KEEP_MASK, "exit": 11}


def test_exec_as_root_stays_within_the_bounding_set() -> None:
    """uid 0 regains its whole bounding set at exec: limit_current alone is undone, drop_bounding is not."""
    control = exec_status(caps.limit_current)
    dropped = exec_status(sandbox_caps)

    def ordinary_uid() -> None:
        sandbox_caps()
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    nobody = exec_status(ordinary_uid)
    assert control["CapEff"] & ~KEEP_MASK and control["CapEff"] & (1 << SYS_ADMIN)  # control: all back
    assert dropped == {"CapInh": 0, "CapPrm": KEEP_MASK, "CapEff": KEEP_MASK, "CapBnd": KEEP_MASK, "CapAmb": 0}
    assert nobody == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": KEEP_MASK, "CapAmb": 0}


class _Hdr(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _raise_ambient_net_raw() -> None:
    """As uid 65534 (keeping caps), put CAP_NET_RAW into the ambient set: what a caller could hand us."""
    if _libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_KEEPCAPS")
    os.setuid(65534)  # permitted kept, effective and ambient cleared
    hdr, data = _Hdr(0x20080522, 0), (_Data * 2)()
    if _libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective |= 1 << NET_RAW
    data[0].inheritable |= 1 << NET_RAW  # ambient needs it permitted and inheritable
    if _libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, NET_RAW, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_CAP_AMBIENT_RAISE")


def test_clear_ambient_stops_capabilities_passing_exec() -> None:
    def cleared() -> None:
        _raise_ambient_net_raw()
        caps.clear_ambient()

    control = exec_status(_raise_ambient_net_raw)
    after = exec_status(cleared)
    assert control["CapAmb"] == control["CapEff"] == 1 << NET_RAW  # control: a non-root program got NET_RAW
    assert after["CapAmb"] == after["CapEff"] == after["CapPrm"] == 0


# ------------------------------------------------------------------ kernel: each dropped cap matters


def _in_both(body: Callable[[], dict[str, Any]], setup: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """body() after setup() with full capabilities (control), then after setup() and sandbox_caps()."""

    def run(drop: bool) -> Callable[[], dict[str, Any]]:
        def child() -> dict[str, Any]:
            setup()  # e.g. unshare, which itself needs CAP_SYS_ADMIN: done before the drop
            if drop:
                sandbox_caps()
            return body()

        return child

    return [in_child(run(False)), in_child(run(True))]


def test_sys_admin_dropped_sethostname_refused() -> None:
    host = socket.gethostname()
    control, dropped = _in_both(
        lambda: {"sethostname": attempt(lambda: socket.sethostname("sandgate-caps-test"))},
        setup=lambda: os.unshare(os.CLONE_NEWUTS),
    )  # never the host's UTS name
    assert control == {"sethostname": "ok"} and dropped == {"sethostname": "EPERM"}
    assert socket.gethostname() == host


def _lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP


def _bind_80() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 80))


def test_net_admin_and_net_raw_dropped_inside_own_netns() -> None:
    def body() -> dict[str, str]:
        return {
            "link_up": attempt(_lo_up),
            "raw_socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()),
            "bind_port_80": attempt(_bind_80),
        }  # CAP_NET_BIND_SERVICE is kept

    control, dropped = _in_both(body, setup=lambda: os.unshare(os.CLONE_NEWNET))  # a throwaway netns
    assert control == {"link_up": "ok", "raw_socket": "ok", "bind_port_80": "ok"}
    assert dropped == {"link_up": "EPERM", "raw_socket": "EPERM", "bind_port_80": "ok"}


def test_mknod_dropped(tmp_path: Path) -> None:
    null = os.stat("/dev/null").st_rdev

    def body() -> dict[str, str]:
        node = tmp_path / f"null-{os.getpid()}"
        out = {"mknod_char": attempt(lambda: os.mknod(node, 0o600 | stat.S_IFCHR, null))}
        node.unlink(missing_ok=True)
        return out

    assert _in_both(body) == [{"mknod_char": "ok"}, {"mknod_char": "EPERM"}]


@pytest.mark.skipif(MACHINE not in NRS, reason="syscall numbers for x86_64 and aarch64 only")
def test_dac_read_search_dropped_open_by_handle_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("hidden")
    name_nr, open_nr, _ = NRS[MACHINE]

    def body() -> dict[str, str]:
        handle = ctypes.create_string_buffer(struct.pack("<Ii", 128, 0), 8 + 128)
        mount_id = ctypes.c_int()
        out = {
            "name_to_handle_at": attempt(
                lambda: _syscall(name_nr, -100, ctypes.c_char_p(bytes(secret)), handle, ctypes.byref(mount_id), 0)
            )
        }
        mount_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        out["open_by_handle_at"] = attempt(lambda: os.close(_syscall(open_nr, mount_fd, handle, os.O_RDONLY)))
        os.close(mount_fd)
        return out

    assert _in_both(body) == [
        {"name_to_handle_at": "ok", "open_by_handle_at": "ok"},
        {"name_to_handle_at": "ok", "open_by_handle_at": "EPERM"},
    ]


def test_kept_capabilities_still_work(tmp_path: Path) -> None:
    """What apt/dpkg/pip need keeps working after the drop."""
    victim = tmp_path / "owned"
    victim.write_text("x")
    victim.chmod(0o000)

    def body() -> dict[str, str]:
        sandbox_caps()

        def setuid_in_grandchild() -> None:
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    os._exit(0)
                finally:
                    os._exit(1)
            if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
                raise OSError(errno.EPERM, "setuid")

        return {
            "read_mode_000": attempt(lambda: victim.read_text()),  # CAP_DAC_OVERRIDE
            "chown": attempt(lambda: os.chown(victim, 12345, 12345)),  # CAP_CHOWN
            "chmod_not_owner": attempt(lambda: victim.chmod(0o640)),  # CAP_FOWNER (owner is 12345 now)
            "chroot": attempt(lambda: os.chroot("/")),  # CAP_SYS_CHROOT
            "setuid": attempt(setuid_in_grandchild),  # CAP_SETUID/SETGID
        }

    assert in_child(body) == dict.fromkeys(["read_mode_000", "chown", "chmod_not_owner", "chroot", "setuid"], "ok")
    assert (victim.stat().st_uid, victim.stat().st_gid) == (12345, 12345)


# ---------------------------------------------------------------------------------- session keyring


def _session_keyring_id() -> int:
    return _syscall(NRS[MACHINE][2], KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)


@pytest.mark.skipif(MACHINE not in NRS, reason="syscall numbers for x86_64 and aarch64 only")
def test_join_session_keyring_gives_a_fresh_one_before_seccomp() -> None:
    parent = _session_keyring_id()

    def joined() -> dict[str, Any]:
        caps.join_session_keyring()
        own = _session_keyring_id()
        seccomp.install()  # after the join, keyctl is refused altogether
        out: dict[str, Any] = {"own": own, "keyctl_after_install": attempt(_session_keyring_id)}
        try:
            caps.join_session_keyring()
            out["join_after_install"] = "ok"
        except CapsError as e:
            out["join_after_install"] = errno.errorcode[e.errno or 0]
        return out

    control = in_child(_session_keyring_id)  # control: a child shares the parent's session keyring
    out = in_child(joined)
    assert control == parent
    assert out["own"] != parent and out["own"] > 0
    assert out["keyctl_after_install"] == "EPERM" and out["join_after_install"] == "EPERM"
    assert _session_keyring_id() == parent  # the parent's is untouched


def _own_user_namespace() -> None:
    """As in v2: a fresh user namespace (root inside mapped to root), owning a fresh UTS namespace."""
    os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWUTS)
    Path("/proc/self/uid_map").write_text("0 0 1\n")
    Path("/proc/self/setgroups").write_text("deny\n")
    Path("/proc/self/gid_map").write_text("0 0 1\n")


def test_same_limits_inside_a_user_namespace() -> None:
    def body() -> dict[str, Any]:
        return {
            "sets": caps.current(),
            "sethostname": attempt(lambda: socket.sethostname("sandgate-userns")),
            "join_keyring": attempt(caps.join_session_keyring),
        }

    control, dropped = _in_both(body, setup=_own_user_namespace)
    # Control: a new user namespace hands its first process every capability (over what it owns).
    assert control["sets"]["CapEff"] & (1 << SYS_ADMIN) and control["sethostname"] == "ok"
    assert dropped["sets"] == {"CapInh": 0, "CapPrm": KEEP_MASK, "CapEff": KEEP_MASK, "CapBnd": KEEP_MASK, "CapAmb": 0}
    assert dropped["sethostname"] == "EPERM"
    assert control["join_keyring"] == dropped["join_keyring"] == "ok"


def _inherit_sys_admin() -> None:
    """Put CAP_SYS_ADMIN into the inheritable set: the bounding set does not mask it at exec."""
    hdr, data = _Hdr(0x20080522, 0), (_Data * 2)()
    if _libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].inheritable |= 1 << SYS_ADMIN
    if _libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def test_limit_current_closes_the_inheritable_path_past_the_bounding_set() -> None:
    """For uid 0, exec grants inheritable | bounding: a stale inheritable bit survives drop_bounding alone."""

    def bounding_only() -> None:
        _inherit_sys_admin()
        caps.clear_ambient()
        caps.drop_bounding()

    def with_limit() -> None:
        bounding_only()
        caps.limit_current()

    control = exec_status(bounding_only)
    limited = exec_status(with_limit)
    assert control["CapBnd"] == KEEP_MASK and control["CapEff"] == KEEP_MASK | (1 << SYS_ADMIN)  # the hole
    assert limited["CapEff"] == limited["CapPrm"] == KEEP_MASK and limited["CapInh"] == 0
