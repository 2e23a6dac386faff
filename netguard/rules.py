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

Where an allowed name resolved is judged again (check_address): special-purpose ranges and
the proxy host's own addresses are refused unless a cidr rule covers them, and dns_types says
which DNS query types a name may be asked for (all for exact names, addresses for wildcards).
"""

from __future__ import annotations

import functools
import ipaddress
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from netguard import hosts
from netguard.httprules import HttpRule
from netguard.policy import NetworkPolicy, Rule

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Action = Literal["allow", "deny", "ask"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class PrefixTable:
    """Networks, each with a reason; longest-prefix lookup in O(distinct prefix lengths), never O(networks).

    The veto runs on every connection: a handful of dict probes, not a scan over dozens of ranges.
    """

    __slots__ = ("_levels",)

    def __init__(self, entries: Iterable[tuple[Network, str]]) -> None:
        by_len: dict[tuple[int, int], dict[int, str]] = defaultdict(dict)
        for net, why in entries:
            shift = net.max_prefixlen - net.prefixlen
            by_len[(net.version, net.prefixlen)].setdefault(int(net.network_address) >> shift, why)
        # Per version, longest prefix first: the first hit is the most specific range and its reason.
        levels: dict[int, list[tuple[int, dict[int, str]]]] = {4: [], 6: []}
        for (version, plen), nets in sorted(by_len.items(), key=lambda kv: -kv[0][1]):
            levels[version].append(((32 if version == 4 else 128) - plen, nets))
        self._levels = {version: tuple(found) for version, found in levels.items()}

    def lookup(self, ip: Address) -> str | None:
        """The reason of the most specific network holding `ip`, None when none does."""
        value = int(ip)
        for shift, nets in self._levels[ip.version]:
            why = nets.get(value >> shift)
            if why is not None:
                return why
        return None


# Where an allowed *name* must not lead: the sandbox's own host, its cloud metadata service, the
# operator's private networks (SSRF / DNS rebinding), and every address the IANA special-purpose
# registries say is not an ordinary destination on the internet. Only an explicit cidr allow rule
# covering the address (on that port) reopens it: names never reach further than address rules would.
#
# Deliberately NOT here (would also break every end-to-end test):
#   192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 (and IPv6 2001:db8::/32, 3fff::/20): documentation
#                    space. TEST-NET-2 is the test worlds' fake internet (selftest/world.py), and
#                    private package mirrors answer from these ranges in the wild (on the machines this
#                    project is built on, every registry resolves to 203.0.113.80). They reach no host
#                    service of ours, so refusing them would only break real work.
#   198.18.0.0/15    benchmarking: the test worlds' sandbox links and netguard.decision.dns.PENDING_ADDRESS, and on
#                    real hosts the answers of fake-IP resolvers (Clash, sing-box) whose TUN routes every
#                    allowed name through 198.18/15. An address of it that this host holds (a link end,
#                    a TUN address) is still refused as one of the host's own (OWN_EXEMPT below).
SPECIAL_RANGES: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.88.99.0/24", "6to4 relay anycast (deprecated)"),
        ("192.168.0.0/16", "private"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("255.255.255.255/32", "limited broadcast"),
        # IPv6. ::ffff:0:0/96 (IPv4-mapped) is not listed: check_address judges its embedded IPv4
        # address instead, which is what a dual-stack socket connects to.
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b::/96", "NAT64 (embeds an IPv4 address)"),
        ("64:ff9b:1::/48", "local-use NAT64 (embeds an IPv4 address)"),
        ("100::/64", "discard-only"),
        ("100:0:0:1::/64", "dummy prefix"),
        ("2001::/23", "IETF protocol assignment"),
        ("2001::/32", "Teredo (embeds an IPv4 address)"),
        ("2002::/16", "6to4 (embeds an IPv4 address)"),
        ("5f00::/16", "SRv6 segment identifiers"),
        ("fc00::/7", "private (unique local)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
        # Everything outside global unicast 2000::/3 that the lines above leave: unassigned, IETF reserved.
        ("::/3", "reserved (not global unicast)"),
        ("4000::/2", "reserved (not global unicast)"),
        ("8000::/1", "reserved (not global unicast)"),
    )
)
SPECIAL = PrefixTable(SPECIAL_RANGES)

#: Addresses of this host that stay usable for names: the test worlds' fake hosts are addresses of the
#: very namespace the proxy runs in (see SPECIAL_RANGES). Real hosts never hold TEST-NET-2.
OWN_EXEMPT: tuple[Network, ...] = (ipaddress.ip_network("198.51.100.0/24"),)
OWN_REASON = "this host's own"

#: Pure, so memoised: the same few names are decided on every connection of a task.
normalise = functools.lru_cache(maxsize=4096)(hosts.normalise)


@dataclass(frozen=True)
class Decision:
    """A verdict on one destination: allow or deny, the deciding rule's origin, and why."""

    action: Action
    rule: str | None  # origin of the deciding rule, as the audit prints it; None for the default
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
    """The policy's index, built once per policy object: the daemon's cache of decoded policies
    (netguard.daemon.policycache) hands every bind of the same 10^5 names the same object."""
    found: Ruleset | None = policy.__dict__.get("_compiled")
    if found is None:
        found = Ruleset(policy, _Index(policy.allow), _Index(policy.deny), _Index(policy.ask))
        object.__setattr__(policy, "_compiled", found)  # a memo on an immutable value, like cached_property
    return found


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
        return Decision("deny", r.origin_text, f"denied by rule {r.describe()}")
    allow = lookup(rs.allow)
    if r := _first_on_port(allow, port):
        return Decision("allow", r.origin_text, f"allowed by rule {r.describe()}")
    if r := _first_on_port(lookup(rs.ask), port):
        # Pure: the caller asks (netguard.asking); no channel, no answer or a refusal all mean deny.
        return Decision("ask", r.origin_text, f"needs approval by rule {r.describe()}")
    if allow:
        ports = sorted({p for r in allow if r.ports for p in r.ports})
        return Decision("deny", None, f"port {port} not allowed (allowed: {', '.join(map(str, ports))})")
    if not isinstance(dest, str):
        return Decision("deny", None, "IP address not in any allowed cidr")
    return Decision("deny", None, "no allow rule matches")


