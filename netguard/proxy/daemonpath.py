"""Where a user's daemon socket lives: the runtime directory, its checks, the socket's name.

Nothing but `os` and `stat`: `sandgate run` finds (or spawns) its daemon before it imports anything
else (launcher/prestart.py; a cold daemon's start is what the first connection waits for, issue 25).
netguard.proxy.control wraps these for everyone else, with Path objects.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping


class ControlError(Exception):
    """The daemon refused a request, went away, or the runtime directory is unsafe: one sentence."""


def runtime_base(environ: Mapping[str, str], uid: int) -> str:
    """Where the runtime directory should be, before any check of it (pure but for one stat)."""
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return os.path.join(xdg, "sandgate")
    if uid == 0:
        return "/run/sandgate"
    return f"/tmp/sandgate-{uid}"


def private_dir(path: str, uid: int | None = None) -> str:
    """`path` as a directory only `uid` can use, created 0700 if missing.

    In a shared directory like /tmp another user can create our name first (squatting) and
    read or replace our socket: an existing entry must be a real directory, ours, 0700-ish.
    """
    uid = os.geteuid() if uid is None else uid
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ControlError(f"cannot create the sandgate runtime directory {path}: {e.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and os.statvfs(path).f_flag & os.ST_RDONLY and st.st_mode & 0o077:
        # What a sandbox shows in place of every runtime directory: an empty read-only tmpfs.
        raise ControlError(
            f"the sandgate runtime directory {path} is hidden here: this looks like the inside of a sandgate "
            "sandbox, and sandgate does not run nested; run it outside"
        )
    if stat.S_ISLNK(st.st_mode):
        raise ControlError(f"refusing the sandgate runtime directory {path}: it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"refusing the sandgate runtime directory {path}: it is not a directory")
    if st.st_uid != uid:
        raise ControlError(f"refusing the sandgate runtime directory {path}: it belongs to uid {st.st_uid}, not {uid}")
    if st.st_mode & 0o077:
        raise ControlError(
            f"refusing the sandgate runtime directory {path}: mode {stat.S_IMODE(st.st_mode):04o} "
            "lets other users in (expected 0700)"
        )
    return path


def runtime_dir() -> str:
    """$XDG_RUNTIME_DIR/sandgate, else /run/sandgate for root, else /tmp/sandgate-<uid>; checked, 0700."""
    uid = os.geteuid()
    return private_dir(runtime_base(os.environ, uid), uid)


def socket_path(runtime_dir: str) -> str:
    """The daemon socket for this network namespace and this code: a daemon connects upstream from
    its own netns, so a launcher must never be served by one that lives in another; and a daemon
    still running an older sandgate (an upgrade, a checkout that moved on) must not decide for a
    newer launcher. The old one is left to its idle exit."""
    return os.path.join(runtime_dir, f"daemon-{os.stat('/proc/self/ns/net').st_ino}-{code_id()}.sock")


_CODE_IDS: dict[str, str] = {}  # by interpreter: a run asks twice (prestart, then the launcher)


def code_id() -> str:
    """A short fingerprint of the daemon's code: the interpreter and every netguard module (size, mtime),
    sub-packages included (the daemon itself lives in netguard/proxy/).

    ~25 stat calls: cheap enough for every run, and any edit or reinstall changes it.
    """
    known = _CODE_IDS.get(sys.executable)
    if known is not None:
        return known
    try:  # CPython's own SHA-256: hashlib would load OpenSSL first (~4 ms on every run)
        from _sha2 import sha256  # private: no stub (see pyproject)
    except ImportError:
        from hashlib import sha256

    netguard = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    h = sha256(sys.executable.encode())
    # os.walk and strings, not Path.rglob: the same files, ~0.5 ms instead of ~3-7 ms on every run
    found = (os.path.join(d, f) for d, _, files in os.walk(netguard) for f in files if f.endswith(".py"))
    for f in sorted(found):
        st = os.stat(f)
        h.update(f"{os.path.relpath(f, netguard)}:{st.st_size}:{st.st_mtime_ns};".encode())
    _CODE_IDS[sys.executable] = out = str(h.hexdigest())[:10]
    return out
