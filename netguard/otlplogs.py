"""Audit records as OTLP log records, and a batch of them as an OTLP/HTTP request body (protobuf or JSON).

One log record per audit record: its time is the record's `ts`, its body a short sentence, its
event name `sandgate.<event>`, its severity WARN for what was refused (a denial, a would-deny of a
learn run, a limit), ERROR for an attempted credential leak, INFO otherwise. Attributes follow the
semantic conventions where one fits (server.address, server.port, network.peer.address: the address
the daemon checked and connected to, http.request.method, url.path, http.response.status_code,
dns.question.name) and are `sandgate.<field>` for the rest (action, rule, reason, task, kind, ...).

The protobuf is encoded here by hand: five messages of opentelemetry-proto's logs service, each
field written by number (see the table in `_log_record`); the tests decode it with the official
opentelemetry-proto classes. That keeps protobuf (a native extension) out of the daemon. Pure.
"""

from __future__ import annotations

import datetime
import gzip
import json
import struct
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from netguard.auditrecords import SCHEMA, Record
from netguard.otlp import OtlpConfig

Value = str | int | bool | tuple[str, ...]
SCOPE: Final = ("sandgate.audit", str(SCHEMA))  # instrumentation scope: the audit log's format and its version
INFO, WARN, ERROR = 9, 13, 17  # opentelemetry.proto.logs.v1.SeverityNumber
_TEXT: Final = {INFO: "INFO", WARN: "WARN", ERROR: "ERROR"}
#: Record fields named by a semantic convention (the rest become sandgate.<field>).
_SEMCONV: Final = {
    "host": "server.address",
    "port": "server.port",
    "ip": "network.peer.address",
    "method": "http.request.method",
    "path": "url.path",
    "status": "http.response.status_code",
}
_SKIP: Final = frozenset({"ts", "schema"})


@dataclass(frozen=True)
class LogEntry:
    """One OTLP log record, before encoding."""

    time_ns: int
    severity: int
    body: str
    event_name: str
    attributes: tuple[tuple[str, Value], ...]


def entry(record: Record) -> LogEntry:
    """The log record for one audit record."""
    r: Mapping[str, Any] = record
    return LogEntry(_time_ns(r["ts"]), _severity(r), _body(r), f"sandgate.{r['event']}", _attributes(r))


def _time_ns(ts: str) -> int:
    """RFC 3339 with milliseconds and Z (netguard.audit.now_rfc3339) as Unix nanoseconds; 0 if unreadable."""
    try:
        when = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return 0  # the spec: 0 means unknown, and observed_time_unix_nano still says when
    whole = int(when.replace(microsecond=0).timestamp())
    return whole * 1_000_000_000 + when.microsecond * 1000


def _severity(r: Mapping[str, Any]) -> int:
    if r.get("leak"):
        return ERROR
    if r.get("action") == "deny" or r.get("would") == "deny" or r["event"] == "limit":
        return WARN
    return INFO


def _body(r: Mapping[str, Any]) -> str:
    event = r["event"]
    where = r.get("host") or ""
    if r.get("port") is not None:
        where = f"{where}:{r['port']}"
    if event == "decision":
        what = f"{r['method']} {r['url']}" if r.get("url") else where
        why = f" ({r['reason']})" if r.get("reason") else ""
        learn = " (learn: the policy would deny)" if r.get("would") else ""
        return f"{r['action']} {r['kind']} {what}{learn}{why}"
    if event == "request":
        return f"{r['action']} {r['method']} {where}{r['path']} -> {r['status']}"
    if event == "close":
        return f"closed {r['kind']} {where}: {r['bytes_up']} bytes up, {r['bytes_down']} down, {r['duration_ms']} ms"
    if event == "approval":
        answer = f": {r['answer']}" if r.get("answer") else ""
        return f"approval {r['stage']} for {where}{answer}"
    if event == "limit":
        return f"{r['count']} refused by the {r['limit']} limit: {r['reason']}"
    return "the run's filesystem and process boundary"  # policy


def _attributes(r: Mapping[str, Any]) -> tuple[tuple[str, Value], ...]:
    out: list[tuple[str, Value]] = []
    for name, value in r.items():
        if name in _SKIP or value is None or value == "":
            continue
        if name == "host" and r.get("kind") == "dns":
            out.append(("dns.question.name", value))  # a DNS question names no server
        elif name == "url":
            out.append(("url.path", urllib.parse.urlsplit(value).path or "/"))  # never the query
        elif isinstance(value, list):
            out.append((f"sandgate.{name}", tuple(str(v) for v in value)))
        else:
            out.append((_SEMCONV.get(name, f"sandgate.{name}"), value))
    return tuple(out)


# ---- the request body -----------------------------------------------------------------------


def content_type(cfg: OtlpConfig) -> str:
    return "application/json" if cfg.protocol == "http/json" else "application/x-protobuf"


def request_body(cfg: OtlpConfig, entries: Sequence[LogEntry], observed_ns: int) -> bytes:
    """One ExportLogsServiceRequest holding `entries`, gzipped if the config says so."""
    if cfg.protocol == "http/json":
        data = encode_json(cfg.resource, entries, observed_ns)
    else:
        data = encode_protobuf(cfg.resource, entries, observed_ns)
    return gzip.compress(data, 6) if cfg.compression == "gzip" else data


