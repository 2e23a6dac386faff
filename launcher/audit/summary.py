"""`sandgate audit summary`: one row per destination over all runs, riskiest first.

Pure: typed records in, rows, a text table or JSON values out, so the summary can be tested
without a sandbox. Denied rows say why (the record's reason) and what would allow them, in the
exit line's words (launcher.audit.denials). Requests an inspected host refused, and attempted
credential leaks, are listed apart (launcher.audit.refusals): leaks above the table, refused
requests below it; a destination with an attempted leak is the first row. Every logged string in
the table is escaped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.audit import denials, refusals
from launcher.audit.refusals import Refused
from launcher.audit.text import bracket, escape
from netguard import rules
from netguard.audit import CloseRecord, DecisionRecord, Kind, Record, RequestRecord

#: Statuses under which the run got through, and so what `suggest` proposes to allow.
ALLOWED = frozenset({"allow", "would-deny"})
#: Statuses, most alarming first, as the STATUS column lists them.
_RISK_ORDER = ("deny", "would-deny", "allow")

#: Said by `summary` and `suggest` for a --learn run that fetched nothing: a learned policy would be
#: empty because nothing went to the network, not because nothing is needed.
NOTHING_FETCHED = (
    "a --learn run without a single network connection or lookup: caches (under ~, or in the "
    "workspace) may have served everything, so nothing was fetched; to learn what it needs, run it "
    "again with empty caches (`sandgate cache clear` empties the sandbox's home)"
)


def fetched_nothing(records: Sequence[Record]) -> bool:
    """A --learn run's log (its policy record says so) without any decision: nothing was fetched."""
    learn = any(r["event"] == "policy" and r["learn"] for r in records)
    return learn and not any(r["event"] == "decision" for r in records)


#: (host, port, packet protocol, is a DNS lookup): what makes two records one destination.
Key = tuple[str | None, int | None, str | None, bool]


@dataclass(frozen=True)
class Destination:
    """One destination over all runs: how often, how decided, by which rules, why refused, how many bytes."""

    host: str | None
    port: int | None  # None for DNS (and port-less packets such as ICMP)
    proto: str | None  # packet rows only ("udp", "icmp", ...)
    dns: bool  # a DNS name lookup row, kept apart from connections to the same host
    count: int
    decisions: frozenset[str]  # "allow", "deny", "would-deny" (allowed by learn mode only)
    kinds: frozenset[Kind]
    rules: frozenset[str]
    bytes_up: int
    bytes_down: int
    first_seen: str | None
    last_seen: str | None
    tasks: frozenset[str] = field(default_factory=frozenset)
    reasons: frozenset[str] = field(default_factory=frozenset)  # of the denials and would-denies
    requests: int = 0  # inspected requests (and leak checks) recorded for its connections
    refused: tuple[Refused, ...] = ()  # of those, the refused ones: attempted leaks first

    @property
    def risk(self) -> int:
        """-1: an attempted leak; 0: something was denied (or an unknown action); 1: allowed only by learn
        mode; 2: allowed by policy (a refused request on an allowed host makes it 0 too)."""
        if any(x.leak is not None for x in self.refused):
            return -1
        if self.decisions - ALLOWED or self.refused:
            return 0
        return 1 if "would-deny" in self.decisions else 2

    @property
    def label(self) -> str:
        """`host:port`, `[v6]:port`, `host` for DNS, `udp host:port` for dropped packets."""
        host = self.host if self.host is not None else "?"
        text = host if self.port is None else f"{bracket(host)}:{self.port}"
        if self.proto is not None:
            text = f"{self.proto} {text}"
        return text


def decision_status(record: DecisionRecord) -> str:
    """ "allow", "deny", or "would-deny" (learn mode let through what the policy would have denied)."""
    if record["action"] == "allow" and record["would"] == "deny":
        return "would-deny"
    return record["action"]


def _key(record: DecisionRecord | CloseRecord) -> Key:
    kind = record["kind"]
    if kind == "dns":
        return record["host"], None, None, True
    proto = record["proto"] if record["event"] == "decision" and kind == "packet" else None
    return record["host"], record["port"], proto, False


class _Acc:
    """Mutable accumulator for one destination while the records stream by."""

    def __init__(self) -> None:
        self.count = 0
        self.decisions: set[str] = set()
        self.kinds: set[Kind] = set()
        self.rules: set[str] = set()
        self.tasks: set[str] = set()
        self.reasons: set[str] = set()
        self.up = self.down = 0
        self.requests: list[RequestRecord] = []
        self.first: str | None = None
        self.last: str | None = None

    def add(self, r: DecisionRecord) -> None:
        self.count += 1
        status = decision_status(r)
        self.decisions.add(status)
        self.kinds.add(r["kind"])
        if r["rule"] is not None:
            self.rules.add(r["rule"])
        if status != "allow" and r["reason"]:
            self.reasons.add(r["reason"])
        self.tasks.add(r["task"])
        ts = r["ts"]
        self.first = ts if self.first is None or ts < self.first else self.first
        self.last = ts if self.last is None or ts > self.last else self.last

    def row(self, key: Key) -> Destination:
        host, port, proto, dns = key
        return Destination(
            host,
            port,
            proto,
            dns,
            self.count,
            frozenset(self.decisions),
            frozenset(self.kinds),
            frozenset(self.rules),
            self.up,
            self.down,
            self.first,
            self.last,
            frozenset(self.tasks),
            frozenset(self.reasons),
            len(self.requests),
            tuple(refusals.collect(self.requests)),
        )


