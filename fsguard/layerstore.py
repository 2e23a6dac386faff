"""Where the sandbox homes' layers live on disk, and who is using them: directories, locks, live runs.

  <store>/<hash of the home + identity>/  home: the real home's path and identity (gone or changed: garbage)
    ws-<hash of workspace + identity>/  one workspace (fsguard/homeoverlay.py says why per workspace)
      workspace                         its real path and identity (a recreated directory is a new one)
      lock                              flock: creating or folding runs, clearing, collecting
      layer/                            what the workspace's finished runs wrote under ~ (a lower layer only)
      runs/<id>/                        one run: upper/ + work/ (its own, never another mount's), owner, lock
      trash/                            layer entries being replaced during a fold (never inside the layer)

A run is live while its `lock` is flocked: the launcher takes it with a descriptor that its forked
holder and init inherit (not CMD: it closes every descriptor; not exec'd helpers: O_CLOEXEC), so
it stays locked until the last of them is gone, a SIGKILLed launcher included. Runs are created
and judged dead only under the workspace's lock, so a half-made run is never taken for a dead one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT_BASE = Path("/var/lib/sandgate")
USER_STORE_PARENT = Path("/var/tmp")  # each user's own store: sandgate-<uid>/ here
FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode's generation (ext4, xfs, btrfs...)
_LOCK_TRIES = 100  # a workspace directory removed under a waiter (cache clear) is made again, this often


class HomeOverlayError(OSError):
    """A layer directory cannot be used (squatted, not ours, in use); one line for the user."""


@dataclass(frozen=True)
class RunEntry:
    """One run's directory in a workspace, as its owner file describes it."""

    path: Path
    pid: int  # the launcher's
    workspace: str
    fresh: bool  # --fresh-home: its writes are dropped, never folded into the layer
    start: int = 0  # time.time_ns() when it was made: runs are folded in the order they started


def store(uid: int) -> Path:
    """Where a user's sandbox homes live (root keeps one store per uid the command runs as)."""
    return ROOT_BASE / f"homes-{uid}" if os.geteuid() == 0 else Path(f"/var/tmp/sandgate-{uid}") / "homes"


def _digest(text: str) -> str:
    from _sha2 import sha256  # CPython's own; hashlib would load OpenSSL on every run

    out: str = sha256(text.encode(errors="surrogateescape")).hexdigest()  # _sha2 ships no type information
    return out


def user_stores() -> tuple[Path, ...]:
    """Every user's own store directory (`/var/tmp/sandgate-<uid>`) that exists, whoever's: real
    directories only (a symlink planted under that name must not make a run hide its target)."""
    try:
        with os.scandir(USER_STORE_PARENT) as entries:
            found = [
                Path(e.path)
                for e in entries
                if e.name.startswith("sandgate-") and e.name[9:].isdigit() and e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return ()
    return tuple(sorted(found))


def home_identity(home: str) -> str:
    """inode:generation of the home directory. A new account that is given a deleted account's uid
    gets a home directory made anew (a new inode, and a new generation where ext4 hands out the
    number again), so it never inherits the old account's layers; not st_dev, which a renumbered
    device changes under the same home. Where the generation cannot be read it is 0 (inode only)."""
    return identity(home).split(":", 1)[1]


def home_key(home: str) -> str:
    """The directory name of one home's layers: its path AND its identity."""
    return _digest(home + chr(0) + home_identity(home))[:12]


def home_dir(uid: int, home: str) -> Path:
    """One directory per user (the store), home path and home identity: two homes must never share
    (or see) each other's writes, nor a new account the layers of the uid's previous one."""
    return store(uid) / home_key(home)


def recorded_home(home_base: Path) -> tuple[str, str] | None:
    """(path, identity) of the home a home's directory was made for; None: not ours, or being made."""
    try:
        lines = (home_base / "home").read_text().splitlines()
    except OSError:
        return None
    if not lines or not lines[0]:
        return None
    return lines[0], lines[1] if len(lines) > 1 else ""


def record_home(home_base: Path, home: str, ident: str) -> None:
    """Write the `home` record atomically: a half-written one would read as a stale layer's."""
    text = f"{home}\n{ident}\n"
    if recorded_home(home_base) == (home, ident):
        return
    tmp = home_base / f"home.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, home_base / "home")


def home_gone(home_base: Path) -> bool:
    """The home this directory was made for no longer exists, or is another directory now (a new
    account at the same path), or the record predates identities (sandgate before issue 24)."""
    rec = recorded_home(home_base)
    if rec is None:
        return False
    path, ident = rec
    if not ident:
        return True
    try:
        return home_identity(path) != ident
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # cannot tell (no access): keep it


def identity(path: str) -> str:
    """st_dev:st_ino:generation of a directory: a workspace removed and made again is another
    workspace, also where the filesystem hands out the freed inode number again (ext4 does at once;
    its generation number then differs). 0 where it cannot be read (no such ioctl, no read access)."""
    st = os.stat(path)  # FileNotFoundError: gone
    gen = 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return f"{st.st_dev}:{st.st_ino}:0"
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == (st.st_dev, st.st_ino):
            gen = int.from_bytes(fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8))[:4], sys.byteorder)
    except OSError:
        pass
    finally:
        os.close(fd)
    return f"{st.st_dev}:{st.st_ino}:{gen}"


