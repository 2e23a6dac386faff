"""The trust list: which workspace policy files the user reviewed, by the exact bytes reviewed.

Trust is recorded like direnv's: one record per file (its directory resolved, its own name kept, so a
symlinked dotfile stays keyed by where it is used) with the SHA-256 of the exact bytes that were
reviewed, so any edit revokes it. The records live in the user's state directory, never inside a
directory a sandboxed command could write. What an untrusted file may still do is
launcher/config/narrowing.py's; reading the files is launcher/config/hostilefile.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from launcher.config.hostilefile import digest
from launcher.config.userconfig import state_dir

FILE_NAME = "trusted.json"
MAX_BYTES = 4 << 20  # of the trust list: far more than any real one; bounds what a damaged file costs
Status = Literal["trusted", "changed", "unknown"]


class TrustError(Exception):
    """The trust list cannot be used as asked; one line for `sandgate: error:`."""


@dataclass(frozen=True)
class Record:
    """One trusted policy file: the content hash it was trusted with, and when."""

    sha256: str
    trusted_at: str


def status_of(records: Mapping[str, Record], key: str, data: bytes) -> Status:
    rec = records.get(key)
    if rec is None:
        return "unknown"
    return "trusted" if rec.sha256 == digest(data) else "changed"


def decode(raw: bytes) -> dict[str, Record]:
    """The records of a trust list; ValueError for anything sandgate did not write."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("files"), dict):
        raise ValueError("not a sandgate trust list")
    out: dict[str, Record] = {}
    for key, rec in doc["files"].items():
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("sha256"), str)
            and len(rec["sha256"]) == 64
            and isinstance(rec.get("trusted_at"), str)
            and key.startswith("/")
        ):
            raise ValueError("malformed record")
        out[key] = Record(rec["sha256"], rec["trusted_at"])
    return out


def encode(records: Mapping[str, Record]) -> bytes:
    files = {k: {"sha256": r.sha256, "trusted_at": r.trusted_at} for k, r in sorted(records.items())}
    return (json.dumps({"version": 1, "files": files}, indent=1) + "\n").encode()


def key(path: Path) -> str:
    """The record's name for `path`: its directory resolved (cwd is), its file name as is."""
    p = Path(os.path.abspath(path))
    return str(Path(os.path.realpath(p.parent)) / p.name)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Store:
    """The trust list of the user running sandgate."""

    def __init__(self, directory: Path, writable: tuple[Path, ...] = ()) -> None:
        self.dir = directory
        self.file = directory / FILE_NAME
        self.writable = writable  # also writable from the sandbox in this run (--write)

    @classmethod
    def default(cls, writable: tuple[Path, ...] = ()) -> Store:
        return cls(state_dir(), writable)

    def problem(self, workspaces: tuple[Path, ...]) -> str | None:
        """Why this list must not be used from these workspaces: a sandboxed command may write inside them."""
        real = os.path.realpath(self.dir)
        for ws in (*workspaces, *self.writable):
            if _under(real, os.path.realpath(ws)):
                return (
                    f"the trust list {self.file} is inside {ws}, where a sandboxed command may write; "
                    "set XDG_STATE_HOME to a directory outside it"
                )
        return None

    def records(self) -> dict[str, Record]:
        """Every record; {} when there is no list yet. TrustError when it is unsafe or damaged."""
        if sys.platform == "win32":  # no owner/mode check is honest there (st_uid 0): nothing is trusted (win-py P4)
            return {}
        try:
            fd = os.open(self.file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise TrustError(f"cannot read the trust list {self.file}: {e.strerror}; remove it") from None
        with os.fdopen(fd, "rb") as f:
            self._check_owned(os.fstat(fd), self.file)
            raw = f.read(MAX_BYTES + 1)
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError("too large")
            return decode(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise TrustError(
                f"the trust list {self.file} is damaged (not what sandgate writes); "
                "remove it and trust your files again"
            ) from None

    def status(self, path: Path, data: bytes) -> tuple[Status, str | None]:
        """(status of `path` with content `data`, why the list could not be read). Never raises: unreadable means untrusted."""
        try:
            return status_of(self.records(), key(path), data), None
        except TrustError as e:
            return "unknown", str(e)

    def add(self, files: list[tuple[Path, bytes]]) -> list[tuple[str, str]]:
        """Trust each (path, exact content read); returns (key, digest) of each."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        added = [(key(p), digest(data)) for p, data in files]

        def change(records: dict[str, Record]) -> bool:
            records.update({k: Record(d, now) for k, d in added})
            return True

        self._update(change)
        return added

    def revoke(self, path: Path) -> bool:
        """Forget `path`; False when it was not trusted."""
        k = key(path)
        return self._update(lambda records: records.pop(k, None) is not None)

    # ---- I/O details

    def _check_owned(self, st: os.stat_result, what: Path) -> None:
        """Only the user (or root) may have written what decides trust."""
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            raise TrustError(
                f"{what} is writable by others or owned by another user; "
                "sandgate will not take trust from it: remove it or fix its owner and mode"
            )
        if what == self.file and not stat.S_ISREG(st.st_mode):
            raise TrustError(f"the trust list {what} is not a regular file; remove it")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if sys.platform == "win32":  # see records(): a workspace policy there only narrows, as an untrusted one
            raise TrustError("trusting a workspace policy is not available on Windows yet; pass it with --policy")
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            self._check_owned(os.stat(self.dir), self.dir)
            fd = os.open(self.dir / "trusted.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise TrustError(f"cannot write the trust list in {self.dir}: {e.strerror}") from None
        try:
            _lock(fd)
            yield
        finally:
            os.close(fd)

    def _update(self, change: Callable[[dict[str, Record]], bool]) -> bool:
        with self._locked():
            records = self.records()
            changed = change(records)
            if changed:
                self._write(encode(records))
            return changed

    def _write(self, data: bytes) -> None:
        """Atomically: a private temporary file in the same directory, then rename over the list."""
        tmp = self.dir / f".{FILE_NAME}.{os.getpid()}.tmp"
        try:
            tmp.unlink(missing_ok=True)  # left by a killed writer with our pid; we hold the lock
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.file)
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise TrustError(f"cannot write the trust list {self.file}: {e.strerror}") from None


def _lock(fd: int) -> None:
    """One writer of the trust list at a time (two `sandgate trust` racing would lose an entry)."""
    if sys.platform == "win32":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
