"""What a run was refused, said where the user looks (the exit line), with what would allow it.

Pure: audit records and compiled bundled allowlists in, lines out. A denial a user cannot
trace back to sandgate ("npm: EACCES", "pip: 5 retries of 403") is how sandboxes get turned
off; naming the destination and the exact flag keeps them on. Advice never widens on its
own: it only says which flag would, and says nothing for what no flag should open (a
rebinding to a private address, UDP).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from netguard import rules, verdict
from netguard.audit import DecisionRecord, Kind, Record

SHOWN = 3  # destinations named at exit; the rest are counted


@dataclass(frozen=True)
class Denied:
    host: str
    port: int | None
    kind: Kind
    count: int
    reason: str
    proto: str | None = None


@dataclass
class _Seen:
    """One denied destination while the records stream by: the last connection's kind and reason win."""

    count: int
    kind: Kind
    reason: str
    proto: str | None


def collect(records: Iterable[Record], task: str) -> list[Denied]:
    """Denied destinations of one task, most frequent first (then first seen)."""
    seen: dict[tuple[str, int | None], _Seen] = {}
    for r in records:
        if r["task"] != task or r["event"] != "decision" or r["action"] != "deny":
            continue
        host = r["host"] or "?"
        if r["kind"] == "dns":
            # A refused lookup and the connection that follows are one destination to the user.
            match = next((k for k in seen if k[0] == host), None)
            key = match or (host, None)
        else:
            key = (host, r["port"])
            if (host, None) in seen and key not in seen:  # a DNS refusal seen first: merge into it
                seen[key] = seen.pop((host, None))
        entry = seen.setdefault(key, _from(r, 0))
        entry.count += 1
        if r["kind"] != "dns":
            entry.kind, entry.reason, entry.proto = r["kind"], r["reason"], r["proto"]
    out = [Denied(h, p, e.kind, e.count, e.reason, e.proto) for (h, p), e in seen.items()]
    return sorted(out, key=lambda d: -d.count)  # stable: first seen first among equals


def _from(r: DecisionRecord, count: int) -> _Seen:
    return _Seen(count, r["kind"], r["reason"], r["proto"])


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def advice(d: Denied, bundled: Mapping[str, rules.Ruleset]) -> str:
    """What would allow `d`, or why nothing should."""
    if d.kind == "packet":
        return f"{d.proto or 'this'} traffic never leaves the sandbox (only TCP through the proxy, and DNS)"
    if d.reason.startswith("denied by rule"):
        return f"{d.reason} (deny beats allow: remove that rule to reach it)"
    if d.reason.startswith("resolved to"):
        return f"{d.reason}: refused as a rebinding/SSRF guard; only a cidr rule for that range reopens it"
    if d.reason.startswith("cannot resolve"):
        return _unresolved(d.reason)
    port = f":{d.port}" if d.port not in (None, 80, 443) else ""
    if _is_ip(d.host):  # no name to judge: only a cidr rule can allow it
        net = f"{d.host}/32" if ":" not in d.host else f"[{d.host}/128]"
        return f"allow it with --allow {net}{port}"
    lists = [name for name, rs in sorted(bundled.items()) if rules.decide(rs, d.host, d.port or 443).allowed]
    flag = f"--allow {lists[0]}" if lists and not port else f"--allow {d.host}{port}"
    alt = f" (or --allow {d.host}{port})" if lists and not port else ""
    return f"allow it with {flag}{alt}"


def _unresolved(reason: str) -> str:
    """A lookup in trouble (no answer in time, SERVFAIL) says so: "does not resolve" would send the user
    after a name that is fine (netguard.verdict.unresolved's words)."""
    why = reason.partition(": ")[2]
    if verdict.resolver_trouble(why):
        return f"{why} (a lookup failure, not the policy: try again)"
    return "does not resolve"


def explain(d: Denied, bundled: Mapping[str, rules.Ruleset]) -> str:
    """Why `d` was refused and what would allow it, in one phrase (`sandgate audit summary`'s REASON)."""
    said = advice(d, bundled)
    if not d.reason or said.startswith(d.reason):
        return said  # the advice already names the reason (a deny rule, a vetoed address)
    if d.reason.startswith("cannot resolve"):
        return d.reason  # "does not resolve" would only repeat it, less precisely
    return f"{d.reason}: {said}"


def lines(records: Iterable[Record], task: str, bundled: Mapping[str, rules.Ruleset]) -> list[str]:
    """The exit's denial lines: a few destinations by name, what would allow each, then a count of the rest."""
    denied = collect(records, task)
    out = []
    for d in denied[:SHOWN]:
        where = d.host if d.port is None else (f"[{d.host}]:{d.port}" if ":" in d.host else f"{d.host}:{d.port}")
        times = f" ({d.count}x)" if d.count > 1 else ""
        out.append(f"sandgate: denied {where}{times}: {advice(d, bundled)}")
    if len(denied) > SHOWN:
        out.append(f"sandgate: ... and {len(denied) - SHOWN} more destinations; see 'sandgate audit summary'")
    return out
