"""The egress audit log: one JSON object per line, appended and flushed as it happens.

The schema lives here and nowhere else: the record types (netguard.auditrecords, re-exported
here) are the format (docs/audit.md's table is checked against them). Six events:
  decision  one per allow/deny decision (exactly one; tests count them)
  close     when an allowed connection or request ends: bytes and duration
  request   one per request to an inspected destination (and per attempted credential leak)
  approval  a question to a human, and its answer
  policy    once per run: the effective filesystem/process boundary (names, never values)
  limit     what a per-sandbox limit of the shared daemon refused (aggregated: a count per second)
Every record carries `schema` (SCHEMA); logs written before the field existed read as schema 1.

Writes are single `write()` calls on an O_APPEND descriptor so several writers
(one proxy serving several sandboxes, the launcher) interleave whole lines, and
a crash loses nothing that was already decided. `read` is the one reader: it checks
every record against its type, so what comes out is what the types say.
"""

from __future__ import annotations

import json
import os
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, Union, cast, get_args, get_origin, get_type_hints

from netguard.auditrecords import (
    CLOSE_FIELDS,
    DECISION_FIELDS,
    RECORD_TYPES,
    SCHEMA,
    ApprovalRecord,
    CloseRecord,
    DecisionRecord,
    Event,
    Kind,
    Limit,
    LimitRecord,
    PolicyRecord,
    Record,
    RequestRecord,
)

#: The format's names are part of this module's interface (one import for writers and readers).
__all__ = [
    "CLOSE_FIELDS",
    "DECISION_FIELDS",
    "RECORD_TYPES",
    "SCHEMA",
    "ApprovalRecord",
    "CloseRecord",
    "DecisionRecord",
    "Event",
    "Kind",
    "Limit",
    "LimitRecord",
    "PolicyRecord",
    "Record",
    "RequestRecord",
]


_SECOND: tuple[int, str] = (-1, "")  # the last whole second and its text: one record per connection needs it fast


def now_rfc3339() -> str:
    """UTC with milliseconds and a Z, so logs from different machines sort and compare as text.

    The date and time of day are formatted once per second (datetime formatting was ~13 us of every
    connection's decision); one tuple, swapped whole, so a second thread never sees half of it."""
    global _SECOND
    t = time.time()
    sec = int(t)
    cached = _SECOND
    if cached[0] != sec:
        cached = _SECOND = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return f"{cached[1]}.{int((t - sec) * 1000):03d}Z"


def new_id() -> str:
    """A record's id: 48 random bits in 12 hex digits (what uuid4().hex[:12] gave, without building a UUID)."""
    return os.urandom(6).hex()


# ---- the writer -------------------------------------------------------------------------------


_ACTIONS: Final[Mapping[str, Literal["allow", "deny"]]] = {"allow": "allow", "deny": "deny"}
_WOULD: Final[Mapping[str | None, Literal["deny"] | None]] = {"deny": "deny", None: None}


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
) -> DecisionRecord:
    """`action` "allow"/"deny", `would` "deny" or None; anything else is a bug and raises KeyError here."""
    return DecisionRecord(
        ts=now_rfc3339(),
        task=task,
        event="decision",
        id=id,
        kind=kind,
        action=_ACTIONS[action],
        would=_WOULD[would],
        host=host,
        port=port,
        ip=ip,
        proto=proto,
        method=method,
        url=url,
        qtype=qtype,
        rule=rule,
        reason=reason,
        schema=SCHEMA,
    )


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
) -> CloseRecord:
    return CloseRecord(
        ts=now_rfc3339(),
        task=task,
        event="close",
        id=id,
        kind=kind,
        host=host,
        port=port,
        ip=ip,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        duration_ms=duration_ms,
        schema=SCHEMA,
    )


def request_record(
    task: str,
    id: str,
    kind: Kind,
    action: str,
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    status: int | None,
    bytes_up: int = 0,
    bytes_down: int = 0,
    duration_ms: int = 0,
    rule: str | None = None,
    reason: str = "",
    leak: str | None = None,
) -> RequestRecord:
    """`action` "allow"/"deny"; the caller has already cut the query and redacted every secret."""
    return RequestRecord(
        ts=now_rfc3339(),
        task=task,
        event="request",
        id=id,
        kind=kind,
        action=_ACTIONS[action],
        host=host,
        port=port,
        method=method,
        path=path,
        status=status,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        duration_ms=duration_ms,
        rule=rule,
        reason=reason,
        leak=leak,
        schema=SCHEMA,
    )


