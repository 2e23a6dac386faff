"""The rules engine against a linear reference, plus the properties the security argument rests on."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netguard import hosts
from netguard.policy import NetworkPolicy, Rule, parse_network
from netguard.rules import (
    DNS_ADDRESS_TYPES,
    DNS_EMPTY_TYPES,
    SPECIAL,
    SPECIAL_RANGES,
    Address,
    Network,
    PrefixTable,
    Ruleset,
    check_address,
    compile_policy,
    decide,
    dns_types,
    embedded_ipv4,
    own_table,
)
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError

LABELS = st.sampled_from(["a", "b", "pypi", "org", "test", "evil", "x-1", "cdn"])
NAMES = st.lists(LABELS, min_size=1, max_size=4).map(".".join)
PORTS = st.sampled_from([22, 53, 80, 443, 8080])
PORTSETS = st.one_of(st.none(), st.frozensets(PORTS, min_size=1, max_size=3))
NETS = st.sampled_from(
    [
        "198.51.100.0/24",
        "198.51.100.7/32",
        "203.0.113.0/25",
        "10.0.0.0/8",
        "127.0.0.0/8",
        "2001:db8::/32",
        "169.254.169.254/32",
    ]
)
ADDRS = st.sampled_from(
    [
        "198.51.100.7",
        "198.51.100.200",
        "203.0.113.5",
        "203.0.113.200",
        "10.1.2.3",
        "127.0.0.1",
        "2001:db8::5",
        "2001:db9::5",
        "169.254.169.254",
        "::ffff:198.51.100.7",
    ]
)


@st.composite
def rules(draw: st.DrawFn, origin: Origin) -> Rule:
    kind = draw(st.sampled_from(["host", "wildcard", "cidr"]))
    ports = draw(PORTSETS)
    if kind == "cidr":
        return Rule("cidr", ipaddress.ip_network(draw(NETS)), ports, origin)
    return Rule("host" if kind == "host" else "wildcard", draw(NAMES), ports, origin)


def reference(pol: NetworkPolicy, host: str, port: int | None) -> str:
    """The obvious linear implementation the index must agree with."""
    dest = hosts.normalise(host)

    def matches(r: Rule) -> bool:
        if port is not None and r.ports is not None and port not in r.ports:
            return False
        if isinstance(dest, str):
            if r.kind == "host":
                return dest == r.value
            if r.kind == "wildcard":
                return dest.endswith("." + str(r.value))
            return False
        net = r.value
        return not isinstance(net, str) and dest.version == net.version and dest in net

    denies = [r for r in pol.deny if matches(r) and (port is not None or r.ports is None)]
    if denies:
        return "deny"
    if any(matches(r) for r in pol.allow):
        return "allow"
    if any(matches(r) for r in pol.ask):
        return "ask"
    return "deny"


@settings(max_examples=400, deadline=None)
@given(
    st.lists(rules(Origin("allow")), max_size=12),
    st.lists(rules(Origin("deny")), max_size=4),
    st.lists(rules(Origin("ask")), max_size=3),
    st.one_of(NAMES, ADDRS),
    st.one_of(st.none(), PORTS),
)
def test_index_agrees_with_linear_reference(
    allow: list[Rule], deny: list[Rule], ask: list[Rule], host: str, port: int | None
) -> None:
    pol = NetworkPolicy(tuple(allow), tuple(deny), tuple(ask))
    assert decide(compile_policy(pol), host, port).action == reference(pol, host, port)


@settings(max_examples=200, deadline=None)
@given(st.lists(rules(Origin("allow")), max_size=8), NAMES, PORTS)
def test_deny_beats_allow(allow: list[Rule], name: str, port: int) -> None:
    pol = NetworkPolicy((*allow, Rule("host", name, None, Origin("a"))), (Rule("host", name, None, Origin("d")),))
    d = decide(compile_policy(pol), name, port)
    assert d.action == "deny" and d.rule == "d"


@settings(max_examples=200, deadline=None)
@given(st.one_of(NAMES, ADDRS), PORTS)
def test_default_deny(host: str, port: int) -> None:
    d = decide(compile_policy(NetworkPolicy()), host, port)
    assert d.action == "deny" and d.rule is None


def rs(**section: Any) -> Ruleset:
    return compile_policy(parse_network(section, "t.yaml"))


def test_wildcard_matches_subdomains_not_apex_nor_lookalikes() -> None:
    r = rs(allow=[{"host": "*.pythonhosted.org", "ports": [443]}])
    assert decide(r, "files.pythonhosted.org", 443).allowed
    assert decide(r, "a.b.pythonhosted.org", 443).allowed
    assert not decide(r, "pythonhosted.org", 443).allowed
    assert not decide(r, "evilpythonhosted.org", 443).allowed
    assert not decide(r, "pythonhosted.org.evil.test", 443).allowed
    assert not decide(r, "files.pythonhosted.org", 80).allowed


def test_names_are_normalised_before_matching() -> None:
    r = rs(allow=["bücher.example", "pypi.org"])
    for spelling in ("PyPI.org", "pypi.org.", "PYPI.ORG."):
        assert decide(r, spelling, 443).allowed
    assert decide(r, "xn--bcher-kva.example", 443).allowed
    assert decide(r, "BÜCHER.example", 80).allowed


def test_default_ports_and_port_rules() -> None:
    r = rs(allow=["a.test", {"host": "b.test", "ports": [8443]}])
    assert decide(r, "a.test", 80).allowed and decide(r, "a.test", 443).allowed
    assert not decide(r, "a.test", 22).allowed
    d = decide(r, "b.test", 443)
    assert not d.allowed and "port 443 not allowed (allowed: 8443)" in d.reason
    assert decide(r, "b.test", 8443).allowed


def test_ip_literals_match_only_cidr_rules_in_every_spelling() -> None:
    r = rs(allow=["a.test", {"cidr": "203.0.113.0/24", "ports": [8080]}], deny=["203.0.113.66"])
    for spelling in ("203.0.113.5", "0xcb.0.113.5", "3405803781", "::ffff:203.0.113.5", "[::ffff:cb00:7105]"):
        assert decide(r, spelling, 8080).allowed, spelling
    assert not decide(r, "203.0.113.5", 443).allowed
    assert decide(r, "203.0.113.66", 8080).action == "deny"
    assert not decide(r, "198.51.100.1", 80).allowed  # a name rule never admits an address


def test_invalid_destination_is_denied() -> None:
    r = rs(allow=["a.test"])
    for bad in ("", "a..test", "a.test..", "exa mple.test", "1.2.3.4.5"):
        d = decide(r, bad, 443)
        assert d.action == "deny" and "invalid destination" in d.reason, bad
    assert not decide(r, "a.test", 0).allowed


def test_dns_decisions_ignore_ports_but_respect_portless_denies() -> None:
    r = rs(
        allow=[{"host": "a.test", "ports": [8443]}, "*.b.test"], deny=[{"host": "a.test", "ports": [22]}, "x.b.test"]
    )
    assert decide(r, "a.test", None).allowed  # resolvable: some port is allowed, port-specific deny does not hide it
    assert decide(r, "y.b.test", None).allowed
    assert not decide(r, "x.b.test", None).allowed
    assert not decide(r, "c.test", None).allowed


def test_ask_is_reported_as_ask() -> None:
    r = rs(ask=["up.test"])
    assert decide(r, "up.test", 443).action == "ask"


def test_resolved_address_veto() -> None:
    r = rs(allow=["a.test", {"cidr": "10.9.0.0/16", "ports": [443]}], deny=[{"cidr": "203.0.113.0/24"}])
    ip = ipaddress.ip_address
    assert check_address(r, ip("198.51.100.7"), 443) is None
    for bad, why in (
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.1.1.1", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("::1", "loopback"),
        ("fd00::1", "private"),
        ("fe80::1", "link-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("100.100.100.200", "shared"),
    ):
        v = check_address(r, ip(bad), 443)
        assert v is not None and v.action == "deny" and why in v.reason, bad
    assert check_address(r, ip("10.9.1.1"), 443) is None  # explicitly allowed range
    assert check_address(r, ip("10.9.1.1"), 80) is not None  # ...only on its ports
    v = check_address(r, ip("203.0.113.9"), 443)
    assert v is not None and "denied by rule" in v.reason


# ---- the address veto: special-purpose ranges, the host's own addresses, embedded IPv4 ------------

V4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
V6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)


@st.composite
def near_a_range(draw: st.DrawFn) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address at or next to the edge of one of the special ranges: where an index gets it wrong."""
    net, _ = draw(st.sampled_from(SPECIAL_RANGES))
    edge = int(draw(st.sampled_from([net.network_address, net.broadcast_address])))
    value = min(max(edge + draw(st.integers(-2, 2)), 0), 2**net.max_prefixlen - 1)
    return ipaddress.ip_address(value) if net.version == 4 and value < 2**32 else ipaddress.IPv6Address(value)


