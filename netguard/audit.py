"""The egress audit log: one JSON object per line, appended and flushed as it happens.

The schema lives here and nowhere else. Three events:
  decision  one per allow/deny decision (exactly one; tests count them)
  close     when an allowed connection or request ends: bytes and duration
  policy    once per run: the effective filesystem/process boundary (names, never values)
Writes are single `write()` calls on an O_APPEND descriptor so several writers
(one proxy serving several sandboxes, the launcher) interleave whole lines, and
a crash loses nothing that was already decided.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Kind = Literal["connect", "http", "tls", "tcp", "dns", "packet", "policy"]

DECISION_FIELDS = (
    "ts",
    "task",
    "event",
    "id",
    "kind",
    "action",
    "would",
    "host",
    "port",
    "ip",
    "proto",
    "method",
    "url",
    "qtype",
    "rule",
    "reason",
)
CLOSE_FIELDS = ("ts", "task", "event", "id", "kind", "host", "port", "ip", "bytes_up", "bytes_down", "duration_ms")


def now_rfc3339() -> str:
    """UTC with milliseconds and a Z, so logs from different machines sort and compare as text."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def decision_record(
    task: str,
    id: str,
    kind: Kind,
    action: str,
    host: str | None,
    port: int | None,
    *,
    ip: str | None = None,
    proto: str | None = None,
    method: str | None = None,
    url: str | None = None,
    qtype: str | None = None,
    rule: str | None = None,
    reason: str = "",
    would: str | None = None,
) -> dict[str, Any]:
    record = {
        "ts": now_rfc3339(),
        "task": task,
        "event": "decision",
        "id": id,
        "kind": kind,
        "action": action,
        "would": would,
        "host": host,
        "port": port,
        "ip": ip,
        "proto": proto,
        "method": method,
        "url": url,
        "qtype": qtype,
        "rule": rule,
        "reason": reason,
    }
    return record


def close_record(
    task: str,
    id: str,
    kind: Kind,
    host: str | None,
    port: int | None,
    ip: str | None,
    bytes_up: int,
    bytes_down: int,
    duration_ms: int,
) -> dict[str, Any]:
    return {
        "ts": now_rfc3339(),
        "task": task,
        "event": "close",
        "id": id,
        "kind": kind,
        "host": host,
        "port": port,
        "ip": ip,
        "bytes_up": bytes_up,
        "bytes_down": bytes_down,
        "duration_ms": duration_ms,
    }


def approval_record(
    task: str,
    *,
    id: str,
    stage: str,
    host: str,
    port: int,
    asked_by: str | None,
    answer: str | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """A question to a human (stage "question") or its answer (stage "answer", `by` terminal/socket/timeout)."""
    return {
        "ts": now_rfc3339(),
        "task": task,
        "event": "approval",
        "kind": "approval",
        "id": id,
        "stage": stage,
        "host": host,
        "port": port,
        "asked_by": asked_by,
        "answer": answer,
        "by": by,
    }


def policy_record(
    task: str,
    *,
    write: list[str],
    private_tmp: bool,
    protect: list[str],
    hidden: list[str],
    env_dropped: list[str],
    landlock_abi: int,
    warnings: list[str],
) -> dict[str, Any]:
    return {
        "ts": now_rfc3339(),
        "task": task,
        "event": "policy",
        "kind": "policy",
        "write": write,
        "private_tmp": private_tmp,
        "protect": protect,
        "hidden": hidden,
        "env_dropped": env_dropped,
        "landlock_abi": landlock_abi,
        "warnings": warnings,
    }


class AuditLog:
    """Append-only JSON-lines sink; `None` path keeps records in memory only (for `sandgate proxy` without a log)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.counts: dict[str, int] = {"allow": 0, "deny": 0}
        self._fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # 0644 and owned by whoever runs sandgate (root for `run`): the user may read it, the
            # sandboxed task (running as the user) cannot rewrite its own record.
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @classmethod
    def from_fd(cls, fd: int) -> AuditLog:
        """Wrap an O_APPEND descriptor opened by someone else (the launcher hands its run's log to the
        daemon, which never opens paths for a sandbox); close() closes it."""
        log = cls(None)
        log._fd = fd
        return log

    def write(self, record: dict[str, Any]) -> None:
        if record.get("event") == "decision":
            self.counts[record["action"]] = self.counts.get(record["action"], 0) + 1
        if self._fd is None:
            return
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        os.write(self._fd, line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of a log; a truncated last line (writer killed mid-write) is skipped, not an error."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            out.append(json.loads(line))
    return out
