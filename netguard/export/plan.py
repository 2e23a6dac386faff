"""The one intermediate every export target reads: what a `network:` section allows, in engine terms.

Pure. Built once from the compiled policy (netguard.policy rules, matched as netguard.rules matches
them): exact names, wildcard suffixes (sandgate's `*.x` is every strict subdomain of x at any depth,
never x itself), networks, TCP port ranges, and every `Gap` the engines cannot express. A gap is
never dropped in silence: `refused` would make the export allow more than sandgate (the command
fails), `narrowed` makes it allow less, `sandgate-only` is enforced only by sandgate in the pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from netguard.policy import NetworkPolicy, Rule

#: Inclusive TCP port ranges, sorted and disjoint; ANY_PORT is every port.
Ports = tuple[tuple[int, int], ...]
ANY_PORT: Ports = ((1, 65535),)

Severity = Literal["refused", "narrowed", "sandgate-only"]


@dataclass(frozen=True)
class Gap:
    """One thing a target cannot say as sandgate means it, and what the export does about it."""

    severity: Severity
    origin: str  # FILE:LINE of the rule, or the target's name for a whole-policy gap
    text: str  # one phrase: what, and what to do


@dataclass(frozen=True)
class NameRule:
    """An allowed (or denied) name: exact, or every strict subdomain of `name` (sandgate's `*.name`)."""

    name: str
    wildcard: bool
    ports: Ports
    origin: str

    @property
    def pattern(self) -> str:
        return f"*.{self.name}" if self.wildcard else self.name


@dataclass(frozen=True)
class NetRule:
    """An allowed (or denied) network, as CIDR text."""

    cidr: str
    ports: Ports
    origin: str


@dataclass(frozen=True)
class Plan:
    """What the engines should allow: sandgate's denies already subtracted wherever that is exact."""

    names: tuple[NameRule, ...]
    networks: tuple[NetRule, ...]
    deny_networks: tuple[NetRule, ...]  # deny cidrs: they also veto every name resolving into them
    deny_names: tuple[NameRule, ...]  # every name deny as written (learn mode still enforces them)
    gaps: tuple[Gap, ...]
    learn: bool = False

    @property
    def refused(self) -> tuple[Gap, ...]:
        return tuple(g for g in self.gaps if g.severity == "refused")


# ---- port ranges ---------------------------------------------------------------------------------


def port_ranges(ports: frozenset[int] | None) -> Ports:
    """A rule's ports (None: every port) as sorted inclusive ranges."""
    if ports is None:
        return ANY_PORT
    out: list[tuple[int, int]] = []
    for p in sorted(ports):
        if out and out[-1][1] == p - 1:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return tuple(out)


def subtract(a: Ports, b: Ports) -> Ports:
    """The ports of `a` that are not in `b`."""
    out: list[tuple[int, int]] = []
    for lo, hi in a:
        for blo, bhi in b:
            if bhi < lo or blo > hi:
                continue
            if blo > lo:
                out.append((lo, blo - 1))
            lo = bhi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return tuple(out)


def union(a: Ports, b: Ports) -> Ports:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((*a, *b)):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return tuple(out)


def overlaps(a: Ports, b: Ports) -> bool:
    return subtract(a, b) != a


def describe_ports(ports: Ports) -> str:
    if ports == ANY_PORT:
        return "any port"
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ports)


# ---- names: which deny touches which allow ----------------------------------------------------------

Relation = Literal["disjoint", "covers", "inside"]


def _under(name: str, suffix: str) -> bool:
    return name.endswith("." + suffix)


def relation(deny: Rule, allow: Rule) -> Relation:
    """`covers`: the deny matches every name the allow matches; `inside`: only some (a hole in a wildcard)."""
    d, a = str(deny.value), str(allow.value)
    if deny.kind == "host":
        if allow.kind == "host":
            return "covers" if d == a else "disjoint"
        return "inside" if _under(d, a) else "disjoint"
    if allow.kind == "host":
        return "covers" if _under(a, d) else "disjoint"
    if a == d or _under(a, d):
        return "covers"
    return "inside" if _under(d, a) else "disjoint"


def _pattern(rule: Rule) -> str:
    return f"*.{rule.value}" if rule.kind == "wildcard" else str(rule.value)


def _allowed_name(allow: Rule, denies: tuple[Rule, ...], gaps: list[Gap]) -> Ports:
    """The ports `allow` keeps once sandgate's denies (deny beats allow) are taken out."""
    ports = port_ranges(allow.ports)
    for deny in denies:
        if relation(deny, allow) == "covers":
            ports = subtract(ports, port_ranges(deny.ports))
    for deny in denies:  # then the holes, in what is left: a covering deny may have taken it all
        if relation(deny, allow) == "inside" and overlaps(ports, port_ranges(deny.ports)):
            gaps.append(
                Gap(
                    "refused",
                    str(deny.origin),
                    f"deny {deny.describe()} lies inside allowed {allow.describe()} ({allow.origin}): "
                    "the engine cannot take a name out of a wildcard; allow the names you need instead",
                )
            )
    return ports


def _merge(rules: list[NameRule]) -> tuple[NameRule, ...]:
    """One rule per name and kind (bundled lists repeat names), ports united, the first origin kept."""
    found: dict[tuple[str, bool], NameRule] = {}
    for r in rules:
        key = (r.name, r.wildcard)
        old = found.get(key)
        found[key] = r if old is None else NameRule(r.name, r.wildcard, union(old.ports, r.ports), old.origin)
    return tuple(found.values())


def _sandgate_only(net: NetworkPolicy) -> list[Gap]:
    """Request rules and credentials: sandgate inside the pod enforces them; no engine here can."""
    gaps = [
        Gap(
            "sandgate-only",
            str(r.origin),
            f"{_pattern(r)}: its requests are inspected"
            + (" and judged by http rules" if r.http is not None else "")
            + " only by sandgate in the pod; the engine allows every request to it",
        )
        for r in net.allow
        if r.inspect
    ]
    gaps += [
        Gap(
            "sandgate-only",
            str(c.origin),
            f"credential for {c.host} (header {c.header}): brokered only by sandgate in the pod",
        )
        for c in net.credentials
    ]
    gaps += [
        Gap("narrowed", str(r.origin), f"ask {r.describe()}: left out, so denied (the engine has nobody to ask)")
        for r in net.ask
    ]
    return gaps


def build(net: NetworkPolicy, *, learn: bool = False) -> Plan:
    """The plan of a compiled `network:` section; `learn`: the run's --learn (default deny reported, not enforced)."""
    gaps: list[Gap] = []
    name_denies = tuple(r for r in net.deny if r.kind != "cidr")
    names: list[NameRule] = []
    networks: list[NetRule] = []
    for rule in net.allow:
        if rule.kind == "cidr":
            networks.append(NetRule(str(rule.value), port_ranges(rule.ports), str(rule.origin)))
            continue
        ports = _allowed_name(rule, name_denies, gaps)
        if ports:  # nothing left: sandgate denies every port of it too
            names.append(NameRule(str(rule.value), rule.kind == "wildcard", ports, str(rule.origin)))
    gaps += _sandgate_only(net)
    return Plan(
        names=_merge(names),
        networks=tuple(networks),
        deny_networks=tuple(
            NetRule(str(r.value), port_ranges(r.ports), str(r.origin)) for r in net.deny if r.kind == "cidr"
        ),
        deny_names=tuple(
            NameRule(str(r.value), r.kind == "wildcard", port_ranges(r.ports), str(r.origin)) for r in name_denies
        ),
        gaps=tuple(gaps),
        learn=learn,
    )
