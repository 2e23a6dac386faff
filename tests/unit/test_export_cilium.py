"""Issue 27 item 1: `export cilium` validates against our schema of the CRD's constraints (the part sandgate
writes, tests/data/cilium-cnp-subset.schema.json) and, read the way Cilium reads it (its matchPattern
regexes, pkg/fqdn/matchpattern), names exactly the policy's hosts, never wider."""

from __future__ import annotations

import ipaddress
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config import bundled
from launcher.config import load as lpolicy
from netguard import policy as netpolicy
from netguard.export import cilium, plan
from netguard.export.plan import Plan
from netguard.policy import NetworkPolicy, parse_network
from netguard.rules import compile_policy, decide

# Written from the facts of Cilium's CRD, not the CRD itself: we do not commit files fetched from elsewhere.
SCHEMA = Path(__file__).parent.parent / "data" / "cilium-cnp-subset.schema.json"


@cache
def validator() -> jsonschema.Draft202012Validator:
    formats = jsonschema.FormatChecker()

    @formats.checks("cidr", raises=ValueError)
    def _cidr(value: object) -> bool:  # Kubernetes' format: a network with its prefix length
        return not isinstance(value, str) or ("/" in value and bool(ipaddress.ip_network(value)))

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=formats)


def errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(doc)]


def net(allow: list[Any] | None = None, deny: list[Any] | None = None) -> NetworkPolicy:
    return parse_network({"allow": allow or [], "deny": deny or []}, "p.yaml")


def export(pol: NetworkPolicy, **target: Any) -> dict[str, Any]:
    doc, _ = cilium.document(plan.build(pol), cilium.Target(**target))
    return doc


# ---- Cilium's matching, as pkg/fqdn/matchpattern/matchpattern.go (1.19) and before it -----------------

_CHARS = "[-a-zA-Z0-9_]"


def cilium_regex(pattern: str, version: tuple[int, int]) -> re.Pattern[str]:
    pattern = pattern.strip().lower()
    if re.fullmatch(r"[*]+[.]?", pattern):
        return re.compile(f"(^({_CHARS}+[.])+$)|(^[.]$)")
    pattern = pattern if pattern.endswith(".") else pattern + "."
    pattern = pattern.replace(".", "[.]")
    if version >= (1, 19):  # the '**.' prefix: one or more whole labels
        pattern = re.sub(r"^[*]{2,}\[\.\]", f"({_CHARS}+([.]{_CHARS}+){{0,}})[.]", pattern)
    pattern = re.sub(r"[*]+", f"{_CHARS}*", pattern)
    return re.compile(f"^{pattern}$")


def cilium_allows(doc: dict[str, Any], name: str, port: int, version: tuple[int, int] = (1, 19)) -> bool:
    fqdn = name.lower() + "."
    for rule in doc["spec"]["egress"]:
        ports = [p for entry in rule.get("toPorts", []) for p in entry["ports"]]
        on_port = any(
            p["protocol"] in ("TCP", "ANY")
            and (p["port"] == "0" or int(p["port"]) <= port <= int(p.get("endPort", p["port"])))
            for p in ports
        )
        for sel in rule.get("toFQDNs", []):
            if "matchName" in sel:
                hit = sel["matchName"].lower() + "." == fqdn
            else:
                hit = cilium_regex(sel["matchPattern"], version).match(fqdn) is not None
            if hit and on_port:
                return True
    return False


def dns_names(doc: dict[str, Any]) -> list[dict[str, str]]:
    dns_rules = [r for r in doc["spec"]["egress"] if "toEndpoints" in r]
    assert len(dns_rules) == 1
    return [d for entry in dns_rules[0]["toPorts"] for d in entry["rules"]["dns"]]


def test_the_emulated_matcher_is_ciliums_documented_one() -> None:
    """The examples of Cilium's docs (Documentation/security/policy/language.rst), so the emulation can be trusted."""
    one = cilium_regex("*.cilium.io", (1, 19))
    assert one.match("sub.cilium.io.") and not one.match("cilium.io.") and not one.match("sub.sub.cilium.io.")
    many = cilium_regex("**.cilium.io", (1, 19))
    assert many.match("app.cilium.io.") and many.match("test.app.cilium.io.") and not many.match("cilium.io.")
    old = cilium_regex("**.cilium.io", (1, 18))  # before 1.19: two stars are one, one label
    assert old.match("app.cilium.io.") and not old.match("test.app.cilium.io.")
    assert cilium_regex("part*ial.com", (1, 19)).match("part-extra-ial.com.")


# ---- the CRD's constraints (our schema of them) -----------------------------------------------------

