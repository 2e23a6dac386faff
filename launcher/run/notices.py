"""`sandgate run --notices`: the run's denials as JSON lines the sandboxed command itself can read.

Why: an agent whose request was refused saw only a 403 or a reset, and retried blindly; told
"pypi.org:443 was denied, `--allow pypi` would allow it", it can explain or ask instead.

The channel is a file: the launcher appends one JSON line per distinct denial to `notices.jsonl`
in the run directory (hidden inside, like all of sandgate's state), and the sandbox sees that
file bound read-only at INSIDE (a mount point in the sandbox's own /dev), named by
`SANDGATE_NOTICES`. A file, not a FIFO or an inherited fd: any number of readers, `tail -f`
works, nothing is lost when nobody reads, and the launcher never blocks on a slow reader.
The threat it answers: a command forging or truncating its own notices (to make a later reader,
a human or the agent's own supervisor, believe something else was refused). The bind is
read-only, so write, truncate, chmod and unlink fail with EROFS or EBUSY from inside, whoever
the command is; the launcher appends through its own descriptor outside.

The lines come from the live-denials follower (launcher/run/livedenials.py), which already
reads this run's own records (by task id) from the audit log: no second follower. `notice` and
`encode` are pure; `Writer` and `share` do the file's I/O.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import RunError

if TYPE_CHECKING:
    from netguard.audit import Record

ENV = "SANDGATE_NOTICES"  # the variable the command finds the file by
INSIDE = "/dev/sandgate-notices"  # where the sandbox sees it: /dev is the sandbox's own tmpfs
FILE = "notices.jsonl"  # in the run directory
VERSION = 1  # `v` of every line; raised only when a field changes meaning
MAX_LINES = 1000  # distinct denials written per run; then one `limit` line (a run cannot fill the disk)
#: Every line has exactly these keys, in this order (docs/notices.md is the schema).
FIELDS = (
    "v", "ts", "task", "kind", "host", "port", "proto", "method", "path",
    "reason", "allow", "advice", "rule", "leak", "message",
)  # fmt: skip
_FLAG = re.compile(r"^allow it with (--allow \S+)")


def notice(record: Record, advice: str, message: str) -> dict[str, Any] | None:
    """The notice for one denial record (pure): what was refused, why, and the flag that would allow it;
    None for a record that is no denial.

    `advice` is the exit summary's words for it (launcher.audit.denials.advice; "" for a request),
    `message` the line the terminal shows."""
    out: dict[str, Any] = dict.fromkeys(FIELDS)
    if record["event"] == "request" and record["action"] == "deny":
        kind = "leak" if record["leak"] is not None else "request"
        out.update(method=record["method"], path=record["path"], rule=record["rule"], leak=record["leak"])
    elif record["event"] == "decision" and record["action"] == "deny":
        kind = {"dns": "dns", "packet": "packet"}.get(record["kind"], "destination")
        out.update(proto=record["proto"])
    else:
        return None
    found = _FLAG.match(advice)
    out.update(
        v=VERSION,
        ts=record["ts"],
        task=record["task"],
        kind=kind,
        host=record["host"],
        port=record["port"],
        reason=record["reason"],
        allow=found.group(1) if found else None,
        advice=advice or record["reason"],
        message=message,
    )
    return out


def limit(task: str, ts: str) -> dict[str, Any]:
    """The last line of a run that was refused more than MAX_LINES distinct things (pure)."""
    out: dict[str, Any] = dict.fromkeys(FIELDS)
    reason = f"{MAX_LINES} notices written; later denials are in the audit log only (sandgate audit summary)"
    out.update(v=VERSION, ts=ts, task=task, kind="limit", reason=reason, advice=reason, message=f"sandgate: {reason}")
    return out


def encode(obj: Mapping[str, Any]) -> bytes:
    """One line: compact JSON, ASCII only (a logged name's control characters arrive escaped)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


# ---- effects: the file ----------------------------------------------------------------------------


def share(run_dir: Path, env: dict[str, str]) -> tuple[str, Path]:
    """Create the run's empty notices file and name it in the command's environment; returns the
    (inside path, run-dir file) bind for the sandbox's mounts."""
    path = run_dir / FILE
    try:  # O_EXCL | O_NOFOLLOW: a fresh file of ours in our own 0700 directory, never one planted there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RunError(f"cannot create the notices file {path}: {e.strerror}; run without --notices") from None
    try:
        os.fchmod(fd, 0o644)  # readable by the command's user whatever the umask; read-only inside by the bind
    finally:
        os.close(fd)
    env[ENV] = INSIDE
    return INSIDE, path


class Writer:
    """Appends one line per distinct denial to the run's notices file (at most MAX_LINES, then one
    `limit` line). Every distinct destination, lookup, packet or request shape once, at once: not
    rate-limited like the terminal's lines, which a human reads; an agent wants each one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.seen: set[tuple[str, ...]] = set()
        self.written = 0
        self.broken = False  # a failed write (the file gone, a full disk): the run goes on without notices

    def add(self, key: tuple[str, ...], record: Record, advice: Callable[[Record], str], message: str) -> None:
        """One denial, by the key the terminal dedups on; a key already written is skipped."""
        if key in self.seen or self.broken or self.written > MAX_LINES:
            return
        line = notice(record, advice(record), message)
        if line is None:
            return
        self.seen.add(key)
        self.written += 1
        self._append(encode(line if self.written <= MAX_LINES else limit(line["task"], line["ts"])))

    def _append(self, data: bytes) -> None:
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            os.write(self.fd, data)  # one write per line: a reader never sees half of one
        except OSError:
            self.broken = True

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
