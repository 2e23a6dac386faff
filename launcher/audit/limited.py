"""What the daemon's per-sandbox limits refused (`event: limit` records), in the exit line's words.

The records are aggregated where they are written (netguard.decision.limits: a count a second); here
they are summed per limit, so the user sees one line per limit however long the flood lasted.
"""

from __future__ import annotations

from collections.abc import Iterable

from netguard.audit import Limit, Record

#: What each limit refused, as a noun phrase for a count ("3 connections refused: ...").
_WHAT: dict[Limit, tuple[str, str]] = {
    "connections": ("connection", "connections"),
    "deadline": ("connection closed unsent", "connections closed unsent"),
    "head": ("request refused for its size", "requests refused for their size"),
    "questions": ("approval question refused", "approval questions refused"),
    "queries": ("DNS query dropped", "DNS queries dropped"),
    "lookups": ("lookup refused", "lookups refused"),
    "records": ("denial counted, not written", "denials counted, not written"),
    "export": ("audit record not exported over OTLP", "audit records not exported over OTLP"),
}


def totals(records: Iterable[Record], task: str) -> dict[Limit, tuple[int, str]]:
    """Per limit: how many it refused in this run, and the newest reason given."""
    out: dict[Limit, tuple[int, str]] = {}
    for r in records:
        if r["event"] == "limit" and r["task"] == task:
            n = out.get(r["limit"], (0, ""))[0]
            out[r["limit"]] = (n + r["count"], r["reason"])
    return out


def lines(found: dict[Limit, tuple[int, str]]) -> list[str]:
    """One line per limit, most refusals first."""
    out = []
    for limit, (n, reason) in sorted(found.items(), key=lambda kv: -kv[1][0]):
        one, many = _WHAT[limit]
        out.append(f"sandgate: {n} {one if n == 1 else many} by a limit of the shared daemon: {reason}")
    return out
