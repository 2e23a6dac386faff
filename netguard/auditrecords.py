"""The audit log's format: one TypedDict per event. netguard.audit writes and reads them.

Kept apart from the writer and reader so the format can be read in one place (docs/audit.md's table
is checked against these types, field by field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, TypedDict

#: The record format written now. 1: logs from before the field (no `schema`, no `would`).
SCHEMA: Final = 2

Kind = Literal["connect", "http", "tls", "tcp", "dns", "packet", "policy", "approval"]
Event = Literal["decision", "close", "request", "approval", "policy", "limit"]
#: Which per-sandbox limit refused something (netguard.decision.limits): the daemon is shared by every
#: sandbox of a user, so one sandbox's excess is refused, and said, in that sandbox's log only.
Limit = Literal["connections", "deadline", "head", "questions", "queries", "lookups", "records", "export"]


class DecisionRecord(TypedDict):
    """One allow/deny decision (`kind` says which gate decided it)."""

    ts: str
    task: str
    event: Literal["decision"]
    id: str
    kind: Kind
    action: Literal["allow", "deny"]
    would: Literal["deny"] | None  # learn mode let through what the policy would deny
    host: str | None
    port: int | None
    ip: str | None
    proto: str | None
    method: str | None
    url: str | None
    qtype: str | None
    rule: str | None
    reason: str
    schema: int


class CloseRecord(TypedDict):
    """An allowed connection or request ended: what it carried."""

    ts: str
    task: str
    event: Literal["close"]
    id: str
    kind: Kind
    host: str | None
    port: int | None
    ip: str | None
    bytes_up: int
    bytes_down: int
    duration_ms: int
    schema: int


class RequestRecord(TypedDict):
    """One request the proxy judged by its method and path, or refused as an attempted leak.

    `id` is the decision that let its connection through; `status` the upstream's, 403 for a
    refusal, None when the exchange failed (upstream TLS verification included).
    """

    ts: str
    task: str
    event: Literal["request"]
    id: str
    kind: Kind
    action: Literal["allow", "deny"]
    host: str
    port: int
    method: str
    path: str  # without the query string unless the rule says log_query
    status: int | None
    bytes_up: int
    bytes_down: int
    duration_ms: int
    rule: str | None
    reason: str
    leak: str | None  # the variable whose sentinel (or value) an attempted leak carried
    schema: int


class ApprovalRecord(TypedDict):
    """A question to a human (stage "question") or its answer (stage "answer")."""

    ts: str
    task: str
    event: Literal["approval"]
    kind: Literal["approval"]
    id: str
    stage: Literal["question", "answer"]
    host: str
    port: int
    asked_by: str | None
    answer: str | None
    by: str | None  # terminal, socket, timeout, no-terminal
    schema: int


class PolicyRecord(TypedDict):
    """The run's filesystem/process boundary, once per run (names only: never an environment value)."""

    ts: str
    task: str
    event: Literal["policy"]
    kind: Literal["policy"]
    write: list[str]
    private_tmp: bool
    protect: list[str]
    hidden: list[str]
    env_dropped: list[str]
    landlock_abi: int
    warnings: list[str]
    cwd: str | None  # the run's working directory: its workspace (null in logs written before it)
    learn: bool | None  # a --learn run (null in logs written before it)
    schema: int


class LimitRecord(TypedDict):
    """What a per-sandbox limit refused: the first refusal at once, then a count at most once a second."""

    ts: str
    task: str
    event: Literal["limit"]
    kind: Kind  # connect (explicit listener), tcp (transparent), http (a request head), approval
    limit: Limit
    count: int  # refusals since this limit's previous record
    reason: str
    schema: int


Record = DecisionRecord | CloseRecord | RequestRecord | ApprovalRecord | PolicyRecord | LimitRecord

#: Each event's record type: what the reader checks a line against.
RECORD_TYPES: Final[Mapping[str, type[Any]]] = {
    "decision": DecisionRecord,
    "close": CloseRecord,
    "request": RequestRecord,
    "approval": ApprovalRecord,
    "policy": PolicyRecord,
    "limit": LimitRecord,
}
DECISION_FIELDS = tuple(DecisionRecord.__annotations__)
CLOSE_FIELDS = tuple(CloseRecord.__annotations__)
