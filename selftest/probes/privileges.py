"""The privilege probes of issue 24: setuid/setgid bits and file capabilities left for the host's
other accounts, and nested user namespaces.

A file the command leaves in the workspace outlives the sandbox: started by root, the command is
host root, and a setuid copy of a program was root for every local account that ran it. Each probe
runs its control first (a plain chmod 755, a user.* xattr on the same file), so a refusal is the
sandbox's doing and not a filesystem that cannot hold the bit. The files are shell scripts: the
kernel honours neither setuid nor file capabilities on a script, so even a failing row leaves
nothing anyone could use. verify also reads the workspace back from outside (planted.py).

Stdlib only, like every module the runner imports inside the sandbox.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from pathlib import Path

from selftest.probes.core import Ctx, Result, Unsupported, attempt, combine, describe, probe
from selftest.probes.syscalls import LIBC, in_child

SETID = stat.S_ISUID | stat.S_ISGID
#: A v2 security.capability (cap_net_raw, effective) and a v3 one with rootid 0: what setcap writes.
CAP_V2 = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)
CAP_V3 = struct.pack("<6I", 0x03000001, 1 << 13, 0, 0, 0, 0)
CAPS_XATTR = "security.capability"
CLONE3 = 435  # the same number on x86_64 and aarch64 (the unified table)
CLONE_ARGS = 88  # sizeof(struct clone_args), CLONE_ARGS_SIZE_VER2
USERNS_LIMIT = "/proc/sys/user/max_user_namespaces"
#: errno values a refused user namespace comes back with: seccomp's EPERM, the limit's ENOSPC,
#: clone3 refused outright (ENOSYS).
USERNS_REFUSALS = (errno.EPERM, errno.ENOSPC, errno.ENOSYS)


def planted_name(mark: str) -> str:
    """The prefix of every file these probes leave: planted.py finds them by it, and by the context."""
    return f"sandgate-setid-{mark}"


def _fresh(c: Ctx, suffix: str) -> Path:
    """A new script in the results directory, mode 0700, named for the context."""
    path = Path(c.spec.results_dir) / f"{planted_name(c.mark)}-{suffix}"
    path.unlink(missing_ok=True)
    path.write_text("#!/bin/false\n")
    path.chmod(0o700)
    return path


def _bits(path: Path) -> str:
    mode = os.stat(path).st_mode
    return f"{mode & 0o7777:04o}"


def _left(label: str, path: Path, how: Result) -> tuple[str, Result]:
    """One attempt, judged by the mode it left: a setid bit on the file is a bypass whatever was said."""
    if not path.exists():
        return label, ("blocked", f"{how[1]}; no file")
    if os.stat(path).st_mode & SETID:
        return label, ("permitted", f"mode {_bits(path)} ({how[1]})")
    return label, ("blocked" if how[0] != "unsupported" else "unsupported", f"{how[1]}; mode {_bits(path)}")


def _chmod(path: Path, mode: int) -> Result:
    os.chmod(path, mode)
    return "permitted", f"chmod {mode:o} done"


def _fchmod(path: Path, mode: int) -> Result:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return "permitted", f"fchmod {mode:o} done"


def _create(path: Path, mode: int) -> Result:
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, mode))
    return "permitted", f"open(O_CREAT, {mode:o}) done"


def _mknod(path: Path, mode: int) -> Result:
    path.unlink(missing_ok=True)
    os.mknod(path, stat.S_IFREG | mode)
    return "permitted", f"mknod(S_IFREG|{mode:o}) done"


@probe("process", "setuid_plant", "blocked")
def setuid_plant(c: Ctx) -> Result:
    """A setuid/setgid file left in the workspace (a root-started command's is root for every local account)."""
    control = _fresh(c, "control")
    observed, detail = attempt(_chmod, control, 0o755)
    if observed != "permitted" or _bits(control) != "0755":
        raise Unsupported(f"the control chmod 755 did not work here ({detail}): cannot tell")
    parts = []
    for label, fn, mode in (
        ("chmod 4755", _chmod, 0o4755),
        ("chmod 2755", _chmod, 0o2755),
        ("fchmod 6755", _fchmod, 0o6755),
        ("open O_CREAT 4755", _create, 0o4755),
        ("mknod 4755", _mknod, 0o4755),
    ):
        path = _fresh(c, label.split()[0].lower() + label.split()[-1])
        parts.append(_left(label, path, attempt(fn, path, mode)))
    observed, detail = combine(parts, need="any")
    return observed, f"control chmod 755: done; {detail}"


def _setcap(path: Path, value: bytes) -> Result:
    os.setxattr(path, CAPS_XATTR, value)
    return "permitted", f"setxattr {CAPS_XATTR} ({len(value)} bytes) done"


def _caps_left(label: str, path: Path, how: Result) -> tuple[str, Result]:
    try:
        left = os.getxattr(path, CAPS_XATTR)
    except OSError as e:
        return label, ("blocked" if how[0] != "unsupported" else "unsupported", f"{how[1]}; none left ({describe(e)})")
    return label, ("permitted", f"{CAPS_XATTR} = {left.hex()} ({how[1]})")


@probe("process", "file_caps", "blocked")
def file_caps(c: Ctx) -> Result:
    """File capabilities (setcap) on a workspace file: privileges for whoever runs it outside."""
    path = _fresh(c, "caps")
    try:
        os.setxattr(path, "user.sandgate-verify", b"control")
    except OSError as e:
        raise Unsupported(f"the control user.* xattr could not be set here ({describe(e)}): cannot tell") from None
    parts = [
        _caps_left("v2", path, attempt(_setcap, path, CAP_V2)),
        _caps_left("v3 rootid 0", path, attempt(_setcap, path, CAP_V3)),
    ]
    observed, detail = combine(parts, need="any")
    return observed, f"control user.* xattr: set; {detail}"


def _unshare() -> Result:
    try:
        os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
    except OSError as e:
        if e.errno in USERNS_REFUSALS:
            return "blocked", describe(e)
        raise
    eff = next((ln.split()[1] for ln in Path("/proc/self/status").read_text().splitlines() if ln[:7] == "CapEff:"), "?")
    return "permitted", f"a new user+network namespace, CapEff {eff}"


def _clone3() -> Result:
    """clone3(CLONE_NEWUSER): its flags are in a struct, out of seccomp's sight."""
    cargs = ctypes.create_string_buffer(struct.pack("<11Q", 0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0), CLONE_ARGS)
    ctypes.set_errno(0)
    pid = int(LIBC.syscall(ctypes.c_long(CLONE3), cargs, ctypes.c_long(CLONE_ARGS)))
    if pid == 0:  # the new process, in its own user namespace: leave at once
        os._exit(0)
    if pid < 0:
        err = ctypes.get_errno()
        if err in USERNS_REFUSALS:
            return "blocked", f"{errno.errorcode.get(err, err)}: {os.strerror(err)}"
        raise OSError(err, os.strerror(err))
    os.waitpid(pid, 0)
    return "permitted", f"a process in a new user namespace (pid {pid})"


@probe("process", "nested_userns", "blocked")
def nested_userns(c: Ctx) -> Result:
    """A nested user namespace: CAP_NET_ADMIN over a network namespace of its own, and nf_tables."""
    try:
        limit = Path(USERNS_LIMIT).read_text().strip()
    except OSError as e:
        limit = describe(e)
    observed, detail = combine(
        [("unshare", in_child(_unshare)), ("clone3", in_child(_clone3))],
        need="any",
    )
    return observed, f"{detail}; {USERNS_LIMIT} here: {limit}"


def left_behind(path: str, mode: int) -> dict[str, str]:
    """Outside, after a pass (planted.py): {probe: what the host shows} for one workspace entry."""
    found = {}
    if stat.S_ISREG(mode) and mode & SETID:
        found["setuid_plant"] = f"{path} is mode {mode & 0o7777:04o}"
    if stat.S_ISREG(mode):
        try:
            found["file_caps"] = f"{path} has {CAPS_XATTR} {os.getxattr(path, CAPS_XATTR, follow_symlinks=False).hex()}"
        except OSError:
            pass  # none (ENODATA), or a filesystem without xattrs
    return found
