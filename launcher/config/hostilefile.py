"""Files sandgate did not write: reading them safely, and how much of a workspace policy to believe.

A `./.sandgate.yaml` picked up implicitly comes with the checkout sandgate exists to distrust:
until the user runs `sandgate trust`, only what it forbids applies (`narrow`). Trust is recorded
like direnv's: one record per file (its directory resolved, its own name kept, so a symlinked
dotfile stays keyed by where it is used) with the SHA-256 of the exact bytes that were reviewed,
so any edit revokes it. The records live in the user's state directory, never inside a directory
a sandboxed command could write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from fsguard import policy as fspolicy
from fsguard.env import EnvPolicy
from netguard import policy as netpolicy

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


# ---- pure: records, digests, narrowing -------------------------------------------------------


try:  # CPython's own SHA-256 (HACL*): hashlib would load OpenSSL first (~4 ms on every run)
    from _sha2 import sha256 as _sha256  # CPython's private module (no stubs: see pyproject)
except ImportError:  # another interpreter
    from hashlib import sha256 as _sha256


def digest(data: bytes) -> str:
    hexed: str = _sha256(data).hexdigest()
    return hexed


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


#: What an untrusted file keeps, per section: only what forbids more. Every other field, today's
#: and any added later, is dropped, so a new way to widen is ignored until it is listed here.
KEPT = {"network": ("deny",), "filesystem": ("read_deny", "protect"), "env": ("drop",)}


def _split(section: str, value: Any) -> tuple[dict[str, Any], list[str]]:
    """(the kept fields of a section, names of the other fields that are set)."""
    default = type(value)()
    kept = {name: getattr(value, name) for name in KEPT[section]}
    dropped = [
        f"{section}.{f.name}"
        for f in dataclasses.fields(value)
        if f.compare and f.name not in kept and getattr(value, f.name) != getattr(default, f.name)
    ]
    return kept, dropped


def narrow(
    net: netpolicy.NetworkPolicy, fs: fspolicy.FsPolicy, env: EnvPolicy, has_include: bool
) -> tuple[netpolicy.NetworkPolicy, fspolicy.FsPolicy, EnvPolicy, tuple[str, ...]]:
    """What an untrusted file may do: only forbid more. Returns the kept sections and the keys ignored.

    Kept: network.deny, filesystem.read_deny, env.drop, and filesystem.protect inside the workspace
    (a missing protected path gets a placeholder created on the host: outside the workspace that
    would let the file create files anywhere sandgate may, /etc/nologin say). Ignored, because each
    can widen: allow/ask rules (and with them `inspect:`/`http:`), a resolver, credentials (a
    checked-out repository must never choose where your secret is sent), includes (allowlists, and files the checkout names),
    env.keep, filesystem.unprotect, and filesystem.write, which widens even as a subset of the
    defaults ("." alone drops the private /tmp and shows the host's).
    """
    n, ignored = _split("network", net)
    f, dropped_fs = _split("filesystem", fs)
    e, dropped_env = _split("env", env)
    inside = tuple(p for p in fs.protect if not p.startswith(("/", "~")))
    outside = ["filesystem.protect outside the workspace"] if len(inside) < len(fs.protect) else []
    f["protect"] = inside
    ignored = [*(["include"] if has_include else []), *ignored, *dropped_fs, *outside, *dropped_env]
    return (netpolicy.NetworkPolicy(**n), fspolicy.FsPolicy(**f), EnvPolicy(**e), tuple(ignored))


@dataclass(frozen=True)
class Narrowed:
    """An untrusted workspace policy as applied: what was ignored, and why it was not trusted."""

    name: str  # as the user would type it
    status: Status
    ignored: tuple[str, ...]
    store_problem: str | None = None

    def notice(self) -> str:
        """The one line printed when something was ignored."""
        why = "changed since you trusted it" if self.status == "changed" else "is not trusted"
        extra = f" (trust records not used: {self.store_problem})" if self.store_problem else ""
        return (
            f"sandgate: {self.name} {why}{extra}, so only what it forbids applies; ignored: "
            f"{', '.join(self.ignored)}; to trust it: sandgate trust {self.name}"
        )


# ---- reading a file that may be hostile ------------------------------------------------------


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
        with os.fdopen(fd, "rb") as f:
            again = os.fstat(fd)
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(again.st_mode):
                raise Unreadable("it was replaced while being opened; try again")
            data = f.read(limit + 1)
    except OSError as e:
        raise Unreadable(f"cannot read: {e.strerror}") from None
    finally:
        os.close(pfd)
    if len(data) != st.st_size:  # a pseudo-file (its size is made up), or one being written right now
        raise Unreadable("it does not read as long as its size says (a pseudo-file, or being written?); try again")
    return data


# ---- the store -------------------------------------------------------------------------------


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_STATE_HOME/sandgate, else ~/.local/state/sandgate (a relative XDG value is ignored, as the spec says)."""
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".local" / "state"
    return base / "sandgate"


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
