"""The rules engine against a linear reference, plus the properties the security argument rests on."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from netguard import hosts
from netguard.policy import NetworkPolicy, Rule, parse_network
from netguard.rules import check_address, compile_policy, decide

LABELS = st.sampled_from(["a", "b", "pypi", "org", "test", "evil", "x-1", "cdn"])
NAMES = st.lists(LABELS, min_size=1, max_size=4).map(".".join)
PORTS = st.sampled_from([22, 53, 80, 443, 8080])
PORTSETS = st.one_of(st.none(), st.frozensets(PORTS, min_size=1, max_size=3))
NETS = st.sampled_from(["198.51.100.0/24", "198.51.100.7/32", "203.0.113.0/25", "10.0.0.0/8", "127.0.0.0/8",
                        "2001:db8::/32", "169.254.169.254/32"])
ADDRS = st.sampled_from(["198.51.100.7", "198.51.100.200", "203.0.113.5", "203.0.113.200", "10.1.2.3",
                         "127.0.0.1", "2001:db8::5", "2001:db9::5", "169.254.169.254", "::ffff:198.51.100.7"])


@st.composite
def rules(draw: st.DrawFn, origin: str) -> Rule:
    kind = draw(st.sampled_from(["host", "wildcard", "cidr"]))
    ports = draw(PORTSETS)
    if kind == "cidr":
        return Rule("cidr", ipaddress.ip_network(draw(NETS)), ports, origin)
    return Rule(kind, draw(NAMES), ports, origin)


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
        return r.kind == "cidr" and dest.version == r.value.version and dest in r.value  # type: ignore[union-attr, operator]

    denies = [r for r in pol.deny if matches(r) and (port is not None or r.ports is None)]
    if denies:
        return "deny"
    if any(matches(r) for r in pol.allow):
        return "allow"
    if any(matches(r) for r in pol.ask):
        return "ask"
    return "deny"


@settings(max_examples=400, deadline=None)
@given(st.lists(rules("allow"), max_size=12), st.lists(rules("deny"), max_size=4), st.lists(rules("ask"), max_size=3),
       st.one_of(NAMES, ADDRS), st.one_of(st.none(), PORTS))
def test_index_agrees_with_linear_reference(allow, deny, ask, host, port) -> None:
    pol = NetworkPolicy(tuple(allow), tuple(deny), tuple(ask))
    assert decide(compile_policy(pol), host, port).action == reference(pol, host, port)


@settings(max_examples=200, deadline=None)
@given(st.lists(rules("allow"), max_size=8), NAMES, PORTS)
def test_deny_beats_allow(allow, name, port) -> None:
    pol = NetworkPolicy(tuple(allow) + (Rule("host", name, None, "a"),), (Rule("host", name, None, "d"),))
    d = decide(compile_policy(pol), name, port)
    assert d.action == "deny" and d.rule == "d"


@settings(max_examples=200, deadline=None)
@given(st.one_of(NAMES, ADDRS), PORTS)
def test_default_deny(host, port) -> None:
    d = decide(compile_policy(NetworkPolicy()), host, port)
    assert d.action == "deny" and d.rule is None


def rs(**section):
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
    r = rs(allow=[{"host": "a.test", "ports": [8443]}, "*.b.test"], deny=[{"host": "a.test", "ports": [22]}, "x.b.test"])
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
    for bad, why in (("127.0.0.1", "loopback"), ("169.254.169.254", "link-local"), ("10.1.1.1", "private"),
                     ("192.168.1.1", "private"), ("172.16.0.1", "private"), ("0.0.0.0", "unspecified"),
                     ("224.0.0.1", "multicast"), ("::1", "loopback"), ("fd00::1", "private"), ("fe80::1", "link-local"),
                     ("::ffff:127.0.0.1", "loopback"), ("100.100.100.200", "shared")):
        v = check_address(r, ip(bad), 443)
        assert v is not None and v.action == "deny" and why in v.reason, bad
    assert check_address(r, ip("10.9.1.1"), 443) is None  # explicitly allowed range
    assert check_address(r, ip("10.9.1.1"), 80) is not None  # ...only on its ports
    v = check_address(r, ip("203.0.113.9"), 443)
    assert v is not None and "denied by rule" in v.reason
