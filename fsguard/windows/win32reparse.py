"""The links below a folder, listed as the real user without following any (reparse.py decides; r4-run N1).

An effect (os.scandir, os.readlink), so apart from the pure module; it needs no binding of its own:
DirEntry.is_junction (3.12) and os.readlink read junctions and symlinks on Windows.
"""

from __future__ import annotations

import os

from fsguard.windows.reparse import Link


def walk(root: str) -> tuple[Link, ...]:
    """Every directory junction and symlink below `root`, none followed (DirEntry.is_junction: 3.12).
    A folder the real user cannot list is skipped: the ACL propagation cannot enter it either."""
    out: list[Link] = []
    todo = [root]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_symlink() or entry.is_junction():
                    out.append(Link(entry.path, _target(entry.path)))
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
