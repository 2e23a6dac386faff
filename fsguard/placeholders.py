"""Placeholders: what covers a missing protected path while runs live, shared by concurrent runs.

A protected path that does not exist yet (`.git/hooks/x`, `.vscode/`, `.sandgate.yaml`) must be
impossible to create from inside, and a read-only mount is the only cover the kernel offers; a
mount needs an existing file or directory to land on. We looked for a way with no trace in the
user's workspace and found none: a mount cannot be made on a name that does not exist; a tmpfs
or overlay over the parent, made inside the sandbox's mount namespace, sends every other write in
that directory (the workspace itself) to a layer the host never sees; Landlock grants rights
per directory hierarchy, never per name, so it cannot refuse `mkdir .vscode` while allowing
`mkdir src`; a seccomp notifier that vets path arguments is racy (the pointer is read again
after the check) and misses spellings (renameat2, linkat, openat2, symlinkat); fanotify reports
a creation only after the fact. So the launcher creates an empty, read-only placeholder on the
host (a directory, or a file holding our text) and removes it when no live run needs it.

Many runs at once share them (issue 23: one run removed a placeholder while another mounted it,
or after: removing a directory on the host unmounts it in every other mount namespace, so a
live run's protected name became creatable). launcher/run/placeholdershare.py keeps who uses
which; here are the file-level pieces: making one (`make`), removing one only while it is still
an unused placeholder (`try_remove`, under an exclusive flock taken without waiting, so never
while any process, of any user, holds a shared one: `Refs`), and creating nothing inside
another run's (`adopt`). A killed process's flocks go with its last descriptor; the descriptors
never reach the sandbox: every fork's child closes them at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import posixpath
import stat
import time
from dataclasses import replace

from fsguard.gitguard import PLACEHOLDER_TEXTS
from fsguard.mountcalls import MountError
from fsguard.mountplan import MountPlan

#: What a placeholder is made with: read-only for everyone, so nothing on the host fills it either.
DIR_MODE, FILE_MODE = 0o555, 0o444
#: How long `hold` waits for a shared lock another user's removal holds exclusively for a moment.
HOLD_WAIT = 2.0

#: Descriptors holding shared locks, in this process; a forked child closes its copies (the
#: threat: a descriptor of a placeholder directory inherited inside would reach the writable
#: directory under the read-only mount).
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


class Stale(Exception):
    """The workspace changed between planning and holding (a path vanished or appeared): plan again."""


Ident = tuple[int, int]  # (st_dev, st_ino)


def make(path: str, is_dir: bool, text: str = "") -> Ident:
    """Create one placeholder (FileExistsError if the name is taken); returns its identity. Its mode
    is exact whatever the umask: others recognise a placeholder by it (`looks_like_one`)."""
    if is_dir:
        os.mkdir(path, DIR_MODE)
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.chmod(f"/proc/self/fd/{fd}", DIR_MODE)  # the directory made, even if its name moved
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return st.st_dev, st.st_ino
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, FILE_MODE)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def shaped(path: str, st: os.stat_result, texts: tuple[str, ...], strict: bool = False) -> bool:
    """Whether `path` still looks like a placeholder: an empty directory, or a file empty or holding
    one of our texts (`strict`: also with the mode we made it with, for a path known by name only)."""
    if stat.S_ISDIR(st.st_mode):
        if strict and stat.S_IMODE(st.st_mode) != DIR_MODE:
            return False
        try:
            with os.scandir(path) as it:
                return next(it, None) is None
        except OSError:
            return False
    if not stat.S_ISREG(st.st_mode) or (strict and stat.S_IMODE(st.st_mode) != FILE_MODE):
        return False
    if st.st_size == 0:
        return True
    if st.st_size > max((len(t) for t in texts), default=0):
        return False
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace") in texts
    except OSError:
        return False


def _open(path: str) -> int:
    # O_NONBLOCK: a FIFO put where a protected file was must not hang the launcher.
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)


def _ident(st: os.stat_result) -> Ident:
    return st.st_dev, st.st_ino


class Refs:
    """A shared flock on each path held, until `close`: while held, no `try_remove` takes it."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def hold(self, path: str) -> None:
        """Hold `path` (a directory or regular file; anything else is no placeholder and is skipped).

        Raises Stale when the path vanished or was replaced meanwhile."""
        if path in self.fds:
            return
        try:
            fd = _open(path)
        except FileNotFoundError:
            raise Stale(path) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Stale(path) from None  # a symlink took its place: planning refuses it
            return  # unreadable to us: no one's placeholder (ours are readable to all)
        try:
            held = _lock_unchanged(fd, path)
        except BaseException:
            os.close(fd)
            raise
        if not held:
            os.close(fd)
            return
        self.fds[path] = fd
        _HELD.add(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            if fd in _HELD:  # else a forked child, which closed its copies already
                _HELD.discard(fd)
                os.close(fd)
        self.fds.clear()


def _lock_unchanged(fd: int, path: str) -> bool:
    """A shared lock on `fd`, which must still be what `path` names (Stale if it is not: removed,
    and maybe made again, between the open and the lock); False for what holds no placeholder."""
    st = os.fstat(fd)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or not _lock(fd, fcntl.LOCK_SH, HOLD_WAIT):
        return False
    try:
        same = _ident(os.lstat(path)) == _ident(st)
    except OSError:
        same = False
    if not same:
        raise Stale(path)
    return True


def _lock(fd: int, how: int, wait: float) -> bool:
    """flock without blocking forever; False when still refused after `wait` seconds (or unsupported)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        except OSError:
            return False  # a filesystem without flock: never taken for unheld


def try_remove(path: str, ident: Ident | None, texts: tuple[str, ...]) -> str:
    """Remove a placeholder no run holds: "removed", "held" (a run holds it: try again later), or
    "gone" (not there, or the name holds something that is not an unused placeholder of ours: kept,
    and forgotten). `ident` None: known by name only (a killed run's list), so the mode must match too."""
    try:
        fd = _open(path)
    except OSError:
        return "gone"
    try:
        st = os.fstat(fd)
        if (ident is not None and _ident(st) != ident) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return "gone"
        if not _lock(fd, fcntl.LOCK_EX, 0):
            return "held"
        try:
            if _ident(os.lstat(path)) != _ident(st):
                return "gone"
        except OSError:
            return "gone"
        if not shaped(path, st, texts, strict=ident is None):
            # Our directory with something in it (another user's run's placeholder, say): later.
            # A file rewritten, or a name never known to be ours: theirs now, kept.
            return "held" if ident is not None and stat.S_ISDIR(st.st_mode) else "gone"
        try:
            (os.rmdir if stat.S_ISDIR(st.st_mode) else os.unlink)(path)
        except FileNotFoundError:
            return "gone"
        except OSError:
            return "held"  # filled meanwhile (ENOTEMPTY), a mount point here (EBUSY): later
        return "removed"
    finally:
        os.close(fd)  # drops the exclusive lock


def adopt(plan: MountPlan, known: set[str]) -> MountPlan:
    """A planned placeholder below a placeholder that exists is covered by that one instead: nothing is
    created inside another live run's read-only placeholder. `known`: this user's runs' placeholders;
    another user's run's are recognised by their shape (an empty directory of DIR_MODE: bound read-only
    over itself, even a directory that only looks like one changes nothing)."""
    keep: list[tuple[str, bool]] = []
    covered: list[str] = []
    for path, is_dir in plan.placeholders:
        above = next((a for a in _ancestors(path) if a in known or looks_like_one(a)), None)
        if above is None:
            keep.append((path, is_dir))
        elif above not in plan.protect and above not in covered:
            covered.append(above)
    if not covered and len(keep) == len(plan.placeholders):
        return plan
    names = {p for p, _ in keep}
    return replace(
        plan,
        protect=(*plan.protect, *covered),
        placeholders=tuple(keep),
        filled=tuple((p, t) for p, t in plan.filled if p in names),
    )


def looks_like_one(path: str) -> bool:
    """An unused placeholder as `make` leaves one: empty (or our text), read-only for everyone."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return shaped(path, st, PLACEHOLDER_TEXTS, strict=True)


def _ancestors(path: str) -> list[str]:
    out = []
    while (parent := posixpath.dirname(path)) != path:
        out.append(parent)
        path = parent
    return out


# ---- one run alone, no sharing (for tools and tests) -------------------------------------------------


def create_placeholders(p: MountPlan) -> list[str]:
    """Create the plan's placeholders; returns what was created (a name already taken is skipped)."""
    made: list[str] = []
    filled = dict(p.filled)
    for path, is_dir in p.placeholders:
        try:
            make(path, is_dir, filled.get(path, ""))
        except FileExistsError:
            continue
        except OSError as e:
            remove_placeholders(made)
            raise MountError(e.errno, f"cannot cover the missing protected path {path}: {e.strerror}") from None
        made.append(path)
    return made


def remove_placeholders(paths: list[str]) -> None:
    """Remove these placeholders where no run holds them and they are still empty (or hold our text)."""
    for path in reversed(paths):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        try_remove(path, _ident(st), PLACEHOLDER_TEXTS)
