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
from typing import Any

from netguard import rules

SHOWN = 3  # destinations named at exit; the rest are counted


@dataclass(frozen=True)
class Denied:
    host: str
    port: int | None
    kind: str
    count: int
    reason: str
    proto: str | None = None


def collect(records: Iterable[Mapping[str, Any]], task: str) -> list[Denied]:
    """Denied destinations of one task, most frequent first (then first seen)."""
    seen: dict[tuple[str, int | None], list[Any]] = {}
    for r in records:
        if r.get("task") != task or r.get("event") != "decision" or r.get("action") != "deny":
            continue
        host, port = str(r.get("host") or "?"), r.get("port")
        if r.get("kind") == "dns":
            # A refused lookup and the connection that follows are one destination to the user.
            match = next((k for k in seen if k[0] == host), None)
            key = match or (host, None)
        else:
            key = (host, port if isinstance(port, int) else None)
            if (host, None) in seen and key not in seen:  # a DNS refusal seen first: merge into it
                seen[key] = seen.pop((host, None))
        entry = seen.setdefault(key, [0, str(r.get("kind")), str(r.get("reason") or ""), r.get("proto")])
        entry[0] += 1
        if r.get("kind") != "dns":
            entry[1], entry[2], entry[3] = str(r.get("kind")), str(r.get("reason") or ""), r.get("proto")
    out = [Denied(h, p, e[1], e[0], e[2], e[3]) for (h, p), e in seen.items()]
    return sorted(out, key=lambda d: -d.count)  # stable: first seen first among equals


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
        return "does not resolve"
    port = f":{d.port}" if d.port not in (None, 80, 443) else ""
    if _is_ip(d.host):  # no name to judge: only a cidr rule can allow it
        net = f"{d.host}/32" if ":" not in d.host else f"[{d.host}/128]"
        return f"allow it with --allow {net}{port}"
    lists = [name for name, rs in sorted(bundled.items()) if rules.decide(rs, d.host, d.port or 443).allowed]
    flag = f"--allow {lists[0]}" if lists and not port else f"--allow {d.host}{port}"
    alt = f" (or --allow {d.host}{port})" if lists and not port else ""
    return f"allow it with {flag}{alt}"


def lines(records: Iterable[Mapping[str, Any]], task: str, bundled: Mapping[str, rules.Ruleset]) -> list[str]:
    """The exit's denial lines: a few destinations by name, what would allow each, then a count of the rest."""
    denied = collect(records, task)
    out = []
    for d in denied[:SHOWN]:
        where = d.host if d.port is None else (f"[{d.host}]:{d.port}" if ":" in d.host else f"{d.host}:{d.port}")
        times = f" ({d.count}x)" if d.count > 1 else ""
        out.append(f"sandgate: denied {where}{times}: {advice(d, bundled)}")
    if len(denied) > SHOWN:
        out.append(f"sandgate: ... and {len(denied) - SHOWN} more destinations; see 'sandgate audit summary LOG'")
    return out