def own_table(addresses: Iterable[Network]) -> PrefixTable:
    """The host's own addresses (and local routes) as a veto table; OWN_EXEMPT ranges left out."""
    return PrefixTable(
        (net, OWN_REASON)
        for net in addresses
        if not any(net.network_address in ex and net.broadcast_address in ex for ex in OWN_EXEMPT)
    )


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses a translation prefix (NAT64 64:ff9b::/96, 6to4, Teredo server and client) carries."""
    value = int(ip)
    if value >> 32 == _NAT64_WKP:
        return (ipaddress.IPv4Address(value & 0xFFFFFFFF),)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    return ()


_NAT64_WKP = int(ipaddress.IPv6Address("64:ff9b::")) >> 32


def check_address(rs: Ruleset, ip: Address, port: int, own: PrefixTable | None = None) -> Decision | None:
    """Veto for the address an allowed destination resolved to; None when it may be used.

    Guards against rebinding and SSRF: an allowed name that resolves to the host's loopback or one of
    its own addresses (`own`: every interface address, public ones too, from netguard.localaddrs), a
    metadata service, a private network or any other special-purpose range is refused unless a cidr
    allow rule covers the address (on that port). Deny cidrs always win. An IPv6 address that embeds
    an IPv4 one (NAT64, 6to4, Teredo) must pass for both: reopening a translation prefix with a cidr
    rule does not reopen the loopback or metadata address it translates to.
    """
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # what a dual-stack socket really connects to
    if (veto := _veto(rs, ip, port, own)) is not None:
        return Decision("deny", veto[0], f"resolved to {veto[1]}")
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in embedded_ipv4(ip):
            if (veto := _veto(rs, inner, port, own)) is not None:
                return Decision("deny", veto[0], f"resolved to {ip}, which embeds {veto[1]}")
    return None


def _veto(rs: Ruleset, ip: Address, port: int, own: PrefixTable | None) -> tuple[str | None, str] | None:
    """(deciding rule, what is wrong) when `ip` must not be reached through a name, else None."""
    if r := _first_on_port(rs.deny.addr_rules(ip), port):
        return str(r.origin), f"address {ip} (denied by rule {r.describe()})"
    why = SPECIAL.lookup(ip) or (own.lookup(ip) if own is not None else None)
    if why is None or _first_on_port(rs.allow.addr_rules(ip), port):
        return None
    return None, f"{why} address {ip}; allow it with a cidr rule if intended"


# ---- DNS: which query types a name may be asked for ------------------------------------------------

#: Forwarded for a name allowed only through a wildcard rule: the address types. Their answers bring
#: the CNAME chain leading to the addresses along (netguard.decision.dns keeps exactly that chain).
DNS_ADDRESS_TYPES: frozenset[int] = frozenset({1, 28})  # A, AAAA
#: Answered empty (NOERROR, no records) without asking upstream for such a name: SVCB and HTTPS, which
#: browsers and curl ask beside A/AAAA and, finding nothing, fall back from at once (REFUSED would make
#: glibc and c-ares count a server failure and retry). Their records could carry data (SvcParams).
DNS_EMPTY_TYPES: frozenset[int] = frozenset({64, 65})  # SVCB, HTTPS


def dns_types(rs: Ruleset, name: str) -> frozenset[int] | None:
    """Query types an allowed `name` may be forwarded with; None: every type (an exact host rule names it).

    A wildcard allow is a two-way channel to whoever runs that domain (see netguard.decision.dns), so a name
    matched only by wildcard rules gets the address types plus what those rules list under `dns:`.
    """
    try:
        dest = normalise(name)
    except hosts.HostError:
        return DNS_ADDRESS_TYPES
    if not isinstance(dest, str):
        return None
    found = rs.allow.name_rules(dest)
    if any(r.kind == "host" for r in found):
        return None
    extra = frozenset(t for r in found if r.dns for t in r.dns)
    return DNS_ADDRESS_TYPES | extra


# ---- inspection: which allowed destinations have their requests judged one by one -----------------


@dataclass(frozen=True)
class Inspection:
    """How an inspected destination's requests are judged (netguard.httprules.decide_request)."""

    http: tuple[HttpRule, ...] | None  # None: every request allowed (and audited)
    log_query: bool
    origin: str  # the first inspecting entry's origin, as the audit's `rule` prints it


def inspection(rs: Ruleset, host: str, port: int) -> Inspection | None:
    """The request rules for `host:port` when an allow entry covering it inspects, else None (passthrough).

    Only inspecting entries count: an entry for the same host without `http:` (a bundled list, a
    plain --allow) never widens what an inspecting one allows. Deny beats allow here too.
    """
    try:
        dest = normalise(host)
    except hosts.HostError:
        return None
    if not isinstance(dest, str):
        return None
    found = [r for r in rs.allow.name_rules(dest) if r.inspect and (r.ports is None or port in r.ports)]
    if not found:
        return None
    http = None if any(r.http is None for r in found) else tuple(h for r in found for h in r.http or ())
    return Inspection(http, any(r.log_query for r in found), str(found[0].origin))