def _same(recorded: str, now: str) -> bool:
    """One directory: same device and inode, and the same generation where both could be read."""
    a, b = recorded.split(":"), now.split(":")
    return a[:2] == b[:2] and (a[2:3] == b[2:3] or "0" in (a[2:3] + b[2:3]))


def workspace_dir(home_base: Path, workspace: str) -> tuple[Path, str, str]:
    """The workspace's directory under a home's (by real path and identity), that path and identity."""
    real = os.path.realpath(workspace)
    ident = identity(real)
    return home_base / f"ws-{_digest(real + chr(0) + ident)[:16]}", real, ident


def private(path: Path, uid: int) -> None:
    """Create `path` 0700 (parents too); an existing one must be a real directory owned by `uid`, 0700."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise HomeOverlayError(e.errno or 1, f"cannot create the sandbox's home store {path}: {e.strerror}") from None
    # The threat: /var/tmp is shared; another user creating our name first could read or seed our home.
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        # Someone else's entry in a shared directory cannot be removed by us: say who can.
        fix = (
            "remove it and run again"
            if st.st_uid == uid
            else f"it belongs to uid {st.st_uid}: ask an administrator to remove it"
        )
        raise HomeOverlayError(
            1,
            f"refusing {path} as the sandbox's home store: it must be a directory owned by "
            f"uid {uid} with mode 0700; {fix}",
        )


@contextlib.contextmanager
def locked(ws: Path, *, owner: int | None) -> Iterator[bool]:
    """Hold the workspace's lock; yields False (holding nothing) when `ws` is gone and `owner` is None.

    `owner`: (re)create `ws` as that uid's private directory first. A lock file unlinked while we
    waited (`cache clear` removed the workspace) is not the lock: open the new one and wait again.
    """
    for _ in range(_LOCK_TRIES):
        if owner is not None:
            private(ws, owner)
        try:
            fd = os.open(ws / "lock", os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            if owner is None:
                yield False
                return
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            now = os.stat(ws / "lock", follow_symlinks=False)
            held = os.fstat(fd)
            same = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            try:
                yield True
            finally:
                os.close(fd)
            return
        os.close(fd)
    raise HomeOverlayError(errno.EAGAIN, f"cannot lock {ws}: it keeps being removed; try again")


def new_run(ws: Path, workspace: str, *, fresh: bool) -> tuple[Path, int]:
    """Make this run's directory (under the workspace's lock) and lock it; returns it and the lock's fd."""
    runs = ws / "runs"
    runs.mkdir(mode=0o700, exist_ok=True)
    for _ in range(8):
        run = runs / os.urandom(6).hex()
        try:
            run.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    else:
        raise HomeOverlayError(errno.EEXIST, f"cannot make a run directory in {runs}")
    fd = os.open(run / "lock", os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else can hold it
    owner = {"pid": os.getpid(), "workspace": workspace, "fresh": fresh, "start": time.time_ns()}
    (run / "owner").write_text(json.dumps(owner) + "\n")
    for d in ("upper", "work"):
        (run / d).mkdir(mode=0o700)
    return run, fd


def _is_live(run: Path) -> bool:
    """Whether some process still holds the run's lock (the launcher, or the sandbox it forked)."""
    try:
        fd = os.open(run / "lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # killed before it locked (runs are made under the workspace's lock): dead
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _entry(run: Path) -> RunEntry:
    try:
        data = json.loads((run / "owner").read_text())
        return RunEntry(run, int(data["pid"]), str(data["workspace"]), bool(data["fresh"]), int(data.get("start", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return RunEntry(run, 0, "?", True)  # killed while being made: it wrote nothing worth keeping


def runs(ws: Path) -> tuple[list[RunEntry], list[RunEntry]]:
    """(live, dead) runs of a workspace, each in the order they started; call under its lock."""
    live: list[RunEntry] = []
    dead: list[RunEntry] = []
    try:
        found = sorted(p for p in (ws / "runs").iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return live, dead
    for run in found:
        (live if _is_live(run) else dead).append(_entry(run))
    return sorted(live, key=lambda r: r.start), sorted(dead, key=lambda r: r.start)


def wait_for(run: RunEntry) -> None:
    """Block until the run's lock is released (its sandbox is gone)."""
    try:
        fd = os.open(run.path / "lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def recorded_workspace(ws: Path) -> tuple[str, str] | None:
    """(real path, identity) a workspace directory was made for; None if it is not one of ours."""
    try:
        path, ident = (ws / "workspace").read_text().splitlines()[:2]
    except (OSError, ValueError):
        return None
    return path, ident


def vanished(ws: Path) -> bool:
    """The workspace this layer was made for no longer exists (removed, or replaced by another directory)."""
    rec = recorded_workspace(ws)
    if rec is None:
        return False  # not one of ours, or being made: leave it
    try:
        return not _same(rec[1], identity(rec[0]))
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # cannot tell (no access): keep it


def workspaces(home_base: Path) -> list[Path]:
    """Every workspace directory under one home's."""
    try:
        return sorted(p for p in home_base.iterdir() if p.name.startswith("ws-") and p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def homes(base: Path) -> list[Path]:
    """Every home's directory in a store (those with their `home` file: ours)."""
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.is_dir() and not p.is_symlink() and (p / "home").is_file()]
