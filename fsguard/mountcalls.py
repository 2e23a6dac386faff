"""The mount(2) and umount2(2) calls and their flags, below everything that mounts.

fsguard/mounts.py (the namespace, step by step), fsguard/kernelfs.py (/proc, /sys, /dev) and
fsguard/exposed.py (sockets bound back) all mount through these few calls, so each failure is
one MountError naming its target and each read-only bind keeps the flags the kernel locks.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
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


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); raises MountError naming the target, so a half-built namespace never runs a command."""
    # fsencode: a path found by walking the tree may hold bytes that are not UTF-8 (surrogate-escaped).
    if (
        _libc.mount(
            os.fsencode(source) if source else None,
            os.fsencode(target),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        e = ctypes.get_errno()
        raise MountError(e, f"mount {target}: {os.strerror(e)}")


#: statvfs f_flag bit -> mount flag. In a user namespace the flags of mounts inherited from the
#: host are locked: a remount that would clear one (noexec, an atime mode) is refused, so a
#: read-only remount must repeat them.
_KEPT_FLAGS = ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, 1024), (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21))


def bind_readonly(source: str, target: str) -> None:
    """Bind `source` over `target`, then remount the bind read-only, nosuid and nodev."""
    mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    have = os.statvfs(target).f_flag
    for st_bit, ms_bit in _KEPT_FLAGS:
        if have & st_bit:
            flags |= ms_bit
    mount(None, target, None, flags)


def nosuid_bind(target: str) -> None:
    """Remount a bind sandgate made of a writable root nosuid and nodev, keeping every flag it had
    (the host's are locked in our user namespace: a remount clearing one is refused). The threat: a
    setuid binary or a device node in a writable root honoured inside; no_new_privs already keeps
    setuid from raising anything, this is the mount's own word on it."""
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV
    have = os.statvfs(target).f_flag
    if have & os.ST_RDONLY:
        flags |= MS_RDONLY
    for st_bit, ms_bit in _KEPT_FLAGS:
        if have & st_bit:
            flags |= ms_bit
    mount(None, target, None, flags)


def detach(path: str) -> None:
    """Lazy unmount; a refusal is ignored: the callers cover what stays (a mount locked by the user
    namespace stays underneath, unreachable)."""
    _libc.umount2(os.fsencode(path), MNT_DETACH)
