"""The sandbox's private mount namespace, built in an explicit order (like bubblewrap's arguments).

1. everything below / becomes a slave mount: nothing we mount propagates back to the host,
   while the host's later mounts still appear inside;
2. a fresh /proc for the new pid namespace: the sandbox sees only its own processes and
   cannot reach /proc/<outside pid>/root or environ;
3. single files bound over host files (resolv.conf pointing at our DNS listener).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
MNT_DETACH = 2


class MountError(OSError):
    pass


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                   flags, None) != 0:
        e = ctypes.get_errno()
        raise MountError(e, f"mount {target}: {os.strerror(e)}")


def make_private() -> None:
    _mount(None, "/", None, MS_REC | MS_SLAVE)


def fresh_proc() -> None:
    # Detach the host's /proc first so no open handle to it stays reachable below ours.
    _libc.umount2(b"/proc", MNT_DETACH)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def fresh_sys() -> None:
    """sysfs of the new network namespace (so /sys/class/net shows the sandbox's links only)."""
    _libc.umount2(b"/sys", MNT_DETACH)
    _mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)


def bind_file_readonly(source: Path, target: Path) -> None:
    """Bind `source` over `target` (following a symlinked target, as the reader would), read-only."""
    real = Path(os.path.realpath(target))
    if not real.is_file():
        # Creating it would write to the host's filesystem: the mount namespace does not isolate files.
        raise MountError(2, f"cannot cover {target}: {real} is not a file")
    _mount(str(source), str(real), None, MS_BIND)
    _mount(None, str(real), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
