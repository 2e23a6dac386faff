"""Any change to the code a fork server has imported: it stops taking runs (inotify).

A caller's key names where its `launcher` comes from, not what the files say, so an edit or a
reinstall under a running server would otherwise be served by the old code. Every directory of the
run's packages is watched from before the server imports them: a change made before a caller
connects is in the inotify queue by then, and the server reads the queue before it forks.
"""

from __future__ import annotations

import ctypes
import os
import struct

IN_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
# IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF
CHANGES = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
PACKAGES = ("launcher", "fsguard", "netguard", "sgbase")  # what a run imports (selftest: only `verify`)
IN_ISDIR, SELF = 0x40000000, 0x400 | 0x800
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then the name, NUL-padded

_libc = ctypes.CDLL(None, use_errno=True)


def watch(root: str) -> int:
    """An inotify descriptor watching every directory of PACKAGES under `root` (the interpreter's too)."""
    fd = int(_libc.inotify_init1(IN_NONBLOCK_CLOEXEC))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    dirs: list[str] = []
    for package in PACKAGES:
        dirs += [d for d, _, _ in os.walk(os.path.join(root, package)) if not d.endswith("__pycache__")]
    for d in dirs:
        if _libc.inotify_add_watch(fd, os.fsencode(d), CHANGES) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {d}: {os.strerror(err)}")
    return fd


def changed(fd: int) -> bool:
    """True if code changed since the last call (the queue is drained)."""
    seen = False
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return seen
        if not data:
            return seen
        seen = any(map(relevant, events(data))) or seen


def events(data: bytes) -> list[tuple[int, str]]:
    """(mask, name) of each inotify event in `data`."""
    out, at = [], 0
    while at + _EVENT.size <= len(data):
        _, mask, _, n = _EVENT.unpack_from(data, at)
        name = data[at + _EVENT.size : at + _EVENT.size + n].rstrip(b"\0").decode(errors="replace")
        out.append((mask, name))
        at += _EVENT.size + n
    return out


def relevant(event: tuple[int, str]) -> bool:
    """A module, a .pth or an extension changed, a package directory came or went, or a watched one
    moved; not the interpreter's own byte-code cache (written by the imports themselves)."""
    mask, name = event
    if mask & SELF:
        return True
    if mask & IN_ISDIR:
        return name != "__pycache__"
    return name.endswith((".py", ".pth", ".so"))
