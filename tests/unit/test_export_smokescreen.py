"""Issue 27 item 2: `export smokescreen` is an ACL Smokescreen loads (its yaml_loader.go and acl.go validation,
mirrored here and checked against fixtures shaped like its own test data) and, matched the way Smokescreen
matches (acl.go HostMatchesGlob), allows exactly the policy's names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import idna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from netguard.export import plan, smokescreen
from netguard.policy import NetworkPolicy, parse_network
from netguard.rules import compile_policy, decide

FIXTURES = Path(__file__).parent.parent / "data" / "smokescreen"
ACTIONS = ("open", "report", "enforce")
_DNS_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789.-_")


class Refused(ValueError):
    """What Smokescreen would say when loading the ACL."""


def _normalize_host(text: str) -> str:
    """hostport.NormalizeHost: IDNA lookup mapping (non-strict: '_' allowed), lowercase, DNS characters only."""
    ascii_name = text if text.isascii() else idna.encode(text, uts46=True).decode()
    domain = ascii_name.lower()
    if set(domain) - _DNS_CHARS:
        raise Refused(f"invalid domain {text!r}")
    return domain


def _validate_glob(svc: str, glob: str) -> None:
    """acl.go ValidateDomainGlob."""
    if glob == "":
        raise Refused("glob cannot be empty")
    if glob in ("*", "*."):
        raise Refused(f"{svc}: {glob}: domain glob must not match everything")
    if glob.startswith("*") and not glob.startswith("*."):
        raise Refused(f"{svc}: {glob}: domain glob must represent a full prefix (sub)domain")
    domain = glob.removeprefix("*.")
    if "*" in domain:
        raise Refused(f"{svc}: {glob}: domain globs are only supported as prefix")
    if _normalize_host(domain) != domain:
        raise Refused(f"{svc}: {glob}: incorrect ACL entry")


def _rule(svc: str, rule: dict[str, Any]) -> None:
    if rule.get("action") not in ACTIONS:  # policy.go PolicyFromAction
        raise Refused(f"unknown action {rule.get('action')}")
    for glob in rule.get("allowed_domains") or []:
        _validate_glob(svc, glob)


def load_acl(text: str) -> dict[str, Any]:
    """yaml_loader.go Load and YAMLConfig.Load, then ACL.Validate: the document, or Refused."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise Refused("not a mapping")
    if doc.get("version") != "v1":
        raise Refused(f'expected version "v1" got {doc.get("version")!r}')
    if doc.get("services") is None:
        raise Refused("Top level list 'services' is missing")
    seen: set[str] = set()
    for svc in doc["services"]:
        _rule(svc.get("name", ""), svc)
        if svc.get("name") in seen:
            raise Refused(f"rule already exists for service {svc.get('name')}")
        seen.add(svc.get("name"))
    if doc.get("default") is not None:
        _rule("default_rule", doc["default"])
    for key in ("global_deny_list", "global_allow_list"):
        for glob in doc.get(key) or []:
            _validate_glob(key, glob)
    return doc


def host_matches_glob(host: str, glob: str) -> bool:
    """acl.go HostMatchesGlob: `*.x` is any subdomain of x, never x; otherwise equality."""
    h, g = _normalize_host(host).rstrip("."), _normalize_host(glob.removeprefix("*.")).rstrip(".")
    return h.endswith("." + g) if glob.startswith("*.") else h == g


def allows(doc: dict[str, Any], service: str, host: str) -> bool:
    """acl.go Decide for this service (no default rule: other services are denied)."""
    rule = next((s for s in doc["services"] if s["name"] == service), None)
    if rule is None:
        return False
    if any(host_matches_glob(host, g) for g in rule.get("allowed_domains") or []):
        return True
    if any(host_matches_glob(host, g) for g in doc.get("global_deny_list") or []):
        return False
    if any(host_matches_glob(host, g) for g in doc.get("global_allow_list") or []):
        return True
    return bool(rule["action"] in ("open", "report"))


# ---- the mirror is live: Smokescreen-shaped fixtures load or are refused as Smokescreen would -----------


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_the_loader_mirror_accepts_and_refuses_like_smokescreen(fixture: str) -> None:
    text = (FIXTURES / fixture).read_text()
    if fixture.startswith("valid-"):
        load_acl(text)
    else:
        with pytest.raises(Refused):
            load_acl(text)


def test_the_glob_mirror_is_smokescreens() -> None:
    """Cases of Smokescreen's acl_test.go: a glob covers subdomains at any depth, never its apex."""
    assert host_matches_glob("a.example.com", "*.example.com")
    assert host_matches_glob("a.b.example.com", "*.example.com")
    assert not host_matches_glob("example.com", "*.example.com")
    assert not host_matches_glob("badexample.com", "*.example.com")
    assert host_matches_glob("Example1.com.", "example1.com")


# ---- the export ----------------------------------------------------------------------------------


