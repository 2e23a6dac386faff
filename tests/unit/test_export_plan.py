"""Issue 27: the export plan against sandgate's own decisions: never an allow sandgate would deny, every gap said."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netguard.export import plan
from netguard.export.plan import ANY_PORT, NameRule, Plan
from netguard.policy import NetworkPolicy, parse_network
from netguard.rules import compile_policy, decide


def net(allow: list[Any] | None = None, deny: list[Any] | None = None, **more: Any) -> NetworkPolicy:
    return parse_network({"allow": allow or [], "deny": deny or [], **more}, "p.yaml")


def matches(rule: NameRule, name: str, port: int) -> bool:
    """What an engine that reads the plan literally lets through (sandgate's wildcard: strict subdomains)."""
    hit = name.endswith("." + rule.name) if rule.wildcard else name == rule.name
    return hit and any(lo <= port <= hi for lo, hi in rule.ports)


def plan_allows(p: Plan, name: str, port: int) -> bool:
    return any(matches(r, name, port) for r in p.names)


# ---- rule shapes -------------------------------------------------------------------------------------


def test_exact_names_keep_the_default_web_ports() -> None:
    p = plan.build(net(["pypi.org", {"host": "files.pythonhosted.org", "ports": [443]}]))
    assert [(r.pattern, r.ports) for r in p.names] == [
        ("pypi.org", ((80, 80), (443, 443))),
        ("files.pythonhosted.org", ((443, 443),)),
    ]
    assert p.gaps == ()


def test_a_wildcard_stays_a_wildcard_and_ports_become_ranges() -> None:
    p = plan.build(net([{"host": "*.Example.ORG", "ports": [8080, 8082, 8081, 22]}]))
    assert p.names[0] == NameRule("example.org", True, ((22, 22), (8080, 8082)), "p.yaml")
    assert p.names[0].pattern == "*.example.org"


def test_cidrs_are_networks_and_ip_hosts_too() -> None:
    p = plan.build(net(["203.0.113.0/24", {"host": "198.51.100.7", "ports": [5432]}], ["192.0.2.0/28"]))
    assert [(n.cidr, n.ports) for n in p.networks] == [
        ("203.0.113.0/24", ((80, 80), (443, 443))),
        ("198.51.100.7/32", ((5432, 5432),)),
    ]
    assert [(n.cidr, n.ports) for n in p.deny_networks] == [("192.0.2.0/28", ANY_PORT)]


def test_the_same_name_twice_is_one_rule_with_both_port_sets() -> None:
    p = plan.build(net(["pypi.org", {"host": "pypi.org", "ports": [8443]}]))
    assert [(r.pattern, r.ports) for r in p.names] == [("pypi.org", ((80, 80), (443, 443), (8443, 8443)))]


def test_a_deny_of_the_same_name_takes_it_out_and_a_port_deny_takes_its_port() -> None:
    p = plan.build(
        net(
            ["gone.test", {"host": "ssh.test", "ports": [22, 2222]}], ["gone.test", {"host": "ssh.test", "ports": [22]}]
        )
    )
    assert [(r.pattern, r.ports) for r in p.names] == [("ssh.test", ((2222, 2222),))]
    assert p.gaps == ()


def test_a_wildcard_deny_takes_out_names_and_wildcards_under_it_but_not_its_apex() -> None:
    p = plan.build(net(["a.evil.test", "*.b.evil.test", "*.evil.test", "evil.test"], ["*.evil.test"]))
    assert [r.pattern for r in p.names] == ["evil.test"]
    assert p.gaps == ()


@pytest.mark.parametrize("deny", ["x.pypi.test", "*.x.pypi.test", {"host": "x.pypi.test", "ports": [443]}])
def test_a_deny_inside_an_allowed_wildcard_is_refused(deny: Any) -> None:
    p = plan.build(net(["*.pypi.test"], [deny]))
    assert [g.severity for g in p.gaps] == ["refused"]
    assert "inside allowed *.pypi.test" in p.gaps[0].text and p.refused == p.gaps


def test_a_deny_inside_a_wildcard_on_other_ports_is_no_hole() -> None:
    p = plan.build(
        net(["*.pypi.test"], [{"host": "x.pypi.test", "ports": [22]}, "pypi.test"])
    )  # the apex is not under the wildcard
    assert p.gaps == () and [r.pattern for r in p.names] == ["*.pypi.test"]


def test_request_rules_credentials_and_ask_rules_are_reported() -> None:
    p = plan.build(
        net(
            [
                {"host": "api.test", "http": [{"methods": ["GET"], "paths": ["/ok/**"]}]},
                {"host": "log.test", "inspect": True},
            ],
            ask=["maybe.test"],
            credentials=[{"host": "api.test", "header": "Authorization", "value": "Bearer ${API_KEY}"}],
        )
    )
    kinds = [(g.severity, g.text.split(":")[0]) for g in p.gaps]
    assert kinds == [
        ("sandgate-only", "api.test"),
        ("sandgate-only", "log.test"),
        ("sandgate-only", "credential for api.test (header Authorization)"),
        ("narrowed", "ask maybe.test"),
    ]
    assert "http rules" in p.gaps[0].text and "http rules" not in p.gaps[1].text
    assert [r.pattern for r in p.names] == ["api.test", "log.test"]  # the hosts are still reachable


def test_learn_is_carried_and_name_denies_are_kept_as_written() -> None:
    p = plan.build(net(["a.test"], ["*.ads.test", {"host": "b.test", "ports": [25]}]), learn=True)
    assert p.learn and [(d.pattern, d.ports) for d in p.deny_names] == [
        ("*.ads.test", ANY_PORT),
        ("b.test", ((25, 25),)),
    ]


# ---- port arithmetic -------------------------------------------------------------------------------


def test_port_ranges_subtract_and_unite() -> None:
    assert plan.port_ranges(frozenset({1, 2, 3, 7})) == ((1, 3), (7, 7))
    assert plan.subtract(ANY_PORT, ((22, 22), (80, 443))) == ((1, 21), (23, 79), (444, 65535))
    assert plan.subtract(((80, 80),), ANY_PORT) == ()
    assert plan.union(((1, 3),), ((4, 9), (20, 20))) == ((1, 9), (20, 20))
    assert plan.overlaps(((80, 80),), ((1, 100),)) and not plan.overlaps(((80, 80),), ((81, 100),))
    assert (
        plan.describe_ports(((80, 80), (8000, 8010))) == "80,8000-8010" and plan.describe_ports(ANY_PORT) == "any port"
    )


# ---- the property: the plan allows exactly what sandgate allows --------------------------------------

LABELS = st.sampled_from(["a", "b", "c"])
SUFFIXES = st.lists(LABELS, min_size=0, max_size=2).map(lambda ls: ".".join([*ls, "x", "test"]))
PATTERNS = st.tuples(st.booleans(), SUFFIXES).map(lambda t: f"*.{t[1]}" if t[0] else t[1])
PORTS = st.sampled_from([22, 80, 443, 8080])
ENTRIES = st.tuples(PATTERNS, st.one_of(st.none(), st.lists(PORTS, min_size=1, max_size=2))).map(
    lambda t: t[0] if t[1] is None else {"host": t[0], "ports": t[1]}
)


def probes(pol: NetworkPolicy) -> list[tuple[str, int]]:
    """Each pattern's apex, a child and a grandchild, on ports in and out of every list."""
    suffixes = {str(r.value) for r in (*pol.allow, *pol.deny)}
    names = [n for s in sorted(suffixes) for n in (s, f"a.{s}", f"b.a.{s}")]
    return [(n, port) for n in names for port in (9, 22, 80, 443, 8080)]


@settings(max_examples=300, deadline=None)
@given(st.lists(ENTRIES, min_size=1, max_size=4), st.lists(ENTRIES, max_size=3))
def test_without_refusals_the_plan_allows_exactly_what_sandgate_allows(allow: list[Any], deny: list[Any]) -> None:
    pol = net(allow, deny)
    p = plan.build(pol)
    rs = compile_policy(pol)
    widened = [(n, port) for n, port in probes(pol) if plan_allows(p, n, port) and not decide(rs, n, port).allowed]
    if p.refused:  # the refusal is real: read literally, the plan would let through a name sandgate denies
        assert widened
        return
    for name, port in probes(pol):
        assert plan_allows(p, name, port) == decide(rs, name, port).allowed, (name, port)
