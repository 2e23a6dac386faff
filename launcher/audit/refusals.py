"""Refused requests and attempted credential leaks, from `request` records, said where the user looks.

Pure: records in, typed rows and lines out. An attempted leak (a credential's sentinel sent where
it does not belong) is what a user must see first: it means something in the sandbox tried to
send a key away, whether or not a prompt told it to. Refused requests come next: an allowed
host whose `http:` rules said no (a push on a read-only host), so the user can tell "sandgate
said no" from "the server said no". Every logged string is escaped before it is shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.audit.text import escape
from netguard.audit import Record, RequestRecord

SHOWN = 3  # refusals named at exit, per kind; the rest are counted


@dataclass(frozen=True)
class Refused:
    """One refused request shape (host, port, method, path, why) over the records, with how often."""

    host: str
    port: int
    method: str
    path: str
    rule: str | None
    reason: str
    leak: str | None  # the variable an attempted leak carried
    count: int

    def where(self) -> str:
        return f"{self.method} {self.path} on {self.host}" + (f":{self.port}" if self.port not in (80, 443) else "")


def refused_records(records: Iterable[Record], task: str | None = None) -> list[RequestRecord]:
    """The `request` records that were refused (of one task, or all)."""
    return [
        r for r in records if r["event"] == "request" and r["action"] == "deny" and (task is None or r["task"] == task)
    ]


def collect(records: Iterable[RequestRecord]) -> list[Refused]:
    """Refused requests grouped by what they were; attempted leaks first, then the most frequent."""
    seen: dict[tuple[str, int, str, str, str | None, str, str | None], int] = {}
    for r in records:
        if r["action"] != "deny":
            continue
        key = (r["host"], r["port"], r["method"], r["path"], r["rule"], r["reason"], r["leak"])
        seen[key] = seen.get(key, 0) + 1
    out = [Refused(*key, count=n) for key, n in seen.items()]
    return sorted(out, key=lambda x: (x.leak is None, -x.count))  # stable: first seen first among equals


def counts(records: Iterable[Record], task: str) -> tuple[int, int]:
    """(refused requests, attempted leaks) of one task: each request counted once."""
    refused = refused_records(records, task)
    leaks = sum(r["leak"] is not None for r in refused)
    return len(refused) - leaks, leaks


def _line(x: Refused) -> str:
    times = f" ({x.count}x)" if x.count > 1 else ""
    rule = f" [rule {x.rule}]" if x.rule else ""
    if x.leak is not None:
        return f"sandgate: ATTEMPTED LEAK of ${x.leak}: {x.where()} refused{times}: {x.reason}"
    return f"sandgate: refused {x.where()}{times}: {x.reason}{rule}"


def lines(records: Iterable[Record], task: str) -> list[str]:
    """The exit's lines for one task: every attempted leak (a few by name), then refused requests."""
    found = collect(refused_records(records, task))
    out: list[str] = []
    for group in ([x for x in found if x.leak is not None], [x for x in found if x.leak is None]):
        out += [escape(_line(x)) for x in group[:SHOWN]]
        if len(group) > SHOWN:
            what = "attempted leaks" if group[0].leak is not None else "refused requests"
            out.append(f"sandgate: ... and {len(group) - SHOWN} more {what}; see 'sandgate audit summary'")
    return out


def format_section(found: Sequence[Refused], leaks: bool) -> str:
    """The summary's block of attempted leaks (leaks True) or refused requests; "" when there are none."""
    chosen = [x for x in found if (x.leak is not None) == leaks]
    if not chosen:
        return ""
    title = "ATTEMPTED LEAKS (refused)" if leaks else "REFUSED REQUESTS"
    return "\n".join([title, *(f"  {escape(_line(x).removeprefix('sandgate: '))}" for x in chosen)])


def as_json(found: Sequence[Refused]) -> list[dict[str, Any]]:
    return [
        {
            "host": x.host,
            "port": x.port,
            "method": x.method,
            "path": x.path,
            "rule": x.rule,
            "reason": x.reason,
            "leak": x.leak,
            "count": x.count,
        }
        for x in found
    ]
