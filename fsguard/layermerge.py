"""Fold a finished run's overlay upper directory into its workspace's layer, and remove layer trees.

The run's overlay was `upper (this run's) over layer (the workspace's) over the real home`; after
the fold, `layer over the real home` shows what the run saw at its end. Overlayfs records two
things in an upper directory besides plain files (mounted with `userxattr`, which also turns off
redirects and metacopy, so nothing else appears):
  a whiteout (a 0:0 character device): the name was removed: it replaces whatever the layer had,
    and stays a whiteout there, so the real home's entry stays hidden too;
  an opaque directory (xattr user.overlay.opaque=y): made anew over a removed one: it replaces
    the layer's directory whole.
Any other directory merges entry by entry; anything else replaces the layer's entry. Each step is
one rename (the store is one filesystem), so a run mounting the layer meanwhile sees every file
either old or new, never torn; a layer directory to be replaced is first renamed into `trash`
(outside the layer) and removed after. Runs that overlapped are folded one after the other
(homeoverlay.py: in the order they started): for the same file the last folded wins (for a
cache, a miss at worst, never a mixed file).

Everything here works on sandgate's private store, which no sandbox can reach (hidden inside),
and on dead runs only, so no path can change underneath; still, symlinks are never followed.
Tools leave read-only trees (Go's module cache is 0555; virtualenv's wheel cache): an ordinary
user cannot rename out of or remove from them, so a refused step is retried with u+rwx on the
directories involved, and their modes are put back where the directory is kept.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

OPAQUE = ("user.overlay.opaque", "trusted.overlay.opaque")


def merge(upper: Path, layer: Path, trash: Path) -> list[str]:
    """Fold `upper` into `layer` (both on one filesystem); returns what could not be kept (one line each)."""
    problems: list[str] = []
    try:
        _merge_dir(str(upper), str(layer), trash, problems)
    except OSError as e:  # the upper directory itself cannot be read
        problems.append(f"{upper}: {e.strerror or e}")
    return problems


def _merge_dir(src: str, dst: str, trash: Path, problems: list[str]) -> None:
    for name in _access(lambda: os.listdir(src), src):  # src goes away after the fold: its modes do not matter
        s, d = os.path.join(src, name), os.path.join(dst, name)
        try:
            st = os.lstat(s)
            try:
                dst_st: os.stat_result | None = os.lstat(d)
            except FileNotFoundError:
                dst_st = None
            if stat.S_ISDIR(st.st_mode) and dst_st is not None and stat.S_ISDIR(dst_st.st_mode) and not _opaque(s, st):
                _open_up(d, dst_st)  # merged into: its final mode is the run's copy's, set below
                _merge_dir(s, d, trash, problems)
                _copy_attrs(st, d)
                continue
            if dst_st is not None and (stat.S_ISDIR(st.st_mode) or stat.S_ISDIR(dst_st.st_mode)):
                _move(d, str(trash / os.urandom(8).hex()))  # rename(2) cannot replace a directory
            _move(s, d)
        except OSError as e:
            problems.append(f"{d}: {e.strerror or e}")


def _opaque(path: str, st: os.stat_result) -> bool:
    """overlayfs made this directory anew over a removed one (user.* xattrs need read access to see)."""
    return any(_xattr(path, name, st)[:1] == b"y" for name in OPAQUE)


def _xattr(path: str, name: str, st: os.stat_result) -> bytes:
    try:
        return _access(lambda: os.getxattr(path, name, follow_symlinks=False), path, restore=st)
    except OSError:
        return b""  # none (ENODATA), or trusted.* as an ordinary user


def _access[T](op: Callable[[], T], path: str, restore: os.stat_result | None = None) -> T:
    """op(); if refused, once more with u+rwx on the directory `path`; `restore`: put its mode back after."""
    try:
        return op()
    except PermissionError:
        st = restore or os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)
    try:
        return op()
    finally:
        if restore is not None:
            os.chmod(path, stat.S_IMODE(restore.st_mode))


def _open_up(path: str, st: os.stat_result) -> None:
    """Make a kept directory ours to change while it is merged into (root needs nothing)."""
    if os.geteuid() != 0 and stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


def _move(src: str, dst: str) -> None:
    """rename(2); refused, once more with u+w on both parents (and on `src` itself, a directory whose
    `..` changes), whose modes are then put back: `src`'s at its new place."""
    try:
        os.rename(src, dst)
        return
    except PermissionError:
        pass
    src_st = os.lstat(src)
    fix = [os.path.dirname(src), os.path.dirname(dst)] + ([src] if stat.S_ISDIR(src_st.st_mode) else [])
    saved: list[tuple[str, int]] = []
    for p in dict.fromkeys(fix):
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(p, mode | 0o700)
            saved.append((dst if p == src else p, mode))
    try:
        os.rename(src, dst)
    finally:
        for p, mode in saved:
            try:
                os.chmod(p, mode)
            except OSError:
                pass


def _copy_attrs(st: os.stat_result, path: str) -> None:
    """A merged directory takes the run's mode (and, for root, owner) and times."""
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
    os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def force_rmtree(path: Path) -> None:
    """rmtree that also removes what tools and overlayfs leave unwritable (0555 trees, work/work's 000).

    Raises OSError (one line, naming the path) for what even that cannot remove."""
    tried: set[str] = set()

    def onexc(func: object, p: str, exc: BaseException) -> None:
        if not isinstance(exc, PermissionError) or p in tried:
            raise exc
        tried.add(p)
        parent = os.path.dirname(p)
        if not os.path.islink(parent):
            os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | 0o700)  # to unlink from it
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) | 0o700)  # to list and empty it
            shutil.rmtree(p, onexc=onexc)
        else:
            os.unlink(p)

    shutil.rmtree(path, onexc=onexc)
