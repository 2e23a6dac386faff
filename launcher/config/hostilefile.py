"""Files sandgate did not write (policy files, their includes, hosts lists): read safely, and known by
the SHA-256 of the exact bytes read (what the trust list records and the parse cache is keyed by).

The threat: a checkout's file that is really a FIFO (a read that never returns), a device, a /proc
file or a huge file, swapped while it is opened. Nothing here quotes what it refused.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path

try:  # CPython's own SHA-256 (HACL*): hashlib would load OpenSSL first (~4 ms on every run)
    from _sha2 import sha256 as _sha256  # CPython's private module (no stubs: see pyproject)
except ImportError:  # another interpreter
    from hashlib import sha256 as _sha256


def digest(data: bytes) -> str:
    hexed: str = _sha256(data).hexdigest()
    return hexed


class Unreadable(Exception):
    """Why a path was not read at all; quotes nothing from it."""


@functools.cache
def _pseudo_devices() -> frozenset[int]:
    return frozenset(os.stat(p).st_dev for p in ("/proc", "/sys") if os.path.isdir(p))


def _check_regular(st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next(
            (
                k
                for test, k in (
                    (stat.S_ISDIR, "a directory"),
                    (stat.S_ISFIFO, "a FIFO"),
                    (stat.S_ISCHR, "a device"),
                    (stat.S_ISBLK, "a device"),
                    (stat.S_ISSOCK, "a socket"),
                )
                if test(st.st_mode)
            ),
            "not a file",
        )
        raise Unreadable(f"not a regular file ({kind}); a policy is a YAML file")
    if st.st_size > limit:
        raise Unreadable(f"larger than {limit >> 20} MiB; a policy is a few kilobytes of YAML")
    if st.st_dev in _pseudo_devices():
        raise Unreadable("a /proc or /sys file, not a policy")


def read_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; Unreadable for anything else.

    Symlinks are followed (dotfiles are often links), but the target must be a regular file. It is
    first opened O_PATH, which does no I/O: a FIFO, a device or a directory is never really opened,
    so it can neither block nor act. Then that same inode is reopened through /proc/self/fd.
    """
    if sys.platform == "win32":
        return _read_windows(path, limit)
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Unreadable("no such file; check the path given with --policy or include:") from None
    except OSError as e:
        raise Unreadable(f"cannot open: {e.strerror}") from None
    try:
        st = os.fstat(pfd)
        _check_regular(st, limit)
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
        try:
            fd = os.open(f"/proc/self/fd/{pfd}", flags)
        except FileNotFoundError:  # no /proc: reopen by name, and make sure it is the same file
            fd = os.open(path, flags)
        data = _read_same(fd, st, limit)
    except OSError as e:
        raise Unreadable(f"cannot read: {e.strerror}") from None
    finally:
        os.close(pfd)
    if len(data) != st.st_size:  # a pseudo-file (its size is made up), or one being written right now
        raise Unreadable("it does not read as long as its size says (a pseudo-file, or being written?); try again")
    return data


def _read_same(fd: int, st: os.stat_result, limit: int) -> bytes:
    """At most limit + 1 bytes of `fd` (closed after), which must still be the regular file `st` described."""
    with os.fdopen(fd, "rb") as f:
        again = os.fstat(fd)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(again.st_mode):
            raise Unreadable("it was replaced while being opened; try again")
        return f.read(limit + 1)


def _read_windows(path: Path, limit: int) -> bytes:
    """read_file on Windows, which has no O_PATH, O_NOCTTY, O_NONBLOCK nor O_CLOEXEC (win-py P3): the path's
    kind checked by stat first (no FIFOs there; a device such as CON is refused unopened), then the same
    file (volume and file index) opened in binary mode: without O_BINARY the CRT translates CRLF, and a
    policy checked out with CRLF endings would read shorter than its size."""
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOINHERIT", 0)
    try:
        st = os.stat(path)
        _check_regular(st, limit)
        data = _read_same(os.open(path, flags), st, limit)
    except FileNotFoundError:
        raise Unreadable("no such file; check the path given with --policy or include:") from None
    except OSError as e:
        raise Unreadable(f"cannot read: {e.strerror}") from None
    if len(data) != st.st_size:
        raise Unreadable("it does not read as long as its size says (being written?); try again")
    return data
