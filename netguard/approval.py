"""The approval protocol, defined once for both of its hops.

A question about an `ask` destination travels daemon -> launcher (the broker, over a root-only
socket in sandgate's run directory) and, when an embedding tool answers instead of the terminal,
launcher -> tool (over `--approvals unix:PATH`). Both hops speak the same two messages, one JSON
object per line:

  {"type": "request", "id", "host", "port", "kind", "reason", "peer", "asked_by", "timeout"}
  {"type": "decision", "id", "decision"}

The daemon fills `peer` (the asking socket's address inside the sandbox); the broker adds
`asked_by` (the process that owns it) and `timeout` before a tool sees the request. Pure: no I/O,
so both netguard (which never imports launcher) and launcher use it.
Whatever arrives is checked before it is believed: `decode` refuses anything malformed with a
ProtocolError, and both readers treat a refusal as "no answer" (fail closed).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, cast

__all__ = [
    "ANSWERS",
    "CHOICES",
    "Answer",
    "By",
    "Choice",
    "Decision",
    "Message",
    "ProtocolError",
    "Request",
    "choice",
    "decode",
    "encode",
]

Answer = Literal["once", "run", "always", "deny", "timeout"]
ANSWERS: frozenset[str] = frozenset({"once", "run", "always", "deny", "timeout"})
#: What a human or a tool may choose; "timeout" is only ever the broker's own verdict.
Choice = Literal["once", "run", "always", "deny"]
CHOICES: frozenset[str] = frozenset({"once", "run", "always", "deny"})
#: Who gave an answer, for the audit log's approval records (`by`). Not on the wire.
By = Literal["terminal", "socket", "timeout", "no-terminal"]

# Bounds on what a peer may send: a flood of huge fields must not grow the broker's memory.
MAX_LINE = 64 * 1024
_MAX_ID = 64
_MAX_TEXT = 4096


class ProtocolError(ValueError):
    """A line that is not a valid message. `id` is the question it named, when that much was readable,
    so a reader can deny that question at once instead of letting it wait for its timeout."""

    def __init__(self, why: str, id: str | None = None) -> None:
        super().__init__(why)
        self.id = id


@dataclass(frozen=True)
class Request:
    """A question: may the sandbox reach host:port? `kind` is how it asked (connect, tls, http, tcp)."""

    id: str
    host: str
    port: int
    kind: str
    reason: str = ""
    peer: tuple[str, int] | None = None  # the asking socket's (ip, port) in the sandbox's netns
    asked_by: str | None = None  # "curl[1234]": the process holding that socket, when it was found
    timeout: float | None = None  # seconds the broker waits before answering "timeout"


@dataclass(frozen=True)
class Decision:
    """The answer to the request with the same id."""

    id: str
    decision: Answer


Message = Request | Decision


def encode(msg: Message) -> bytes:
    """One message as one JSON line."""
    if isinstance(msg, Request):
        obj: dict[str, object] = {
            "type": "request",
            "id": msg.id,
            "host": msg.host,
            "port": msg.port,
            "kind": msg.kind,
            "reason": msg.reason,
            "peer": list(msg.peer) if msg.peer is not None else None,
            "asked_by": msg.asked_by,
            "timeout": msg.timeout,
        }
    else:
        obj = {"type": "decision", "id": msg.id, "decision": msg.decision}
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


def decode(line: bytes) -> Message:
    """One line as a message; ProtocolError for anything else (unknown fields are ignored)."""
    if len(line) > MAX_LINE:
        raise ProtocolError("line too long")
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError("not a JSON object")
    qid = _text(obj, "id", _MAX_ID)
    if not qid:
        raise ProtocolError("empty id")
    try:
        if obj.get("type") == "request":
            return _request(obj, qid)
        if obj.get("type") == "decision":
            decision = obj.get("decision")
            if not isinstance(decision, str) or decision not in ANSWERS:
                raise ProtocolError(f"unknown decision {decision!r}")
            return Decision(qid, cast(Answer, decision))
        raise ProtocolError(f"unknown message type {obj.get('type')!r}")
    except ProtocolError as e:
        raise ProtocolError(str(e), qid) from None


def choice(answer: Answer) -> Choice | None:
    """`answer` as a human's or a tool's choice; None for "timeout", which only the broker may say."""
    if answer == "timeout":
        return None
    return answer


def _request(obj: dict[str, Any], qid: str) -> Request:
    port = _int(obj.get("port"), "port")
    if not 0 <= port <= 0xFFFF:
        raise ProtocolError(f"port out of range: {port}")
    host, kind = _text(obj, "host", _MAX_TEXT), _text(obj, "kind", _MAX_TEXT)
    if not host or not kind:
        raise ProtocolError("empty host or kind")
    peer = obj.get("peer")
    if peer is not None:
        if not isinstance(peer, list) or len(peer) != 2 or not isinstance(peer[0], str):
            raise ProtocolError("peer is not [ip, port]")
        peer = (peer[0], _int(peer[1], "peer port"))
    asked_by = obj.get("asked_by")
    if asked_by is not None and (not isinstance(asked_by, str) or len(asked_by) > _MAX_TEXT):
        raise ProtocolError("asked_by is not a string")
    timeout = obj.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
            raise ProtocolError("timeout is not a number")
        timeout = float(timeout)
    reason = _text(obj, "reason", _MAX_TEXT) if obj.get("reason") is not None else ""
    return Request(qid, host, port, kind, reason, peer, asked_by, timeout)


def _text(obj: dict[str, Any], name: str, limit: int) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(f"{name} is not a string of at most {limit} characters")
    return value


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):  # JSON true is a Python int: not a port
        raise ProtocolError(f"{name} is not an integer")
    return value
