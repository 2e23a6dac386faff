"""Allow/deny decisions: (policy, destination, port) -> Decision. Pure and indexed.

Order of precedence, the whole security argument in four lines:
  1. an invalid destination is denied;
  2. a matching deny rule wins over everything (deny beats allow);
  3. a matching allow rule allows; a matching ask rule asks;
  4. nothing matched: denied (default deny).
Names only match host/wildcard rules and IP literals only match cidr rules, so a
name rule can never be satisfied by spelling the destination as an address.

Lookups cost O(labels) for names and O(prefix lengths) for addresses, never
O(rules): policies built from many bundled lists stay fast per connection.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from netguard import hosts
from netguard.policy import NetworkPolicy, Rule

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Action = Literal["allow", "deny", "ask"]

# Where an allowed *name* must not lead: the sandbox's own host, its cloud metadata
# service and the operator's private networks (SSRF / DNS rebinding). Only an explicit
# cidr allow rule for the range reopens it.
SPECIAL_RANGES: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("127.0.0.0/8", "loopback"),
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fe80::/10", "link-local"),
        ("fc00::/7", "private (unique local)"),
        ("ff00::/8", "multicast"),
        ("64:ff9b::/96", "NAT64 (embeds an IPv4 address)"),
        ("2002::/16", "6to4 (embeds an IPv4 address)"),
    )
)


#: Pure, so memoised: the same few names are decided on every connection of a task.
normalise = functools.lru_cache(maxsize=4096)(hosts.normalise)


@dataclass(frozen=True)
class Decision:
    action: Action
    rule: str | None  # origin of the deciding rule ("FILE:LINE"), None for the default
    reason: str

    @property
    def allowed(self) -> bool:
        return self.action == "allow"


class _Index:
    """Rules of one list (allow, deny or ask) indexed by exact name, wildcard suffix and network."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.exact: dict[str, list[Rule]] = defaultdict(list)
        self.wild: dict[str, list[Rule]] = defaultdict(list)
        self.nets: dict[tuple[int, int], dict[int, list[Rule]]] = defaultdict(lambda: defaultdict(list))
        for r in rules:
            if r.kind == "host":
                self.exact[str(r.value)].append(r)
            elif r.kind == "wildcard":
                self.wild[str(r.value)].append(r)
            else:
                net = r.value
                assert not isinstance(net, str)
                self.nets[(net.version, net.prefixlen)][int(net.network_address)].append(r)
        # Longest prefix first, so the most specific rule is the one reported.
        self.prefixes = sorted(self.nets, key=lambda k: -k[1])

    def name_rules(self, name: str) -> list[Rule]:
        found = list(self.exact.get(name, ()))
        labels = name.split(".")  # already normalised: no second pass through hosts on the hot path
        for i in range(1, len(labels)):
            found.extend(self.wild.get(".".join(labels[i:]), ()))
        return found

    def addr_rules(self, ip: Address) -> list[Rule]:
        found: list[Rule] = []
        value, bits = int(ip), ip.max_prefixlen
        for version, plen in self.prefixes:
            if version != ip.version:
                continue
            masked = value & (((1 << plen) - 1) << (bits - plen)) if plen else 0
            found.extend(self.nets[(version, plen)].get(masked, ()))
        return found


def _first_on_port(rules: list[Rule], port: int | None) -> Rule | None:
    """The first rule covering `port`; `port=None` (DNS) asks whether the name is reachable at all."""
    for r in rules:
        if port is None or r.ports is None or port in r.ports:
            return r
    return None


@dataclass(frozen=True)
class Ruleset:
    """A compiled NetworkPolicy; build once per policy, query per connection."""

    policy: NetworkPolicy
    allow: _Index
    deny: _Index
    ask: _Index


def compile_policy(policy: NetworkPolicy) -> Ruleset:
    return Ruleset(policy, _Index(policy.allow), _Index(policy.deny), _Index(policy.ask))


def decide(rs: Ruleset, host: str | Address, port: int | None) -> Decision:
    """Decision for a destination as the client named it; `port=None` for DNS (is the name usable at all)."""
    if isinstance(host, str):
        try:
            dest = normalise(host)
        except hosts.HostError as e:
            return Decision("deny", None, f"invalid destination: {e}")
    else:
        dest = normalise(str(host))
    if port is not None and not 0 < port < 65536:
        return Decision("deny", None, f"invalid port {port}")

    def lookup(index: _Index) -> list[Rule]:
        return index.name_rules(dest) if isinstance(dest, str) else index.addr_rules(dest)

    denies = lookup(rs.deny)
    # A deny with ports only blocks those ports; for DNS only a port-less deny hides the name.
    if r := (_first_on_port(denies, port) if port is not None else next((d for d in denies if d.ports is None), None)):
        return Decision("deny", r.origin, f"denied by rule {r.describe()}")
    allow = lookup(rs.allow)
    if r := _first_on_port(allow, port):
        return Decision("allow", r.origin, f"allowed by rule {r.describe()}")
    if r := _first_on_port(lookup(rs.ask), port):
        # Approvals arrive in a later version; until then an ask is a refusal, never a silent allow.
        return Decision("ask", r.origin, f"needs approval by rule {r.describe()}")
    if allow:
        ports = sorted({p for r in allow if r.ports for p in r.ports})
        return Decision("deny", None, f"port {port} not allowed (allowed: {', '.join(map(str, ports))})")
    if not isinstance(dest, str):
        return Decision("deny", None, "IP address not in any allowed cidr")
    return Decision("deny", None, "no allow rule matches")


def special_range(ip: Address) -> str | None:
    """Why `ip` is off-limits for names (loopback, private, metadata...), or None for ordinary public addresses."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for net, why in SPECIAL_RANGES:
        if ip.version == net.version and ip in net:
            return why
    return None


def check_address(rs: Ruleset, ip: Address, port: int) -> Decision | None:
    """Veto for the address an allowed destination resolved to; None when it may be used.

    Guards against rebinding and SSRF: an allowed name that resolves to the host's
    loopback, a metadata service or a private network is refused unless a cidr
    allow rule names that range (and port) explicitly. Deny cidrs always win.
    """
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if r := _first_on_port(rs.deny.addr_rules(ip), port):
        return Decision("deny", r.origin, f"resolved address {ip} denied by rule {r.describe()}")
    why = special_range(ip)
    if why is None:
        return None
    if _first_on_port(rs.allow.addr_rules(ip), port):
        return None
    return Decision("deny", None, f"resolved to {why} address {ip}; allow it with a cidr rule if intended")
