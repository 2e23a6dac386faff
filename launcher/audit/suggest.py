"""`sandgate audit suggest`: the `version: 1` policy that would have allowed what the runs were allowed.

Four passes over the summary's rows: collect (what was allowed, denied, only resolved), cover
(which bundled lists allow what was seen), propose (hosts, cidrs, and wildcards behind the
public-suffix guard), render (YAML text). Whether a list or a wildcard would allow a destination
is asked of the rule engine (netguard.rules.decide), never matched here by string.

Denied destinations are never suggested, only listed as comments: the user decides. Every
logged string that reaches the YAML is escaped or quoted: a host name must never inject a line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.audit.suffixes import registrable_domain
from launcher.audit.summary import ALLOWED, NOTHING_FETCHED, Destination, fetched_nothing, summarize
from launcher.audit.text import comment, name_key, plural, quoted, scalar, times
from netguard import hosts, rules
from netguard.audit import Record
from netguard.policy import DEFAULT_ALLOW_PORTS, NetworkPolicy, Rule
from sgbase.origin import Origin

#: A wildcard is proposed only when this many distinct subdomains of one registrable domain were seen.
WILDCARD_MIN_SIBLINGS = 3
_MAX_TASKS_SHOWN = 8

#: (sort key, allow entry, its comment)
Entry = tuple[tuple[object, ...], str, str]


@dataclass
class _Use:
    """What the runs did with one host (name) or address, merged over ports and kinds."""

    ports: set[int] = field(default_factory=set)
    count: int = 0
    first: str | None = None

    def add(self, d: Destination) -> None:
        self.merge(_Use({d.port} if d.port is not None else set(), d.count, d.first_seen))

    def merge(self, other: _Use) -> None:
        self.ports |= other.ports
        self.count += other.count
        if other.first is not None and (self.first is None or other.first < self.first):
            self.first = other.first


@dataclass
class _Seen:
    """The collect pass: the rows sorted into what a policy should allow and what it must not."""

    names: defaultdict[str, _Use] = field(default_factory=lambda: defaultdict(_Use))  # normalised host -> use
    addrs: defaultdict[hosts.Address, _Use] = field(default_factory=lambda: defaultdict(_Use))
    addr_protos: defaultdict[hosts.Address, set[str]] = field(default_factory=lambda: defaultdict(set))
    denied: list[Destination] = field(default_factory=list)
    denied_web: defaultdict[str, set[int]] = field(default_factory=lambda: defaultdict(set))  # seen only denied
    denied_pairs: set[tuple[str, int | None]] = field(default_factory=set)  # (host, port; None = the lookup)
    resolved: dict[str, Destination] = field(default_factory=dict)  # looked up, never connected to
    inspected: set[str] = field(default_factory=set)  # names whose connections the runs inspected (request records)
    notes: list[str] = field(default_factory=list)


def suggest(
    records: Sequence[Record], name: str | None = None, bundled: Mapping[str, rules.Ruleset] | None = None
) -> str:
    """A `version: 1` policy that would have allowed what the runs were allowed (or learn mode let through).

    A wildcard is proposed only for >= 3 subdomains of one registrable domain, never at a
    public suffix, and never over a host that was denied. Bundled lists replace the hosts
    they cover on web ports. `bundled` maps a bundled list name to its compiled rules; the
    names must exist in allowlists/ for `include:`.
    """
    seen = _collect(summarize(records))
    lists = dict(bundled or {})
    why, covered = _cover(seen, lists)
    includes = set(why)
    listed = {
        h: u
        for h, u in seen.names.items()
        if not (h in covered and u.ports <= DEFAULT_ALLOW_PORTS and not seen.denied_web.get(h))
    }
    entries, wild = _wildcards(seen, listed)
    entries += _hosts(seen, listed, wild) + _addresses(seen)
    entries.sort(key=lambda e: e[0])
    tail = _not_suggested(seen, {n: lists[n] for n in includes})
    if fetched_nothing(records):
        tail.append(f"note: {NOTHING_FETCHED}")
    return _render(records, name, why, entries, tail)


# ---- collect --------------------------------------------------------------------------------------


def _collect(rows: Sequence[Destination]) -> _Seen:
    """Sort every row into allowed names, allowed addresses, denials, and lookups never connected to."""
    seen = _Seen()
    connected = {dest for d in rows if not d.dns and isinstance(dest := _normalise(d.host), str)}
    for d in rows:
        dest = _normalise(d.host)
        ok = bool(d.decisions & ALLOWED)
        if d.dns:
            if isinstance(dest, str) and not ok:
                seen.denied_pairs.add((dest, None))  # a wildcard would make this lookup succeed
            if isinstance(dest, str) and dest not in connected:
                if ok:
                    seen.resolved.setdefault(dest, d)
                else:
                    seen.denied.append(d)
        elif not ok:
            seen.denied.append(d)
            if isinstance(dest, str):
                seen.denied_pairs.add((dest, d.port))
                if d.port in DEFAULT_ALLOW_PORTS:
                    seen.denied_web[dest].add(d.port)
        elif dest is None:
            seen.notes.append(f"not a valid destination, not suggested: {comment(d.label)} ({times(d.count)})")
        elif isinstance(dest, str):
            seen.names[dest].add(d)
            if d.requests:  # request records exist only for an inspected connection
                seen.inspected.add(dest)
        elif d.port is None:
            seen.notes.append(f"no port to allow, not suggested: {comment(d.label)} ({times(d.count)})")
        else:
            seen.addrs[dest].add(d)
            if d.proto is not None:
                seen.addr_protos[dest].add(d.proto)
    # A web port that was allowed once and denied another time is allowed, not "denied only".
    for host, ports in seen.denied_web.items():
        ports -= seen.names[host].ports if host in seen.names else set()
    return seen


# ---- cover: bundled lists -----------------------------------------------------------------------


def _cover(seen: _Seen, lists: Mapping[str, rules.Ruleset]) -> tuple[dict[str, str], set[str]]:
    """(each list to include -> why, hosts they allow): a list is included when it allows a host the runs used.

    Of the lists that allow a host, a passthrough one is preferred (`npm` over `npm-readonly`): an
    inspecting list opts the user into TLS interception, which the run never tried. Only when the
    runs inspected that host are the inspecting lists preferred, as the run was.
    """
    chosen: defaultdict[str, list[str]] = defaultdict(list)
    over: defaultdict[str, set[str]] = defaultdict(set)
    covered: set[str] = set()
    for host in seen.names:
        by = {n: _inspects(rs, host) for n, rs in lists.items() if rules.decide(rs, host, None).allowed}
        want = host in seen.inspected
        preferred = [n for n, inspects in by.items() if inspects == want] or list(by)
        for n in preferred:
            chosen[n].append(host)
            over[n] |= set(by) - set(preferred)
        covered |= {host} if by else set()
    why = {}
    for n, hosts_ in chosen.items():
        kind = "inspected, as the runs were" if _inspects_any(lists[n]) else "passthrough, not inspected"
        passed = f"; chosen over {', '.join(sorted(over[n]))}" if over[n] else ""
        why[n] = f"allows {', '.join(sorted(hosts_, key=name_key))} ({kind}){passed}"
    return why, covered


def _inspects(rs: rules.Ruleset, host: str) -> bool:
    """Whether the rule of this list that allows `host` terminates its TLS."""
    origin = rules.decide(rs, host, None).rule
    return any(r.inspect for r in rs.policy.allow if str(r.origin) == origin)


def _inspects_any(rs: rules.Ruleset) -> bool:
    return any(r.inspect for r in rs.policy.allow)


# ---- propose ------------------------------------------------------------------------------------


def _wildcards(seen: _Seen, listed: Mapping[str, _Use]) -> tuple[list[Entry], set[str]]:
    """`*.domain` entries for >= 3 distinct subdomains under one registrable domain, none of them denied.

    The registrable domain (public suffix + one label) is the public-suffix guard: `*.co.uk` or
    `*.github.io` would allow strangers' sites, so no group forms there.
    """
    groups: dict[str, list[str]] = defaultdict(list)
    for host in listed:
        reg = registrable_domain(host)
        if reg is not None and host != reg:
            groups[reg].append(host)
    entries: list[Entry] = []
    wild: set[str] = set()
    for reg, subs in groups.items():
        if len(subs) < WILDCARD_MIN_SIBLINGS:
            continue
        use = _Use()
        for h in subs:
            use.merge(listed[h])
        ports = use.ports if not use.ports <= DEFAULT_ALLOW_PORTS else None
        if _widens_onto_a_denial(
            seen, Rule("wildcard", reg, frozenset(ports or DEFAULT_ALLOW_PORTS), Origin("suggested"))
        ):
            seen.notes.append(f"*.{comment(reg)} not suggested: it would allow a denied host under it")
            continue
        wild.update(subs)
        text = f"covers {', '.join(sorted(subs, key=name_key))}: {_use_text(use)}"
        entries.append(((0, name_key(reg), 1), _host_entry(f"*.{reg}", ports), text))
    return entries, wild


def _widens_onto_a_denial(seen: _Seen, candidate: Rule) -> bool:
    """Would `candidate` allow a denied lookup or connection? Asked of the rule engine, rule compiled alone.

    A denied lookup of a host that is suggested anyway changes nothing: its own entry allows the name.
    """
    rs = rules.compile_policy(NetworkPolicy(allow=(candidate,)))
    return any(rules.decide(rs, h, p).allowed and (p is not None or h not in seen.names) for h, p in seen.denied_pairs)


def _hosts(seen: _Seen, listed: Mapping[str, _Use], wild: set[str]) -> list[Entry]:
    """One entry per allowed name a wildcard does not cover; the ports form off the web ports."""
    entries: list[Entry] = []
    for host, use in listed.items():
        if host in wild:
            continue
        web_only = use.ports <= DEFAULT_ALLOW_PORTS and not seen.denied_web.get(host)
        why = (
            "no bundled list allows it" if web_only else "its ports are listed: beyond 80,443, or a web port was denied"
        )
        entries.append(
            ((0, name_key(host), 0), _host_entry(host, None if web_only else use.ports), f"{why}: {_use_text(use)}")
        )
    return entries


def _addresses(seen: _Seen) -> list[Entry]:
    """One /32 or /128 cidr entry per allowed address, with the ports it was reached on."""
    entries: list[Entry] = []
    for ip, use in seen.addrs.items():
        bits = 32 if ip.version == 4 else 128
        protos = seen.addr_protos.get(ip)
        text = _use_text(use) + (f" ({'/'.join(sorted(protos))} packets)" if protos else "")
        entries.append(((1, ip.version, int(ip)), _cidr_entry(f"{ip}/{bits}", use.ports), text))
    return entries


# ---- render -------------------------------------------------------------------------------------


def _not_suggested(seen: _Seen, included: Mapping[str, rules.Ruleset]) -> list[str]:
    """Comment lines for what is not suggested; say so when an include allows it anyway."""
    tail: list[str] = []
    for d in sorted(seen.denied, key=lambda d: (d.proto is not None, d.dns, _label_key(d))):
        if d.proto is not None:
            tail.append(f"dropped, not suggested: {comment(d.label)} ({times(d.count)})")
        else:
            what = comment(d.label) + (" (dns lookup)" if d.dns else "")
            tail.append(f"denied, not suggested: {what} ({times(d.count)}){_bundled_note(d, included)}")
    for host in sorted(seen.resolved, key=name_key):
        tail.append(f"resolved only: {comment(host)} ({plural(seen.resolved[host].count, 'lookup')})")
    return tail + seen.notes


def _bundled_note(d: Destination, included: Mapping[str, rules.Ruleset]) -> str:
    host = _normalise(d.host)
    if not isinstance(host, str) or (d.port is not None and d.port not in DEFAULT_ALLOW_PORTS):
        return ""
    by = sorted(n for n, rs in included.items() if rules.decide(rs, host, d.port).allowed)
    return f"; note: include {', '.join(by)} allows it" if by else ""


def _render(
    records: Sequence[Record], name: str | None, includes: Mapping[str, str], entries: list[Entry], tail: list[str]
) -> str:
    tasks = sorted({r["task"] for r in records})
    shown = ", ".join(comment(t) for t in tasks[:_MAX_TASKS_SHOWN])
    if len(tasks) > _MAX_TASKS_SHOWN:
        shown += f", +{len(tasks) - _MAX_TASKS_SHOWN} more"
    out = [
        f"# suggested by sandgate audit suggest from {plural(len(records), 'record')} of {plural(len(tasks), 'run')}"
        + (f" (tasks: {shown})" if tasks else ""),
        "version: 1",
    ]
    if name is not None:
        out.append(f"description: {quoted(name)}")
    if includes:  # one line each, with why it was chosen
        out.append("include:")
        out.extend(f"  - {scalar(n)}  # {comment(includes[n])}" for n in sorted(includes))
    out.append("network:")
    if entries:
        out.append("  allow:")
        width = min(max(len(e[1]) for e in entries), 60)
        out.extend(f"    - {entry.ljust(width)}  # {text}" for _, entry, text in entries)
    else:
        out.append("  allow: []")
    out.extend(f"  # {line}" for line in tail)
    return "\n".join(out) + "\n"


# ---- small helpers --------------------------------------------------------------------------------


def _normalise(host: str | None) -> str | hosts.Address | None:
    if host is None:
        return None
    try:
        return hosts.normalise(host)
    except hosts.HostError:
        return None


def _label_key(d: Destination) -> tuple[object, ...]:
    host = _normalise(d.host)
    return (name_key(host) if isinstance(host, str) else ("~", str(d.host)), d.port if d.port is not None else -1)


def _use_text(use: _Use) -> str:
    return f"{plural(use.count, 'connection')}, first seen {comment(use.first or 'unknown')}"


def _ports(ports: set[int]) -> str:
    return "[" + ", ".join(str(p) for p in sorted(ports)) + "]"


def _host_entry(host: str, ports: set[int] | None) -> str:
    if ports is None or not ports:
        return scalar(host)
    return f"{{host: {scalar(host)}, ports: {_ports(ports)}}}"


def _cidr_entry(cidr: str, ports: set[int]) -> str:
    return f"{{cidr: {scalar(cidr)}, ports: {_ports(ports)}}}"
