"""The audit log files: where they live by default, how long they stay, and reading several as one.

Out of the workspace, owned by whoever ran sandgate.

v1 wrote `.sandgate/audit-*.jsonl` into every workspace: never rotated, not git-ignored,
root-owned under --user. Now the default is sandgate's state directory ($XDG_STATE_HOME/sandgate/
audit, else ~/.local/state/sandgate/audit; root: /var/log/sandgate), which every sandbox is
denied, pruned by count, age and total size: at most once an hour or once every PRUNE_AFTER_RUNS
new logs, whichever comes first (a stamp file counts them), so a run's start does not scan a
directory of hundreds of logs. `--audit-log PATH` still puts one anywhere.
Reading goes through netguard.audit.read, the one reader of the format.

"The last run" is the last run of the workspace you stand in, never the newest file: runs of other
workspaces (and of the same user at the same time) write beside it. Each run's first record (the
`policy` record) names its working directory (`cwd`); `last_of_workspace` reads only that record
of each log.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from netguard import audit

KEEP_FILES = 200
KEEP_DAYS = 30
KEEP_BYTES = 256 * 1024 * 1024
# The prune's stamp: its size is 1 + the logs made since the last prune, its mtime that prune's time.
# Between two prunes the directory holds at most KEEP_FILES + PRUNE_AFTER_RUNS logs (the bound on
# disk use it protects, plus a fixed margin) and nothing older than KEEP_DAYS + an hour.
PRUNE_STAMP = ".pruned"
PRUNE_EVERY = 3600.0
PRUNE_AFTER_RUNS = 20
ROOT_DIR = Path("/var/log/sandgate")


def log_dir() -> Path:
    """The default directory: root's under /var/log, a user's in their state directory."""
    if sys.platform != "win32" and os.geteuid() == 0:  # Windows has no euid (win-py P9)
        return ROOT_DIR
    from launcher.config import userconfig

    return userconfig.state_dir() / "audit"


def new_path() -> Path:
    """A fresh log file name in the default directory (created 0700 if missing), after pruning it."""
    d = log_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    prune_if_due(d)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return d / f"audit-{stamp}-{os.urandom(3).hex()}.jsonl"


def _logs(d: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of the audit logs in `d`, newest first; nothing else there is touched."""
    out = []
    try:
        with os.scandir(d) as it:
            for e in it:
                if not (e.name.startswith("audit-") and e.name.endswith(".jsonl")) or e.is_symlink():
                    continue  # a symlink named like a log is never followed or removed
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return []
    return [(m, size, Path(p)) for m, size, p in sorted(out, reverse=True)]


def prune_if_due(d: Path, now: float | None = None) -> bool:
    """Count one more log in d's stamp; prune when PRUNE_EVERY passed or PRUNE_AFTER_RUNS logs were
    made since the last prune (or there is no stamp, or it cannot be kept: then every time, as before)."""
    now = time.time() if now is None else now
    try:
        fd = os.open(d / PRUNE_STAMP, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        prune(d, now)
        return True
    try:
        st = os.fstat(fd)
        if st.st_size == 0 or st.st_size >= PRUNE_AFTER_RUNS or not 0 <= now - st.st_mtime < PRUNE_EVERY:
            prune(d, now)
            os.ftruncate(fd, 0)
            os.write(fd, b"p")
            os.utime(fd, (now, now))
            return True
        os.write(fd, b".")
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime stays the last prune's time
        return False
    except OSError:
        return False
    finally:
        os.close(fd)


def prune(d: Path, now: float | None = None) -> list[Path]:
    """Keep the newest KEEP_FILES logs, none older than KEEP_DAYS, at most KEEP_BYTES in all."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    total = 0
    for i, (mtime, size, path) in enumerate(_logs(d)):
        total += size
        if i >= KEEP_FILES or now - mtime > KEEP_DAYS * 86400 or total > KEEP_BYTES:
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def recent(d: Path | None = None, n: int = 20) -> list[tuple[float, int, Path]]:
    return _logs(d or log_dir())[:n]


def latest(d: Path | None = None) -> Path | None:
    logs = _logs(d or log_dir())
    return logs[0][2] if logs else None


@dataclass(frozen=True)
class RunLog:
    """One run's log, as its first (`policy`) record describes the run."""

    path: Path
    cwd: str  # the run's working directory: its workspace
    task: str
    started: str  # the policy record's timestamp
    learn: bool


def run_of(path: Path) -> RunLog | None:
    """The run a log belongs to, from its first line; None for a log that does not say (older
    sandgate, `sandgate proxy`, not an audit log)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        rec = audit.parse(json.loads(first))
    except (OSError, ValueError, audit.LogError):
        return None
    if rec["event"] != "policy" or rec["cwd"] is None:
        return None
    return RunLog(path, rec["cwd"], rec["task"], rec["ts"], bool(rec["learn"]))


def same_workspace(run_cwd: str, here: str) -> bool:
    """A run belongs to the workspace `here` when it ran there, in a directory inside it, or in one
    that holds it (its writable workspace held `here`); sibling workspaces never match."""
    a, b = posixpath.normpath(run_cwd), posixpath.normpath(here)
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def last_of_workspace(here: str, d: Path | None = None) -> RunLog | None:
    """The most recently started run of the workspace `here` among the logs in `d`."""
    runs = [r for _, _, p in _logs(d or log_dir()) if (r := run_of(p)) is not None and same_workspace(r.cwd, here)]
    return max(runs, key=lambda r: (r.started, r.path.name), default=None)


def read_logs(paths: Sequence[Path | str]) -> list[audit.Record]:
    """Every record of every log, in file then line order; audit.LogError names what cannot be read.

    A torn last line is skipped (see audit.read); a missing or unreadable file is an error,
    phrased for the one-line `sandgate: error:` message.
    """
    out: list[audit.Record] = []
    for p in paths:
        path = Path(p)
        try:
            out.extend(audit.read(path))
        except FileNotFoundError:
            raise audit.LogError(f"{path}: no such audit log") from None
        except OSError as e:
            raise audit.LogError(f"{path}: cannot read: {e.strerror or e}") from None
    return out