def summarize(records: Iterable[Record]) -> list[Destination]:
    """One row per destination, riskiest first, so a reader sees the denials before the noise.

    Bytes come from `close` records matched to their decision by (task, id), falling
    back to id alone and then to the close record's own host/port; `request` records attach the
    same way, their bytes counted only where no `close` covers their connection already.
    """
    accs: dict[Key, _Acc] = defaultdict(_Acc)
    by_id: dict[tuple[str, str], Key] = {}
    by_bare_id: dict[str, Key] = {}
    closes: list[CloseRecord] = []
    reqs: list[RequestRecord] = []
    for r in records:
        if r["event"] == "close":
            closes.append(r)
        elif r["event"] == "request":
            reqs.append(r)
        elif r["event"] == "decision":
            key = _key(r)
            accs[key].add(r)
            by_id[(r["task"], r["id"])] = key
            by_bare_id.setdefault(r["id"], key)
    for c in closes:
        key = by_id.get((c["task"], c["id"])) or by_bare_id.get(c["id"]) or _key(c)
        if key not in accs:
            continue  # a close whose decision is not in these logs: nothing to attach it to
        accs[key].up += c["bytes_up"]
        accs[key].down += c["bytes_down"]
    closed = {(c["task"], c["id"]) for c in closes}
    for q in reqs:
        key = by_id.get((q["task"], q["id"])) or by_bare_id.get(q["id"]) or (q["host"], q["port"], None, False)
        acc = accs[key]  # a leak whose decision is not in these logs still gets a row: it must be seen
        acc.requests.append(q)
        if (q["task"], q["id"]) not in closed:
            acc.up += q["bytes_up"]
            acc.down += q["bytes_down"]
    rows = [acc.row(key) for key, acc in accs.items()]
    rows.sort(
        key=lambda d: (d.risk, -d.count, d.host or "", d.port if d.port is not None else -1, d.proto or "", d.dns)
    )
    return rows


def reason(d: Destination, bundled: Mapping[str, rules.Ruleset]) -> str | None:
    """Why `d` was refused (or would have been) and what would allow it; None when it never was."""
    if not d.reasons:
        return None
    kind: Kind = "packet" if "packet" in d.kinds else "dns" if d.dns else "connect"  # advice tells only packets apart
    host = d.host if d.host is not None else "?"
    said = [denials.explain(denials.Denied(host, d.port, kind, d.count, why, d.proto), bundled) for why in d.reasons]
    return "; ".join(sorted(set(said)))


def _status_text(decisions: frozenset[str]) -> str:
    known = [s for s in _RISK_ORDER if s in decisions]
    return "+".join(known + sorted(decisions - set(_RISK_ORDER)))


HEADER = ("STATUS", "DESTINATION", "KINDS", "COUNT", "UP", "DOWN", "FIRST SEEN", "LAST SEEN", "RULES", "REASON")


def format_table(rows: Sequence[Destination], bundled: Mapping[str, rules.Ruleset] | None = None) -> str:
    """Attempted leaks, the destination table, refused requests: the alarming before the routine.

    `bundled` (name -> compiled bundled list) lets REASON name the list that would allow a denial.
    """
    found = [x for d in rows for x in d.refused]
    parts = [refusals.format_section(found, leaks=True), _table(rows, bundled), refusals.format_section(found, False)]
    return "\n\n".join(p for p in parts if p)


def _table(rows: Sequence[Destination], bundled: Mapping[str, rules.Ruleset] | None) -> str:
    """Aligned text table with a header; every logged string escaped so it cannot drive the terminal."""
    right = {3, 4, 5}
    table = [HEADER]
    for d in rows:
        table.append(
            (
                escape(_status_text(d.decisions)),
                escape(d.label) + (" (dns)" if d.dns else ""),
                escape(",".join(sorted(d.kinds))),
                str(d.count),
                "-" if d.dns else str(d.bytes_up),
                "-" if d.dns else str(d.bytes_down),
                escape(d.first_seen or "-"),
                escape(d.last_seen or "-"),
                escape(", ".join(sorted(d.rules)) or "-"),
                escape(reason(d, bundled or {}) or "-"),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = []
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def as_json(rows: Sequence[Destination], bundled: Mapping[str, rules.Ruleset] | None = None) -> list[dict[str, Any]]:
    """Rows as plain JSON values (sets become sorted lists) for `--json`; `reason` as in the table's REASON."""
    return [
        {
            "host": d.host,
            "port": d.port,
            "proto": d.proto,
            "dns": d.dns,
            "count": d.count,
            "decisions": sorted(d.decisions),
            "kinds": sorted(d.kinds),
            "rules": sorted(d.rules),
            "bytes_up": d.bytes_up,
            "bytes_down": d.bytes_down,
            "first_seen": d.first_seen,
            "last_seen": d.last_seen,
            "tasks": sorted(d.tasks),
            "reasons": sorted(d.reasons),
            "reason": reason(d, bundled or {}),
            "requests": d.requests,
            "refused_requests": refusals.as_json(d.refused),  # attempted leaks (with `leak`) first
        }
        for d in rows
    ]