def linear_lookup(entries: Iterable[tuple[Network, str]], ip: Address) -> str | None:
    """The obvious reference: the reason of the longest network holding ip, first listed on a tie."""
    best: tuple[Network, str] | None = None
    for net, why in entries:
        if net.version == ip.version and ip in net and (best is None or net.prefixlen > best[0].prefixlen):
            best = (net, why)
    return best[1] if best else None


@settings(max_examples=1500, deadline=None)
@given(st.one_of(V4, V6, near_a_range()))
def test_special_table_agrees_with_linear_reference(ip: Address) -> None:
    assert SPECIAL.lookup(ip) == linear_lookup(SPECIAL_RANGES, ip)


TABLE_NETS = st.one_of(
    st.builds(
        lambda v, p: ipaddress.IPv4Network((v >> (32 - p) << (32 - p), p)),
        st.integers(0, 2**32 - 1),
        st.integers(1, 32),
    ),
    st.builds(
        lambda v, p: ipaddress.IPv6Network((v >> (128 - p) << (128 - p), p)),
        st.integers(0, 2**128 - 1),
        st.integers(1, 128),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(TABLE_NETS, st.sampled_from(["a", "b", "c"])), max_size=10), st.data())
def test_prefix_table_agrees_with_linear_reference(entries: list[tuple[Network, str]], data: st.DataObject) -> None:
    table = PrefixTable(entries)
    inside = [
        st.integers(int(n.network_address), int(n.broadcast_address)).map(
            ipaddress.IPv4Address if n.version == 4 else ipaddress.IPv6Address
        )
        for n, _ in entries
    ]
    for _ in range(5):
        ip = data.draw(st.one_of(V4, V6, *inside))
        assert table.lookup(ip) == linear_lookup(entries, ip)


