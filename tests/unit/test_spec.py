"""BindingSpec <-> plain JSON: every spec survives the trip, and decode refuses what encode never makes."""

from __future__ import annotations

import copy
import ipaddress
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.credentials import Secret
from netguard.httprules import HttpRule
from netguard.policy import NetworkPolicy, Rule, parse_network
from netguard.spec import BindingSpec, CaPair, SpecError, decode, encode
from sgbase.origin import Origin

label = st.from_regex(r"[a-z][a-z0-9_-]{0,8}[a-z0-9]", fullmatch=True).filter(lambda s: not s.startswith("xn--"))
name = st.lists(label, min_size=1, max_size=4).map(".".join)
ports = st.none() | st.frozensets(st.integers(1, 65535), min_size=1, max_size=5)
origin = st.builds(Origin, st.text(max_size=30), st.none() | st.integers(1, 10**6))
v4 = st.builds(lambda a, p: ipaddress.ip_network((a, p), strict=False), st.integers(0, 2**32 - 1), st.integers(1, 32))
v6: st.SearchStrategy[ipaddress.IPv4Network | ipaddress.IPv6Network] = st.builds(
    lambda a, p: ipaddress.ip_network((a, p), strict=False), st.integers(2**33, 2**128 - 1), st.integers(1, 128)
).filter(lambda n: getattr(n.network_address, "ipv4_mapped", None) is None)
method = st.from_regex(r"[A-Z]{1,8}", fullmatch=True)
pattern = st.lists(st.sampled_from(["*", "**", "a", "info", "refs", "%2F", "x.git", "-"]), max_size=4).map(
    lambda segs: "/" + "/".join(segs)
)
http_rule = st.builds(
    HttpRule,
    st.none() | st.frozensets(method, min_size=1, max_size=3),
    st.none() | st.lists(pattern, min_size=1, max_size=3).map(tuple),
    origin,
)
inspecting = st.builds(
    lambda kind, n, p, o, http, q: Rule(kind, n, p, o, None, True, http, q),
    st.sampled_from(["host", "wildcard"]),
    name,
    ports,
    origin,
    st.none() | st.lists(http_rule, min_size=1, max_size=3).map(tuple),
    st.booleans(),
)
rule = st.one_of(
    st.builds(Rule, st.just("host"), name, ports, origin),
    st.builds(Rule, st.just("wildcard"), name, ports, origin),
    st.builds(Rule, st.just("cidr"), v4 | v6, ports, origin),
    inspecting,
)
text = st.text(st.characters(categories=["L", "N", "P"]), min_size=1, max_size=30)
secret = st.builds(
    lambda host, real, sentinel, o: Secret(host, "Authorization", f"Bearer {real}", real, sentinel, "VAR", o),
    name,
    text,
    text,
    origin,
)
rules = st.lists(rule, max_size=6).map(tuple)
plain_rules = st.lists(rule.filter(lambda r: not r.inspect), max_size=6).map(tuple)  # only allow rules inspect
resolver = st.none() | st.tuples(st.ip_addresses().map(str), st.integers(1, 65535))
policy = st.builds(NetworkPolicy, rules, plain_rules, plain_rules, resolver, st.none() | origin)
spec = st.builds(
    BindingSpec,
    st.text(st.characters(categories=["L", "N", "P"]), min_size=1, max_size=40),
    policy,
    st.booleans(),
    st.booleans(),
    st.none() | st.text(max_size=20).map(lambda s: "/" + s.replace("\0", "")),
    st.floats(0.001, 1e6),
    st.just(CaPair("-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----")),
    st.none() | st.just("-----BEGIN CERTIFICATE-----"),
    st.lists(secret, max_size=2).map(tuple),
)


@given(spec)
def test_round_trip_through_json(s: BindingSpec) -> None:
    wire = json.loads(json.dumps(encode(s)))
    back = decode(wire)
    assert back == s
    assert back.policy.resolver_origin == s.policy.resolver_origin  # compare=False in the dataclass
    assert encode(back) == encode(s)


def test_a_parsed_policy_round_trips() -> None:
    pol = parse_network(
        {
            "allow": [
                "PyPI.org.",
                "*.pythonhosted.org",
                "192.0.2.1",
                {"cidr": "10.0.0.0/8", "ports": [22, 80]},
                {"host": "x.test", "ports": [8443]},
            ],
            "deny": ["evil.pypi.org"],
            "ask": ["ask.test"],
            "resolver": "[2001:db8::1]:5353",
        },
        "p.yaml",
    )
    s = BindingSpec("task-1", pol, learn=True, approval_socket="/run/x.sock", ask_timeout=5)
    enc = encode(s)
    assert enc["policy"]["allow"][0] == {
        "kind": "host",
        "value": "pypi.org",
        "ports": [80, 443],
        "origin": ["p.yaml", None],
        "dns": None,
        "inspect": False,
        "http": None,
        "log_query": False,
    }
    assert enc["policy"]["allow"][3]["ports"] == [22, 80] and enc["policy"]["deny"][0]["ports"] is None
    assert enc["policy"]["resolver"] == ["2001:db8::1", 5353]
    assert decode(enc) == s