SHAPES: dict[str, tuple[list[Any], list[Any]]] = {
    "exact": (["pypi.org", "files.pythonhosted.org"], []),
    "wildcard": (["*.githubusercontent.com", "github.com"], []),
    "ports": ([{"host": "db.test", "ports": [5432, 5433, 5434, 8443]}], []),
    "many ports": ([{"host": "wide.test", "ports": list(range(1000, 1200, 2))}], []),
    "every port but one": ([{"host": "a.test", "ports": [1, 2]}, "b.test"], [{"host": "a.test", "ports": [2]}]),
    "cidrs": (["203.0.113.0/24", {"cidr": "2001:db8::/48", "ports": [443]}, "198.51.100.7"], []),
    "deny cidrs": (["pypi.org"], ["192.0.2.0/24", {"cidr": "198.51.100.0/24", "ports": [22]}]),
    "denied name": (["pypi.org", "gone.test"], ["gone.test"]),
    "nothing": ([], []),
    "underscores": (["_dmarc.example.org", "*.x_y.example.org"], []),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_rule_shape_validates_against_the_crd_constraints(shape: str) -> None:
    allow, deny = SHAPES[shape]
    for version in ((1, 19), (1, 18)):
        doc = export(net(allow, deny), namespace="ci", selector=(("app", "agent"),), version=version)
        assert errors(doc) == []


def test_every_bundled_list_together_validates_and_names_its_hosts() -> None:
    sections = [s for name in bundled.bundled_names() for s in lpolicy.load_policy_file(bundled.bundled_path(name))]  # type: ignore[arg-type]
    pol = netpolicy.merge([s.network for s in sections])
    doc = export(pol)
    assert errors(doc) == []
    rs = compile_policy(pol)
    for r in pol.allow:
        name = f"deep.sub.{r.value}" if r.kind == "wildcard" else str(r.value)
        assert cilium_allows(doc, name, 443) == decide(rs, name, 443).allowed, name


def _mutated(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `doc` with the value at `path` (keys and indexes joined by '/') replaced, or deleted if None."""
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    *parents, last = [int(k) if k.isdigit() else k for k in path.split("/")]
    node: Any = copy
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return copy


FQDN_RULE = "spec/egress/1"
CONTROLS: dict[str, tuple[str, Any, str]] = {
    # the CRD's port pattern is loose (its first '|' branch is unanchored), not this loose
    "bad port": (f"{FQDN_RULE}/toPorts/0/ports/0/port", "!!", "does not match"),
    "port above 65535": (f"{FQDN_RULE}/toPorts/0/ports/0/port", "65536", "does not match"),  # the CRD's lets it by
    "bad protocol": (f"{FQDN_RULE}/toPorts/0/ports/0/protocol", "QUIC", "is not one of"),
    "no selector": ("spec/endpointSelector", None, "'endpointSelector' is a required property"),
    "bad matchName": (f"{FQDN_RULE}/toFQDNs/0", {"matchName": "pypi.org/simple"}, "does not match"),
    "bad matchPattern": (f"{FQDN_RULE}/toFQDNs/1", {"matchPattern": "*.pypi.org/simple"}, "does not match"),
    "41 ports": (  # the CRD caps one toPorts entry at 40
        f"{FQDN_RULE}/toPorts/0/ports",
        [{"port": str(p), "protocol": "TCP"} for p in range(8000, 8041)],
        "is too long",
    ),
}


@pytest.mark.parametrize("control", CONTROLS)
def test_the_schema_check_can_fail(control: str) -> None:
    """Controls: the validator is live, and refuses each broken document for the constraint broken."""
    doc = export(net(["pypi.org", "*.pypi.org"]))
    assert errors(doc) == []
    path, value, message = CONTROLS[control]
    found = errors(_mutated(doc, path, value))
    assert any(message in e for e in found), found


def test_a_misspelled_key_fails() -> None:
    """Stricter than the CRD: it lets the key through, Kubernetes prunes it, and a rule with only `toPorts` is
    left, which allows every destination on those ports."""
    doc = export(net(["pypi.org"]))
    rule = doc["spec"]["egress"][1]
    rule["toFQDN"] = rule.pop("toFQDNs")
    assert any("'toFQDN' was unexpected" in e for e in errors(doc)), errors(doc)


# ---- meaning: exactly the policy's hosts and ports ---------------------------------------------------


def test_a_wildcard_is_multi_label_for_119_and_narrowed_and_said_for_118() -> None:
    p = plan.build(net(["*.pypi.test"]))
    new, new_gaps = cilium.document(p, cilium.Target())
    old, old_gaps = cilium.document(p, cilium.Target(version=(1, 18)))
    assert new["spec"]["egress"][1]["toFQDNs"] == [{"matchPattern": "**.pypi.test"}]
    assert old["spec"]["egress"][1]["toFQDNs"] == [{"matchPattern": "*.pypi.test"}]
    assert [g.severity for g in new_gaps] == ["sandgate-only"]  # DNS types for wildcard names
    assert [g.severity for g in old_gaps] == ["narrowed", "sandgate-only"] and "one label" in old_gaps[0].text
    assert cilium_allows(new, "a.b.pypi.test", 443) and not cilium_allows(new, "pypi.test", 443)
    assert cilium_allows(old, "a.pypi.test", 443, (1, 18)) and not cilium_allows(old, "a.b.pypi.test", 443, (1, 18))


def test_the_dns_rule_names_the_same_hosts_as_the_fqdn_rules() -> None:
    doc = export(
        net(["pypi.org", {"host": "pypi.org", "ports": [8443]}, "*.npmjs.org", {"host": "x.test", "ports": [22]}])
    )
    fqdns = [s for r in doc["spec"]["egress"] for s in r.get("toFQDNs", [])]
    assert dns_names(doc) == [{"matchName": "pypi.org"}, {"matchPattern": "**.npmjs.org"}, {"matchName": "x.test"}]
    assert sorted(map(str, dns_names(doc))) == sorted(set(map(str, fqdns)))
    dns = next(r for r in doc["spec"]["egress"] if "toEndpoints" in r)
    assert dns["toEndpoints"] == [{"matchLabels": cilium.KUBE_DNS}]
    assert dns["toPorts"][0]["ports"] == [{"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]


def test_ports_are_tcp_ranges_any_port_is_zero_and_long_lists_are_split() -> None:
    assert cilium.to_ports(plan.ANY_PORT) == [{"ports": [{"port": "0", "protocol": "TCP"}]}]
    assert cilium.to_ports(((80, 80), (8000, 8010))) == [
        {"ports": [{"port": "80", "protocol": "TCP"}, {"port": "8000", "endPort": 8010, "protocol": "TCP"}]}
    ]
    split = cilium.to_ports(tuple((p, p) for p in range(1000, 1100, 2)))
    assert [len(e["ports"]) for e in split] == [40, 10]


def test_nothing_allowed_is_still_default_deny() -> None:
    doc = export(net([], ["evil.test"]))
    assert doc["spec"]["enableDefaultDeny"] == {"egress": True, "ingress": False} and doc["spec"]["egress"] == []


def test_deny_cidrs_are_egress_deny_with_their_ports() -> None:
    doc = export(net(["pypi.org"], ["192.0.2.0/24", {"cidr": "198.51.100.0/24", "ports": [22]}]))
    assert doc["spec"]["egressDeny"] == [
        {"toCIDR": ["192.0.2.0/24"]},
        {"toCIDR": ["198.51.100.0/24"], "toPorts": [{"ports": [{"port": "22", "protocol": "TCP"}]}]},
    ]


def test_metadata_and_selector() -> None:
    doc = export(net(["a.test"]), name="agents", namespace="ci", selector=(("app", "agent"), ("tier", "x")))
    assert doc["metadata"]["name"] == "agents" and doc["metadata"]["namespace"] == "ci"
    assert doc["spec"]["endpointSelector"] == {"matchLabels": {"app": "agent", "tier": "x"}}
    assert doc["apiVersion"] == "cilium.io/v2" and doc["kind"] == "CiliumNetworkPolicy"


def test_learn_mode_is_refused_for_cilium() -> None:
    _, gaps = cilium.document(plan.build(net(["a.test"]), learn=True), cilium.Target())
    assert [g.severity for g in gaps] == ["refused"] and "no learn mode" in gaps[0].text


# ---- the property: read as Cilium reads it, the export allows what sandgate allows --------------------

LABELS = st.sampled_from(["a", "b"])
SUFFIXES = st.lists(LABELS, min_size=0, max_size=2).map(lambda ls: ".".join([*ls, "x", "test"]))
PATTERNS = st.tuples(st.booleans(), SUFFIXES).map(lambda t: f"*.{t[1]}" if t[0] else t[1])
ENTRIES = st.tuples(PATTERNS, st.one_of(st.none(), st.lists(st.sampled_from([22, 80, 443]), min_size=1))).map(
    lambda t: t[0] if t[1] is None else {"host": t[0], "ports": t[1]}
)


def _probes(pol: NetworkPolicy) -> list[tuple[str, int]]:
    names = [n for s in sorted({str(r.value) for r in (*pol.allow, *pol.deny)}) for n in (s, f"a.{s}", f"b.a.{s}")]
    return [(n, port) for n in names for port in (22, 80, 443, 9)]


@settings(max_examples=200, deadline=None)
@given(st.lists(ENTRIES, min_size=1, max_size=4), st.lists(ENTRIES, max_size=2))
def test_cilium_allows_exactly_what_sandgate_allows_and_1_18_never_more(allow: list[Any], deny: list[Any]) -> None:
    pol = net(allow, deny)
    p: Plan = plan.build(pol)
    if p.refused:
        return  # the plan's own property test shows a refusal is needed
    new, old = export(pol), export(pol, version=(1, 18))
    rs = compile_policy(pol)
    for name, port in _probes(pol):
        sandgate = decide(rs, name, port).allowed
        assert cilium_allows(new, name, port) == sandgate, (name, port)
        assert not cilium_allows(old, name, port, (1, 18)) or sandgate, (name, port)