@pytest.mark.parametrize(("net", "why"), SPECIAL_RANGES, ids=[str(n) for n, _ in SPECIAL_RANGES])
def test_every_special_range_is_vetoed_at_both_ends_and_reopened_by_its_cidr(net: Network, why: str) -> None:
    closed, opened = rs(allow=["a.test"]), rs(allow=["a.test", {"cidr": str(net), "ports": [443]}])
    for ip in (net.network_address, net.broadcast_address):
        expected = SPECIAL.lookup(ip)  # a more specific range inside may give its own reason
        v = check_address(closed, ip, 443)
        assert v is not None and v.action == "deny" and v.rule is None, ip
        assert f"resolved to {expected} address {ip}" in v.reason
        if expected == why:
            reopened = check_address(opened, ip, 443)
            if isinstance(ip, ipaddress.IPv6Address) and embedded_ipv4(ip):  # 2002:: embeds 0.0.0.0: still vetoed
                assert reopened is not None and f"resolved to {ip}, which embeds" in reopened.reason
            else:
                assert reopened is None, ip
            assert check_address(opened, ip, 80) is not None  # ...only on its ports


def test_test_world_ranges_and_public_addresses_pass() -> None:
    r = rs(allow=["a.test"])
    ip = ipaddress.ip_address
    # 198.51.100.0/24 and 198.18.0.0/15 stay open on purpose (the test worlds, fake-IP resolvers).
    for ok in (
        "198.51.100.7",
        "198.18.0.1",
        "198.19.255.254",
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700::1111",
        "192.0.2.1",
        "203.0.113.80",
        "2001:db8::5",
        "3fff::1",  # documentation: registry mirrors use them
        "2001:4860:4860::8888",
        "2a00:1450::1",
        "::ffff:198.51.100.7",
        "2001:200::1",
    ):
        assert check_address(r, ip(ok), 443) is None, ok
    for bad, why in (
        ("192.0.0.8", "IETF"),
        ("255.255.255.255", "limited broadcast"),
        ("240.0.0.1", "reserved"),
        ("192.88.99.1", "6to4"),
        ("2001::1", "Teredo"),
        ("2001:2::1", "IETF protocol"),
        ("64:ff9b:1::1", "local-use NAT64"),
        ("100::1", "discard"),
        ("5f00::1", "SRv6"),
        ("fec0::1", "site-local"),
        ("::7f00:1", "reserved"),
        ("4000::1", "reserved"),
        ("::ffff:10.1.2.3", "private"),
    ):
        v = check_address(r, ip(bad), 443)
        assert v is not None and why in v.reason, bad