def net(allow: list[Any] | None = None, deny: list[Any] | None = None, **more: Any) -> NetworkPolicy:
    return parse_network({"allow": allow or [], "deny": deny or [], **more}, "p.yaml")


def export(pol: NetworkPolicy, learn: bool = False) -> tuple[dict[str, Any], list[plan.Gap]]:
    p = plan.build(pol, learn=learn)
    doc, gaps = smokescreen.document(p, smokescreen.Target())
    return load_acl(yaml.safe_dump(doc)), [*p.gaps, *gaps]


def test_an_enforcing_acl_names_the_hosts_and_wildcards_unchanged() -> None:
    doc, gaps = export(net(["pypi.org", "files.pythonhosted.org", "*.githubusercontent.com", "_dmarc.example.org"]))
    assert doc == {
        "version": "v1",
        "services": [
            {
                "name": "sandgate-task",
                "project": "sandgate",
                "action": "enforce",
                "allowed_domains": [
                    "pypi.org",
                    "files.pythonhosted.org",
                    "*.githubusercontent.com",
                    "_dmarc.example.org",
                ],
            }
        ],
    }
    assert [(g.severity, g.origin) for g in gaps] == [("sandgate-only", "smokescreen")]  # the ACL has no ports
    assert "sandgate allows only 80,443" in gaps[0].text


def test_every_bundled_list_together_loads_and_names_its_hosts() -> None:
    from launcher.config import bundled
    from launcher.config import load as lpolicy
    from netguard import policy as netpolicy

    paths = [bundled.bundled_path(name) for name in bundled.bundled_names()]
    pol = netpolicy.merge([s.network for path in paths if path is not None for s in lpolicy.load_policy_file(path)])
    doc, gaps = export(pol)
    patterns = [f"*.{r.value}" if r.kind == "wildcard" else str(r.value) for r in pol.allow if r.kind != "cidr"]
    assert doc["services"][0]["allowed_domains"] == list(dict.fromkeys(patterns))
    assert not [g for g in gaps if g.severity == "refused"]


def test_a_learn_export_reports_and_keeps_explicit_denies_on_the_global_deny_list() -> None:
    doc, gaps = export(net(["a.test"], ["*.ads.test", {"host": "b.test", "ports": [25]}]), learn=True)
    assert doc["services"][0]["action"] == "report"
    assert doc["global_deny_list"] == ["*.ads.test", "b.test"]
    assert allows(doc, "sandgate-task", "new.test") and not allows(doc, "sandgate-task", "x.ads.test")
    assert ("narrowed", "p.yaml") in [(g.severity, g.origin) for g in gaps]  # b.test: every port, not only 25
    enforce, _ = export(net(["a.test"], ["*.ads.test"]))
    assert "global_deny_list" not in enforce and not allows(enforce, "sandgate-task", "new.test")


def test_cidrs_are_left_out_and_deny_cidrs_named_with_the_flag_that_does_it() -> None:
    doc, gaps = export(net(["a.test", "203.0.113.0/24"], ["192.0.2.0/24"]))
    assert doc["services"][0]["allowed_domains"] == ["a.test"]
    said = {(g.severity, g.text.split(":")[0]) for g in gaps}
    assert ("narrowed", "cidr 203.0.113.0/24") in said and ("sandgate-only", "deny cidr 192.0.2.0/24") in said
    assert any("--deny-range 192.0.2.0/24" in g.text for g in gaps)


def test_a_hole_in_a_wildcard_is_refused() -> None:
    _, gaps = export(net(["*.pypi.test"], ["evil.pypi.test"]))
    assert [g.severity for g in gaps if g.severity == "refused"] == ["refused"]


def test_no_policy_is_an_enforcing_service_that_allows_nothing() -> None:
    doc, _ = export(net())
    assert doc["services"][0]["allowed_domains"] == [] and not allows(doc, "sandgate-task", "a.test")
    assert not allows(doc, "another-service", "a.test")  # no default rule


# ---- the property: as Smokescreen matches, the names are sandgate's (ports aside) ----------------------

LABELS = st.sampled_from(["a", "b"])
SUFFIXES = st.lists(LABELS, min_size=0, max_size=2).map(lambda ls: ".".join([*ls, "x", "test"]))
PATTERNS = st.tuples(st.booleans(), SUFFIXES).map(lambda t: f"*.{t[1]}" if t[0] else t[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(PATTERNS, min_size=1, max_size=4), st.lists(PATTERNS, max_size=2))
def test_smokescreen_allows_a_name_exactly_when_sandgate_allows_it(allow: list[str], deny: list[str]) -> None:
    pol = net(allow, deny)
    if plan.build(pol).refused:
        return
    doc, _ = export(pol)
    rs = compile_policy(pol)
    names = [n for s in sorted({str(r.value) for r in (*pol.allow, *pol.deny)}) for n in (s, f"a.{s}", f"b.a.{s}")]
    for name in names:
        assert allows(doc, "sandgate-task", name) == decide(rs, name, 443).allowed, name