def approval_record(
    task: str,
    *,
    id: str,
    stage: Literal["question", "answer"],
    host: str,
    port: int,
    asked_by: str | None,
    answer: str | None = None,
    by: str | None = None,
) -> ApprovalRecord:
    """A question to a human (stage "question") or its answer (stage "answer", `by` terminal/socket/timeout)."""
    return ApprovalRecord(
        ts=now_rfc3339(),
        task=task,
        event="approval",
        kind="approval",
        id=id,
        stage=stage,
        host=host,
        port=port,
        asked_by=asked_by,
        answer=answer,
        by=by,
        schema=SCHEMA,
    )


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
    cwd: str | None = None,
    learn: bool | None = None,
) -> PolicyRecord:
    return PolicyRecord(
        ts=now_rfc3339(),
        task=task,
        event="policy",
        kind="policy",
        write=write,
        private_tmp=private_tmp,
        protect=protect,
        hidden=hidden,
        env_dropped=env_dropped,
        landlock_abi=landlock_abi,
        warnings=warnings,
        cwd=cwd,
        learn=learn,
        schema=SCHEMA,
    )


def limit_record(task: str, kind: Kind, limit: Limit, count: int, reason: str) -> LimitRecord:
    return LimitRecord(
        ts=now_rfc3339(), task=task, event="limit", kind=kind, limit=limit, count=count, reason=reason, schema=SCHEMA
    )


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
            # Windows (the proxy child's log): no O_CLOEXEC (os.open's fds are non-inheritable anyway, PEP 446),
            # and O_BINARY, else the CRT writes each "\n" as "\r\n" (issue 28, win-py P6).
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
            self._fd = os.open(path, flags, 0o644)

    @classmethod
    def from_fd(cls, fd: int) -> AuditLog:
        """Wrap an O_APPEND descriptor opened by someone else (the launcher hands its run's log to the
        daemon, which never opens paths for a sandbox); close() closes it."""
        log = cls(None)
        log._fd = fd
        return log

    def write(self, record: Record) -> None:
        if record["event"] == "decision":
            self.counts[record["action"]] = self.counts.get(record["action"], 0) + 1
        if self._fd is None:
            return
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        os.write(self._fd, line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- the reader -------------------------------------------------------------------------------


class LogError(ValueError):
    """A log that cannot be read as one: `FILE:LINE: why` (one line: it ends up in `sandgate: error:`)."""


def read(path: Path) -> Iterator[Record]:
    """The records of one log, in line order, each checked against its type.

    The last line may be cut short or garbage (writer killed mid-write, NUL padding after a
    crash): skipped silently. Anything invalid before it means the file is not an audit log
    (or was tampered with): LogError naming FILE:LINE. Blank lines carry nothing. OSError
    (missing, unreadable) propagates for the caller to phrase.
    """
    pending: int | None = None  # the line number of an unparsable line, fatal unless it is the last
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if pending is not None:
                raise LogError(f"{path}:{pending}: not a JSON record")
            value = _json_object(line)
            if value is None:
                pending = lineno
                continue
            try:
                yield parse(value)
            except LogError as e:
                raise LogError(f"{path}:{lineno}: {e}") from None


def read_records(path: Path) -> list[Record]:
    """All of `read(path)` at once, for callers that look at the records more than once."""
    return list(read(path))


def _json_object(line: bytes) -> dict[str, Any] | None:
    # A complete object without its newline is kept: no proper prefix of a JSON object is itself one.
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def parse(value: Mapping[str, Any]) -> Record:
    """One decoded JSON object as its typed record; LogError says which field does not fit.

    A missing field that may be null reads as null (schema-1 logs had no `would`), a missing
    `schema` as 1, a null `reason` as ""; unknown fields are dropped, so a record holds exactly
    what its type declares.
    """
    event = value.get("event")
    fields = _FIELD_TYPES.get(event) if isinstance(event, str) else None
    if fields is None:
        raise LogError(f"not an audit record (event {_short(event)})")
    schema = value.get("schema", 1)
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA:
        raise LogError(f"written by a newer sandgate (schema {schema}; this one reads up to {SCHEMA})")
    out: dict[str, Any] = {}
    for name, hint in fields.items():
        field = value.get(name, 1 if name == "schema" else None)
        if field is None and name == "reason":
            field = ""
        if not _fits(field, hint):
            what = f"is {_short(field)}" if name in value else "is missing"
            raise LogError(f"not an audit record ({event} field {name!r} {what})")
        out[name] = field
    return cast("Record", out)  # checked field by field against its type just above


#: Each event's fields and their types, resolved once (the annotations are strings until then).
_FIELD_TYPES: Final[Mapping[str, dict[str, Any]]] = {e: get_type_hints(t) for e, t in RECORD_TYPES.items()}


def _fits(value: Any, hint: Any) -> bool:
    """Does a JSON value fit a record field's type (str, int, bool, None, Literal, unions, list[...])?"""
    origin = get_origin(hint)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in get_args(hint))
    if origin is Union or origin is types.UnionType:
        return any(_fits(value, a) for a in get_args(hint))
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a port
    return isinstance(value, hint)


def _short(value: Any) -> str:
    """A logged value in an error message: JSON, cut short, one line whatever the log held."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."