def test_embedded_ipv4_is_judged_even_when_the_translation_prefix_is_allowed() -> None:
    ip = ipaddress.ip_address
    closed = rs(allow=["a.test"])
    v = check_address(closed, ip("2002:7f00:1::1"), 443)
    assert v is not None and "6to4" in v.reason  # the prefix itself first
    opened = rs(allow=["a.test", {"cidr": "2002::/16"}, {"cidr": "64:ff9b::/96"}, {"cidr": "2001::/32"}])
    for addr, inner, why in (
        ("2002:7f00:1::1", "127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "169.254.169.254", "link-local (cloud metadata)"),
        ("64:ff9b::10.0.0.1", "10.0.0.1", "private"),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1", "private"),
    ):  # Teredo client
        v = check_address(opened, ip(addr), 443)
        assert v is not None and v.reason.startswith(f"resolved to {ip(addr)}, which embeds {why} address {inner}"), v
    assert check_address(opened, ip("64:ff9b::808:808"), 443) is None  # NAT64 to a public address
    assert check_address(opened, ip("2002:808:808::1"), 443) is None
    both = rs(allow=["a.test", {"cidr": "2002::/16"}, {"cidr": "127.0.0.0/8"}])
    assert check_address(both, ip("2002:7f00:1::1"), 443) is None  # each part reopened explicitly
    denied = rs(allow=["a.test", {"cidr": "64:ff9b::/96"}], deny=[{"cidr": "8.8.8.0/24"}])
    v = check_address(denied, ip("64:ff9b::808:808"), 443)
    assert v is not None and "embeds address 8.8.8.8 (denied by rule 8.8.8.0/24)" in v.reason


def test_the_hosts_own_addresses_are_vetoed_unless_a_cidr_allows_them() -> None:
    ip, net = ipaddress.ip_address, ipaddress.ip_network
    own = own_table(
        [
            net("8.8.4.4/32"),
            net("2606:4700::5/128"),
            net("100.1.0.0/24"),
            net("198.51.100.10/32"),
            net("198.18.1.1/32"),
            net("127.0.0.0/8"),
        ]
    )
    r = rs(allow=["a.test", {"cidr": "100.1.0.7/32", "ports": [443]}], deny=[{"cidr": "8.8.4.0/24", "ports": [22]}])
    for bad in ("8.8.4.4", "2606:4700::5", "100.1.0.200", "198.18.1.1", "::ffff:8.8.4.4"):
        v = check_address(r, ip(bad), 443, own)
        assert v is not None and "resolved to this host's own address" in v.reason, bad
        assert check_address(r, ip(bad), 443) is None, bad  # not special: only `own` vetoes it
    assert check_address(r, ip("127.0.0.1"), 443, own).reason.startswith("resolved to loopback")  # type: ignore[union-attr]
    assert check_address(r, ip("198.51.100.10"), 443, own) is None  # OWN_EXEMPT: the test worlds' fake hosts
    assert check_address(r, ip("100.1.0.7"), 443, own) is None  # an explicit cidr allow reopens it
    assert check_address(r, ip("100.1.0.7"), 80, own) is not None
    assert check_address(r, ip("8.8.4.4"), 22, own).reason.endswith("(denied by rule 8.8.4.0/24:22)")  # type: ignore[union-attr]
    assert check_address(r, ip("8.8.4.5"), 443, own) is None  # a neighbour on the host's subnet is not the host
    assert check_address(r, ip("64:ff9b::808:404"), 443, own).reason.startswith("resolved to NAT64")  # type: ignore[union-attr]


def test_dns_types_for_exact_and_wildcard_names() -> None:
    r = rs(
        allow=[
            "exact.w.test",
            "*.w.test",
            {"host": "*.t.w.test", "dns": ["TXT"]},
            {"host": "*.w.test", "ports": [8443], "dns": ["srv"]},
        ]
    )
    assert dns_types(r, "exact.w.test") is None  # an exact rule: every type
    assert dns_types(r, "Other.W.Test") == DNS_ADDRESS_TYPES | {33}  # SRV from the second *.w.test entry
    assert dns_types(r, "a.t.w.test") == DNS_ADDRESS_TYPES | {16, 33}  # TXT and SRV: the union of its wildcards
    assert {1, 28} == DNS_ADDRESS_TYPES and {64, 65} == DNS_EMPTY_TYPES


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"host": "exact.test", "dns": ["TXT"]}, "only for wildcard hosts"),
        ({"cidr": "192.0.2.0/24", "dns": ["TXT"]}, "only for wildcard hosts"),
        ({"host": "*.w.test", "dns": []}, "'dns' is empty"),
        ({"host": "*.w.test", "dns": ["TXTT"]}, "unknown query type 'TXTT'"),
        ({"host": "*.w.test", "dns": ["ANY"]}, "ANY is not a record type"),
        ({"host": "*.w.test", "dns": ["AXFR"]}, "AXFR is not a record type"),
        ({"host": "*.w.test", "dns": [16]}, "query type names like TXT, not a number"),
    ],
)
def test_dns_knob_errors(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_network({"allow": [entry]}, "p.yaml")


def test_dns_knob_only_on_allow_entries_and_its_forms() -> None:
    for which in ("deny", "ask"):
        with pytest.raises(PolicyError, match=f"'dns' belongs on allow entries, not {which} entries"):
            parse_network({which: [{"host": "*.w.test", "dns": ["TXT"]}]}, "p.yaml")
    pol = parse_network(
        {"allow": [{"host": "*.w.test", "dns": "txt"}, {"host": "*.v.test", "dns": ["SRV", "TYPE65280"]}, "*.u.test"]},
        "p.yaml",
    )
    assert [r.dns for r in pol.allow] == [frozenset({16}), frozenset({33, 65280}), None]
