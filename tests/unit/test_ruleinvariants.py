"""Every rule type refuses, when made, what the parser would never make: a rule that exists is valid.

Whoever builds the rule (the parser, the daemon's decoder, a test), the constructor is the one place
its invariants live; each one is refused here, and the daemon refuses a spec edited to break it.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
from typing import Any

import dns.rdatatype
import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard import ruleinvariants
from netguard.credentials import Credential, Secret
from netguard.daemon import specbytes
from netguard.httprules import READ_ONLY, HttpRule
from netguard.policy import NetworkPolicy, Rule, new_rule, parse_network
from netguard.spec import BindingSpec, CaPair, SpecError, decode, encode
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError

AT = Origin("p.yaml", 3)
NET = ipaddress.ip_network("192.0.2.0/24")
GOOD_HTTP = HttpRule(frozenset({"GET"}), ("/x",), AT)


# ---- Origin ----------------------------------------------------------------------------------------


def test_an_origin_prints_as_file_colon_line_and_a_colon_in_the_file_name_stays() -> None:
    assert str(Origin("p.yaml", 3)) == "p.yaml:3"
    assert str(Origin("command line")) == "command line"
    assert str(Origin("C:/dir:x/p.yaml", 12)) == "C:/dir:x/p.yaml:12"
    assert Origin("a:1").line is None  # nothing is split out of a path


@pytest.mark.parametrize("line", [0, -1, True, 1.0, "3"])
def test_an_origin_refuses_a_line_that_is_not_a_whole_number_from_1(line: Any) -> None:
    with pytest.raises(ValueError, match="whole number from 1"):
        Origin("p.yaml", line)


def test_an_origin_refuses_a_path_that_is_not_text() -> None:
    with pytest.raises(TypeError, match="text"):
        Origin(b"p.yaml")  # type: ignore[arg-type]


# ---- Rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"origin": "p.yaml:3"}, "origin is an Origin record"),
        ({"kind": "regex"}, "kind must be one of host, wildcard, cidr"),
        ({"value": "A.test"}, "not in canonical form"),
        ({"value": "a..test"}, "empty label"),
        ({"value": ""}, "value"),
        ({"value": "192.0.2.1"}, "IP address where a name is required"),
        ({"value": NET}, "value is a name"),
        ({"kind": "wildcard", "value": "*.a.test"}, "value"),
        ({"ports": frozenset()}, "ports must be"),
        ({"ports": frozenset({0})}, "ports must be"),
        ({"ports": frozenset({65536})}, "ports must be"),
        ({"ports": frozenset({True})}, "ports must be"),
        ({"ports": [443]}, "ports must be"),
        ({"dns": frozenset({16})}, "dns is only meaningful on a wildcard rule"),
        ({"kind": "wildcard", "dns": frozenset()}, "DNS type numbers"),
        ({"kind": "wildcard", "dns": frozenset({0})}, "DNS type numbers"),
        ({"kind": "wildcard", "dns": frozenset({255})}, "no meta types"),  # ANY
        ({"kind": "wildcard", "dns": frozenset({252})}, "no meta types"),  # AXFR
        ({"kind": "wildcard", "dns": frozenset({41})}, "no meta types"),  # OPT
        ({"kind": "wildcard", "dns": frozenset({65536})}, "DNS type numbers"),
        ({"inspect": 1}, "true or false"),
        ({"log_query": "yes"}, "true or false"),
        ({"http": (GOOD_HTTP,)}, "need inspect"),
        ({"log_query": True}, "need inspect"),
        ({"inspect": True, "http": ()}, "non-empty tuple of http rules"),
        ({"inspect": True, "http": [GOOD_HTTP]}, "non-empty tuple of http rules"),
        ({"inspect": True, "http": ("GET /x",)}, "non-empty tuple of http rules"),
    ],
)
def test_a_name_rule_refuses(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"kind": "host", "value": "a.test", "ports": frozenset({443}), "origin": AT}
    with pytest.raises(PolicyError, match=message):
        Rule(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"value": "192.0.2.0/24"}, "value is a network"),
        ({"value": ipaddress.ip_network("0.0.0.0/0")}, "covers every address"),
        ({"value": ipaddress.ip_network("::/0")}, "covers every address"),
        ({"value": ipaddress.ip_network("::ffff:10.0.0.0/104")}, "IPv4-mapped"),
        ({"inspect": True}, "cannot inspect"),
        ({"dns": frozenset({16})}, "only meaningful on a wildcard"),
        ({"log_query": True}, "need inspect"),
    ],
)
def test_a_cidr_rule_refuses(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"kind": "cidr", "value": NET, "ports": None, "origin": AT}
    with pytest.raises(PolicyError, match=message):
        Rule(**{**base, **fields})


def test_the_refusal_names_the_rules_origin() -> None:
    with pytest.raises(PolicyError) as e:
        Rule("host", "A.test", None, Origin("hosts.txt", 9))
    assert e.value.origin == Origin("hosts.txt", 9) and e.value.line == 9


def test_every_way_of_making_a_rule_checks_it() -> None:
    """new_rule (the fast path for 10^5 names) and dataclasses.replace check like the constructor."""
    with pytest.raises(PolicyError, match="canonical"):
        new_rule("host", "A.test", None, AT)
    with pytest.raises(PolicyError, match="origin"):
        new_rule("host", "a.test", None, "p.yaml:1")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="value is a network"):
        new_rule("cidr", "a.test", None, AT)  # a name where a network must be
    rule = Rule("host", "a.test", None, AT)
    with pytest.raises(PolicyError, match="only meaningful on a wildcard"):
        dataclasses.replace(rule, dns=frozenset({16}))
    assert new_rule("wildcard", "a.test", frozenset({443}), AT) == Rule("wildcard", "a.test", frozenset({443}), AT)


def test_data_types_are_what_dnspython_calls_data() -> None:
    """The invariant's own list of meta types (no dnspython import on the rule path) matches dnspython's."""
    for t in range(65536):
        assert ruleinvariants.is_data_type(t) == (
            t != 0 and not dns.rdatatype.is_metatype(dns.rdatatype.RdataType.make(t))
        ), t
    assert not ruleinvariants.is_data_type(True) and not ruleinvariants.is_data_type(65536)


labels = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z0-9]", fullmatch=True).filter(lambda s: not s.startswith("xn--"))


@given(st.lists(labels, min_size=1, max_size=3).map(".".join), st.sampled_from(["host", "wildcard"]))
def test_every_canonical_name_is_a_valid_rule_and_no_other_spelling_is(name: str, kind: Any) -> None:
    assert Rule(kind, name, None, AT).value == name
    for spelling in (name.upper(), name + ".", " " + name, name + "..x"):
        with pytest.raises(PolicyError):
            Rule(kind, spelling, None, AT)


def test_a_port_set_found_valid_does_not_vouch_for_an_equal_one_of_booleans() -> None:
    assert Rule("host", "a.test", frozenset({1}), AT).ports == frozenset({True})  # equal sets...
    with pytest.raises(PolicyError, match="ports must be"):
        Rule("host", "a.test", frozenset({True}), AT)  # ...yet only whole numbers are ports


@given(st.sets(st.integers(-70000, 70000), max_size=4))
def test_ports_are_refused_unless_every_one_is_a_port(ports: set[int]) -> None:
    ok = bool(ports) and all(0 < p < 65536 for p in ports)
    if ok:
        assert Rule("host", "a.test", frozenset(ports), AT).ports == frozenset(ports)
    else:
        with pytest.raises(PolicyError, match="ports must be"):
            Rule("host", "a.test", frozenset(ports), AT)


# ---- HttpRule --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"origin": "p:1"}, "origin is an Origin record"),
        ({"methods": frozenset()}, "upper-case methods"),
        ({"methods": frozenset({"get"})}, "upper-case methods"),
        ({"methods": frozenset({"GE T"})}, "upper-case methods"),
        ({"methods": frozenset({"GET\r\n"})}, "upper-case methods"),
        ({"methods": {"GET"}}, "upper-case methods"),
        ({"paths": ()}, "canonical path patterns"),
        ({"paths": ("x",)}, "canonical path patterns"),
        ({"paths": ("/a/../b",)}, "canonical path patterns"),
        ({"paths": ("/a?b",)}, "canonical path patterns"),
        ({"paths": ("/a%2fb",)}, "canonical path patterns"),  # escapes are upper case
        ({"paths": ["/x"]}, "canonical path patterns"),
        ({"websocket": 1}, "websocket must be true or false"),
        ({"methods": frozenset({"POST"}), "websocket": True}, "needs GET"),
    ],
)
def test_an_http_rule_refuses(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"methods": frozenset({"GET"}), "paths": ("/x/*",), "origin": AT}
    with pytest.raises(PolicyError, match=message):
        HttpRule(**{**base, **fields})


def test_the_http_rules_the_parser_makes_are_valid() -> None:
    assert HttpRule(READ_ONLY, None, AT).describe() == "read-only"
    assert HttpRule(None, ("/*/*/git-upload-pack",), AT, websocket=True).websocket


# ---- Credential and Secret -------------------------------------------------------------------------

CRED: dict[str, Any] = {
    "host": "api.test",
    "header": "Authorization",
    "template": "Bearer ${KEY}",
    "variable": "KEY",
    "file": None,
    "origin": AT,
}
SECRET: dict[str, Any] = {
    "host": "api.test",
    "header": "Authorization",
    "value": "Bearer REALSECRET",
    "real": "REALSECRET",
    "sentinel": "sandgate-sentinel-1",
    "variable": "KEY",
    "origin": AT,
}
SHARED = [
    ({"host": "API.test"}, "canonical form"),
    ({"host": "*.api.test"}, "host"),
    ({"host": "192.0.2.1"}, "IP address where a name is required"),
    ({"host": 7}, "host is a name"),
    ({"header": "Host"}, "not a header a credential can go in"),
    ({"header": "Content-Length"}, "not a header a credential can go in"),
    ({"header": "X Key"}, "not a header a credential can go in"),
    ({"variable": "1KEY"}, "not a variable name"),
    ({"origin": "p.yaml:3"}, "Origin record"),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        *SHARED,
        ({"template": "Bearer KEY"}, "exactly one ${VARIABLE}"),
        ({"template": "${KEY} ${KEY}"}, "exactly one ${VARIABLE}"),
        ({"template": "Bearer ${OTHER}"}, "exactly one ${VARIABLE}, this one"),
        ({"template": "Bearer ${KEY}\r\nX-Evil: 1"}, "no line break"),
        ({"file": "  "}, "file must be null or a path"),
    ],
)
def test_a_credential_refuses(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("$", r"\$").replace("{", r"\{").replace("}", r"\}")):
        Credential(**{**CRED, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        *SHARED,
        ({"value": "Bearer REALSECRET\r\nX-Evil: 1"}, "line break"),
        ({"value": "Bearer REALSECRET\0"}, "line break"),
        ({"value": "Bearer other"}, "empty sentinel or secret"),  # the header must carry the secret
        ({"real": ""}, "empty sentinel or secret"),
        ({"sentinel": ""}, "empty sentinel or secret"),
    ],
)
def test_a_secret_refuses(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Secret(**{**SECRET, **fields})


# ---- NetworkPolicy and BindingSpec -------------------------------------------------------------------


def test_a_policy_refuses_what_only_an_allow_entry_may_say() -> None:
    inspecting = Rule("host", "a.test", None, AT, inspect=True)
    dns_wild = Rule("wildcard", "a.test", None, AT, dns=frozenset({16}))
    assert NetworkPolicy(allow=(inspecting, dns_wild)).allow
    for rule in (inspecting, dns_wild):
        for lists in ({"deny": (rule,)}, {"ask": (rule,)}):
            with pytest.raises(PolicyError, match="only allow rules"):
                NetworkPolicy(**lists)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("resolver", "message"),
    [
        (("dns.test", 53), "not an IP address"),
        (("2001:DB8::1", 53), "canonical form"),
        (("192.0.2.1", 0), "port number"),
        (("192.0.2.1", 65536), "port number"),
        (("192.0.2.1", True), "port number"),
    ],
)
def test_a_policy_refuses_a_resolver(resolver: tuple[str, int], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        NetworkPolicy(resolver=resolver)


def test_a_policy_refuses_two_credentials_for_one_header_on_one_host() -> None:
    a = Credential(**CRED)
    b = Credential(**{**CRED, "header": "authorization", "origin": Origin("q.yaml", 1)})
    with pytest.raises(PolicyError, match="two credentials"):
        NetworkPolicy(credentials=(a, b))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"task": ""}, "task must be a non-empty"),
        ({"task": "a\nb"}, "printable"),
        ({"approval_socket": "rel.sock"}, "absolute"),
        ({"approval_socket": "/a\0b"}, "absolute"),
        ({"ask_timeout": 0.0}, "ask_timeout"),
        ({"ask_timeout": float("nan")}, "ask_timeout"),
        ({"ca": None}, "ca is needed"),
    ],
)
def test_a_binding_spec_refuses(fields: dict[str, Any], message: str) -> None:
    pol = NetworkPolicy(allow=(Rule("host", "a.test", None, AT, inspect=True),))
    base: dict[str, Any] = {"task": "t", "policy": pol, "ca": CaPair("c", "k")}
    with pytest.raises(SpecError, match=message):
        BindingSpec(**{**base, **fields})


# ---- the daemon refuses a spec edited between the launcher and it -----------------------------------


def _wire() -> dict[str, Any]:
    pol = parse_network(
        {
            "allow": [{"host": "git.test", "http": [{"methods": ["GET"], "paths": ["/x"]}]}, "*.w.test"],
            "deny": ["evil.test"],
            "resolver": "192.0.2.53",
        },
        "p.yaml",
    )
    secret = Secret(**SECRET)
    return encode(BindingSpec("t", pol, ca=CaPair("c", "k"), secrets=(secret,)))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda w: w["policy"]["deny"][0].update(inspect=True), "only allow rules"),
        (lambda w: w["policy"]["allow"][1].update(dns=[255]), "no meta types"),
        (lambda w: w["policy"]["allow"][1].update(dns=[16], kind="host"), "only meaningful on a wildcard"),
        (lambda w: w["policy"]["allow"][0]["http"][0].update(methods=["POST"], websocket=True), "needs GET"),
        (lambda w: w["policy"]["allow"][0]["http"][0].update(paths=["/a/./b"]), "canonical"),
        (lambda w: w["policy"]["allow"][0].update(ports=[]), "ports must be"),
        (lambda w: w["policy"]["allow"][0].update(origin=["p.yaml", 0]), "whole number from 1"),
        (lambda w: w["policy"]["allow"][0].update(origin="p.yaml:1"), "origin must be"),
        (lambda w: w["policy"].update(resolver=["192.0.2.53", 70000]), "port number"),
        (lambda w: w["secrets"][0].update(header="Host"), "not a header a credential can go in"),
        (lambda w: w["secrets"][0].update(value="Bearer x"), "empty sentinel or secret"),
        (lambda w: w.update(task="a\tb"), "printable"),
    ],
)
def test_the_daemon_refuses_a_hand_edited_spec(edit: Any, message: str) -> None:
    wire = _wire()
    assert decode(copy.deepcopy(wire)) == decode(wire)  # unedited, it decodes
    edit(wire)
    with pytest.raises(SpecError, match=message):
        decode(wire)


def test_the_daemons_policy_cache_refuses_a_hand_edited_policy_too() -> None:
    """The daemon decodes the policy part by itself (specbytes, cached by hash): same types, same refusal."""
    spec = decode(_wire())
    data = specbytes.to_bytes(spec)
    _, policy = specbytes.split_bytes(data)
    assert specbytes.policy_from_bytes(policy) == spec.policy
    obj = json.loads(policy)
    obj["deny"][0]["inspect"] = True
    with pytest.raises(SpecError, match="only allow rules"):
        specbytes.policy_from_bytes(json.dumps(obj).encode())


# ---- a hosts file's names checked in one pass (issue 25: 10^5 names) --------------------------------

from netguard import hosts  # noqa: E402
from netguard.hostsfile import HostsList  # noqa: E402
from netguard.policy import DEFAULT_ALLOW_PORTS  # noqa: E402


@given(st.lists(st.text(alphabet="abcxyz019-_.Xn\u00e9", min_size=0, max_size=12), max_size=6))
def test_the_one_pass_check_agrees_with_the_shortcut_name_by_name(names: list[str]) -> None:
    assert hosts.all_canonical_names(names) == all(hosts._is_canonical_name(n) for n in names)


def test_the_one_pass_check_sends_anything_doubtful_to_the_full_check() -> None:
    assert hosts.all_canonical_names(["pypi.org", "a-b_c.test"])
    for odd in ("Pypi.org", "xn--bcher-kva.test", "a..b", "a" * 64 + ".test", "1.2.3.4", "a\nb", "x." * 127 + "ab"):
        assert not hosts.all_canonical_names(["pypi.org", odd]), odd
    assert not hosts.all_canonical_names(["pypi.org", 7])  # type: ignore[list-item]


def _listed(*names: str) -> dict[str, HostsList]:
    n = len(names)
    return {"h.txt": HostsList("h.txt", tuple(range(1, n + 1)), names, (False,) * n)}


def test_a_hosts_files_rules_made_in_one_pass_equal_those_made_one_by_one() -> None:
    names = tuple(f"h{i}.example.test" for i in range(50))
    pol = parse_network({"allow": [{"hosts_file": "h.txt"}]}, "p.yaml", _listed(*names))
    ports = DEFAULT_ALLOW_PORTS
    assert pol.allow == tuple(new_rule("host", n, ports, Origin("h.txt", i + 1)) for i, n in enumerate(names))


@pytest.mark.parametrize("bad", ["Upper.test", "bad..name", "a" * 64 + ".test", "*.x.test", "xn--zz.test"])
def test_a_bad_name_among_many_is_still_refused_by_the_rule_types(bad: str) -> None:
    """A HostsList that never went through the hosts-file parser (hand-made, decoded): the one-pass check
    misses, every name is checked alone, and the bad one refused with its line."""
    names = ("ok.test", bad, "also.test")
    with pytest.raises(PolicyError) as e:
        parse_network({"allow": [{"hosts_file": "h.txt"}]}, "p.yaml", _listed(*names))
    assert e.value.origin == Origin("h.txt", 2) or "h.txt:2" in str(e.value)
