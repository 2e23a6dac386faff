"""The search for git directories below a writable root, remembered between runs.

gitguard must find every repository below every writable root at every run (the threat: a
nested repository's hooks or config rewritten from inside, run by the user's next `git status`
on the host). Listing every directory costs ~13 us each: 18 ms for a checkout of 1,400
directories, far more with a node_modules. So each walk's result is kept per root: for every
directory its identity (device, inode, ctime) and what the walk took from its listing (its
subdirectories, its `.git` entries, whether it is itself a git directory). The next walk lstat()s
each directory (one syscall) and lists only those whose identity changed.

Why a remembered directory still holds what it held: creating, removing, renaming or replacing an
entry (a new `.git`, a subdirectory swapped for a symlink) updates the directory's ctime, and no
unprivileged process can set a ctime (utimensat sets atime and mtime only; ctime is the kernel's
clock). A directory whose ctime was within CTIME_SLACK of its listing is not remembered: the
kernel's timestamps are coarse, so a change in the same tick as the listing could leave the
ctime as it was. The walk still goes top-down through every directory, so what changed below a
remembered one is found at its own level. The cache lives in the user's runtime directory,
which every sandbox has hidden; an unreadable or damaged cache is a full walk, as before.
"""

from __future__ import annotations

import binascii  # crc32 as zlib computes it, without loading zlib on every run
import marshal
import os
import time
from collections.abc import Callable, Iterator

CTIME_SLACK_NS = 2_000_000_000
MAX_WALKS = 64  # roots remembered; past this the least recently saved are forgotten (walked in full again)
_VERSION = 1

# One directory as remembered: (st_dev, st_ino, st_ctime_ns, is a git directory, subdirectories,
# (kind, path) of its `.git` entries). Kinds as gitguard's walk yields them: "dir", "file", "link".
Entry = tuple[int, int, int, bool, tuple[str, ...], tuple[tuple[str, str], ...]]
Listing = Callable[[str], tuple[bool, list[str], list[tuple[str, str]]] | None]


def cache_file(cache_dir: str, root: str) -> str:
    name = root.strip("/").replace("/", "%")[-120:] or "%"
    return os.path.join(cache_dir, f"{name}.{binascii.crc32(root.encode()):08x}.walk")


def load(path: str, root: str) -> dict[str, Entry]:
    try:
        with open(path, "rb") as f:
            data = marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not (isinstance(data, tuple) and len(data) == 3 and data[:2] == (_VERSION, root) and isinstance(data[2], dict)):
        return {}  # another root's (a name clash) or another version's: walk in full
    return data[2]


def save(path: str, root: str, seen: dict[str, Entry]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(marshal.dumps((_VERSION, root, seen)))
        os.replace(tmp, path)  # a concurrent run reads the old walk or this one, never half
        _forget_oldest(os.path.dirname(path))
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass  # no cache: the next run walks in full


def _forget_oldest(cache_dir: str) -> None:
    with os.scandir(cache_dir) as it:
        walks = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in it if e.name.endswith(".walk")]
    for _, old in sorted(walks)[: max(0, len(walks) - MAX_WALKS)]:
        os.unlink(old)


def walk(root: str, listing: Listing, cache_dir: str | None, limit: int) -> Iterator[tuple[str, str] | None]:
    """gitguard's walk: ("dir"|"file"|"link", path) for each git directory and `.git` entry below
    root; None once `limit` directories were visited (the caller notes it and stops).
    `listing(d)` lists one directory: (is a git directory, subdirectories, `.git` entries), or None."""
    path = cache_file(cache_dir, root) if cache_dir else None
    old = load(path, root) if path else {}
    seen: dict[str, Entry] = {}
    stack, count = [root], 0
    while stack:
        d = stack.pop()
        count += 1
        if count > limit:
            yield None
            return
        entry = _entry(d, old.get(d), listing)
        if entry is None:
            continue
        if entry[2] >= 0:
            seen[d] = entry
        if entry[3]:
            yield "dir", d
            continue
        yield from entry[5]
        stack.extend(entry[4])
    if path and (seen != old):
        save(path, root, seen)


def _entry(d: str, known: Entry | None, listing: Listing) -> Entry | None:
    """d as remembered if its identity is unchanged, else listed now (ctime -1: not to be remembered)."""
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if known is not None and known[:3] == (st.st_dev, st.st_ino, st.st_ctime_ns):
        return known
    listed = listing(d)
    if listed is None:
        return None
    gitdir, subdirs, found = listed
    recent = time.time_ns() - st.st_ctime_ns < CTIME_SLACK_NS
    return (st.st_dev, st.st_ino, -1 if recent else st.st_ctime_ns, gitdir, tuple(subdirs), tuple(found))
