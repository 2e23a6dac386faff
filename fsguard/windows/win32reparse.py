"""The links below a folder, listed as the real user without following any (reparse.py decides; r4-run N1).

An effect (os.scandir, os.readlink), so apart from the pure module; it needs no binding of its own:
DirEntry.is_junction (3.12) and os.readlink read junctions and symlinks on Windows.
"""

from __future__ import annotations

import ntpath
import os

from fsguard.windows.reparse import Link

#: The Win32 prefix that lifts MAX_PATH (r5-new): without it (and without LongPathsEnabled, off by
#: default) FindFirstFileW fails on a folder of 260 characters or more, so a junction the command made
#: deep enough would be skipped here while the ACL walk, which has no such limit, still reaches it
#: (learn.microsoft.com/windows/win32/fileio/maximum-file-path-limitation).
LONG = "\\\\?\\"


def _long(path: str) -> str:
    r"""A drive path in its `\\?\` form (taken literally: separators normalised first)."""
    return LONG + ntpath.normpath(path) if path[1:3] in (":\\", ":/") else path


def _plain(path: str) -> str:
    """The name as the user and reparse.resolved know it (a relative target joins onto it)."""
    return path[len(LONG) :] if path.startswith(LONG) and path[len(LONG) + 1 : len(LONG) + 3] == ":\\" else path


def walk(root: str) -> tuple[Link, ...]:
    """Every directory junction and symlink below `root`, none followed (DirEntry.is_junction: 3.12).
    A folder the real user cannot list is skipped: the ACL propagation cannot enter it either."""
    out: list[Link] = []
    todo = [_long(root)]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_symlink() or entry.is_junction():
                    out.append(Link(_plain(entry.path), _target(entry.path)))
                elif entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
            except OSError:
                continue
    return tuple(out)


def _target(path: str) -> str:
    try:
        return os.readlink(path)
    except (OSError, ValueError):  # ValueError: a reparse point that is not a link (readlink on Windows)
        return ""