def good() -> dict[str, Any]:
    return encode(BindingSpec("t", parse_network({"allow": ["a.test", {"cidr": "127.0.0.0/8"}]}, "p")))


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    *head, last = path.split(".")
    cur: Any = obj
    for k in head:
        cur = cur[int(k)] if isinstance(cur, list) else cur[k]
    if value is KeyError:
        del cur[last]
    elif isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("task", "", "task must be a non-empty"),
        ("task", "a\nb", "printable"),
        ("task", 7, "task must be a string"),
        ("learn", 1, "learn must be true or false"),
        ("ask_timeout", True, "ask_timeout"),
        ("ask_timeout", float("inf"), "ask_timeout"),
        ("ask_timeout", -1, "ask_timeout"),
        ("approval_socket", "rel/path.sock", "absolute"),
        ("extra", 1, "unknown extra"),
        ("learn", KeyError, "missing learn"),
        ("policy", [], "policy must be an object"),
        ("policy.allow", {}, "policy.allow must be a list"),
        ("policy.allow.0.kind", "regex", "kind must be one of"),
        ("policy.allow.0.value", "A.test", "not in canonical form"),
        ("policy.allow.0.value", "a..test", "empty label"),
        ("policy.allow.0.value", "192.0.2.1", "IP address where a name is required"),
        ("policy.allow.0.ports", [0], "ports must be"),
        ("policy.allow.0.ports", [True], "ports must be"),
        ("policy.allow.0.ports", "80", "ports must be"),
        ("policy.allow.0.origin", None, "origin must be [FILE, LINE]"),
        ("policy.allow.0.origin", "p:1", "origin must be [FILE, LINE]"),
        ("policy.allow.0.origin", ["p", 0], "line is a whole number from 1"),
        ("policy.allow.0.origin", ["p", True], "origin must be [FILE, LINE]"),
        ("policy.allow.1.value", "10.0.0.1/8", "host bits set"),
        ("policy.allow.1.value", "0.0.0.0/0", "covers every address"),
        ("policy.allow.1.value", "::ffff:10.0.0.0/104", "IPv4-mapped"),
        ("policy.resolver", ["1.2.3.4"], "[IP, PORT]"),
        ("policy.resolver", ["1.2.3.4", 0], "port number from 1 to 65535"),
        ("policy.resolver", ["dns.test", 53], "not an IP address"),
        ("policy.resolver", ["2001:DB8::1", 53], "canonical"),
        ("policy.resolver_origin", 5, "resolver_origin must be [FILE, LINE]"),
    ],
)
def test_decode_refuses(path: str, value: Any, message: str) -> None:
    with pytest.raises(SpecError) as e:
        decode(_set(good(), path, value))
    assert message in str(e.value)


def test_decode_refuses_non_objects() -> None:
    objs: list[Any] = [None, [], "spec", 3]
    for obj in objs:
        with pytest.raises(SpecError, match="spec must be an object"):
            decode(obj)
    assert isinstance(SpecError("x"), ValueError)


def test_a_wildcards_extra_dns_types_travel_to_the_daemon() -> None:
    pol = parse_network({"allow": [{"host": "*.x.test", "dns": ["TXT", "SRV"]}]}, "p.yaml")
    enc = encode(BindingSpec("t", pol))
    assert enc["policy"]["allow"][0]["dns"] == [16, 33]
    assert decode(enc).policy.allow[0].dns == frozenset({16, 33})
    bad = encode(BindingSpec("t", pol))
    bad["policy"]["allow"][0]["kind"] = "host"
    bad["policy"]["allow"][0]["value"] = "x.test"
    with pytest.raises(SpecError, match="only meaningful on a wildcard"):
        decode(bad)
    bad["policy"]["allow"][0]["dns"] = [0]
    with pytest.raises(SpecError, match="DNS type numbers"):
        decode(bad)


def test_a_spec_that_inspects_without_a_ca_is_refused() -> None:
    """Fail closed: an inspecting rule must never fall back to passthrough for want of a CA."""
    pol = parse_network({"allow": [{"host": "git.test", "http": "read-only"}]}, "p.yaml")
    wire = encode(BindingSpec("t", pol, ca=CaPair("c", "k")))
    assert decode(wire).policy.allow[0].http is not None
    wire["ca"] = None
    with pytest.raises(SpecError, match="ca is needed"):
        decode(wire)


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("http", 0, "methods"), ["get"], "upper-case"),
        (("http", 0, "paths"), ["/a/../b"], "canonical"),
        (("http", 0, "paths"), [], "canonical"),
        (("inspect",), False, "need inspect"),
    ],
)
def test_decode_refuses_request_rules_encode_never_makes(path: tuple[Any, ...], value: Any, error: str) -> None:
    pol = parse_network({"allow": [{"host": "git.test", "http": [{"methods": ["GET"], "paths": ["/x"]}]}]}, "p.yaml")
    wire = encode(BindingSpec("t", pol, ca=CaPair("c", "k")))
    target = wire["policy"]["allow"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpecError, match=error):
        decode(wire)


def test_decode_refuses_a_secret_with_a_line_break_or_a_raw_host() -> None:
    s = Secret("api.test", "Authorization", "Bearer r", "r", "sentinel", "V", Origin("p.yaml", 3))
    wire = encode(BindingSpec("t", NetworkPolicy(), ca=CaPair("c", "k"), secrets=(s,)))
    assert decode(wire).secrets == (s,)
    bad = copy.deepcopy(wire)
    bad["secrets"][0]["value"] = "Bearer r\r\nX-Evil: 1"
    with pytest.raises(SpecError, match="line break"):
        decode(bad)
    bad = copy.deepcopy(wire)
    bad["secrets"][0]["host"] = "API.test"
    with pytest.raises(SpecError, match="canonical"):
        decode(bad)
