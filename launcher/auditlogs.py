"""Where audit logs live by default, and how long: out of the workspace, owned by whoever ran sandgate.

v1 wrote `.sandgate/audit-*.jsonl` into every workspace: never rotated, not git-ignored,
root-owned under --user. Now the default is sandgate's state directory ($XDG_STATE_HOME/sandgate/
audit, else ~/.local/state/sandgate/audit; root: /var/log/sandgate), which every sandbox is
denied, pruned at each run by count, age and total size. `--audit-log PATH` still puts one anywhere.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

KEEP_FILES = 200
KEEP_DAYS = 30
KEEP_BYTES = 256 * 1024 * 1024
ROOT_DIR = Path("/var/log/sandgate")


def log_dir() -> Path:
    if os.geteuid() == 0:
        return ROOT_DIR
    from launcher.config import trust

    return trust.state_dir() / "audit"


def new_path() -> Path:
    """A fresh log file name in the default directory (created 0700 if missing), after pruning it."""
    d = log_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    prune(d)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return d / f"audit-{stamp}-{uuid.uuid4().hex[:6]}.jsonl"


def _logs(d: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of the audit logs in `d`, newest first; nothing else there is touched."""
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return []
    for name in names:
        if not (name.startswith("audit-") and name.endswith(".jsonl")):
            continue
        try:
            st = os.lstat(d / name)
        except OSError:
            continue
        if not os.path.islink(d / name):
            out.append((st.st_mtime, st.st_size, d / name))
    return sorted(out, reverse=True)


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