def encode_json(resource: Iterable[tuple[str, str]], entries: Sequence[LogEntry], observed_ns: int) -> bytes:
    """OTLP/JSON: the protobuf JSON mapping (camelCase, 64-bit integers as strings, enums as numbers)."""
    records = [
        {
            "timeUnixNano": str(e.time_ns),
            "observedTimeUnixNano": str(observed_ns),
            "severityNumber": e.severity,
            "severityText": _TEXT[e.severity],
            "body": {"stringValue": e.body},
            "attributes": [{"key": k, "value": _json_value(v)} for k, v in e.attributes],
            "eventName": e.event_name,
        }
        for e in entries
    ]
    scope = {"scope": {"name": SCOPE[0], "version": SCOPE[1]}, "logRecords": records}
    attrs = [{"key": k, "value": {"stringValue": v}} for k, v in resource]
    body = {"resourceLogs": [{"resource": {"attributes": attrs}, "scopeLogs": [scope]}]}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace")


def _json_value(v: Value) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, tuple):
        return {"arrayValue": {"values": [{"stringValue": s} for s in v]}}
    return {"stringValue": v}


def encode_protobuf(resource: Iterable[tuple[str, str]], entries: Sequence[LogEntry], observed_ns: int) -> bytes:
    """OTLP/protobuf: ExportLogsServiceRequest{resource_logs=1: ResourceLogs{resource=1, scope_logs=2}}."""
    res = b"".join(_len(1, _key_value(k, v)) for k, v in resource)  # Resource.attributes = 1
    scope = _string(1, SCOPE[0]) + _string(2, SCOPE[1])  # InstrumentationScope.name = 1, version = 2
    logs = _len(1, scope) + b"".join(_len(2, _log_record(e, observed_ns)) for e in entries)  # ScopeLogs
    return _len(1, _len(1, res) + _len(2, logs))


def _log_record(e: LogEntry, observed_ns: int) -> bytes:
    """LogRecord: time_unix_nano=1 (fixed64), severity_number=2, severity_text=3, body=5, attributes=6,
    observed_time_unix_nano=11 (fixed64), event_name=12."""
    return b"".join(
        (
            _tag(1, 1) + struct.pack("<Q", e.time_ns),
            _tag(2, 0) + _varint(e.severity),
            _string(3, _TEXT[e.severity]),
            _len(5, _any_value(e.body)),
            *(_len(6, _key_value(k, v)) for k, v in e.attributes),
            _tag(11, 1) + struct.pack("<Q", observed_ns),
            _string(12, e.event_name),
        )
    )


def _key_value(key: str, value: Value) -> bytes:
    return _string(1, key) + _len(2, _any_value(value))  # KeyValue.key = 1, value = 2


def _any_value(v: Value) -> bytes:
    """AnyValue: string_value=1, bool_value=2, int_value=3, array_value=5 (ArrayValue.values=1). A oneof:
    every value is written, false and 0 too."""
    if isinstance(v, bool):
        return _tag(2, 0) + _varint(int(v))
    if isinstance(v, int):
        return _tag(3, 0) + _varint(v & 0xFFFF_FFFF_FFFF_FFFF)  # int64: two's complement in ten bytes
    if isinstance(v, tuple):
        return _len(5, b"".join(_len(1, _any_value(s)) for s in v))
    return _string(1, v)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    return _len(number, text.encode("utf-8", "replace"))  # proto3 strings must be UTF-8: never raise here


# ---- the answer -----------------------------------------------------------------------------


def rejected(cfg: OtlpConfig, data: bytes) -> int:
    """How many records a successful answer says it rejected (partial_success); 0 if it says nothing readable."""
    if cfg.protocol == "http/json":
        try:
            partial = json.loads(data).get("partialSuccess") or {}
            return max(0, int(partial.get("rejectedLogRecords") or 0))
        except (ValueError, AttributeError, TypeError):
            return 0
    # ExportLogsServiceResponse{partial_success=1: ExportLogsPartialSuccess{rejected_log_records=1}}
    partial = _field(data, 1, 2)
    value = _field(partial, 1, 0) if isinstance(partial, bytes) else None
    return value if isinstance(value, int) and 0 < value < 1 << 62 else 0


def _field(data: bytes, number: int, wire_type: int) -> bytes | int | None:
    """The last value of field `number` in a message; None if absent or the message is malformed."""
    found: bytes | int | None = None
    i = 0
    try:
        while i < len(data):
            key, i = _read_varint(data, i)
            if key & 7 == 0:
                value, i = _read_varint(data, i)
                got: bytes | int = value
            elif key & 7 == 2:
                size, i = _read_varint(data, i)
                got, i = data[i : i + size], i + size
            elif key & 7 in (1, 5):
                got, i = 0, i + (8 if key & 7 == 1 else 4)
            else:
                return None
            if key >> 3 == number and key & 7 == wire_type:
                found = got
    except IndexError:
        return None
    return found if i == len(data) else None


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80 or shift > 63:
            return n, i
