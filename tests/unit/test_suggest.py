"""`sandgate audit suggest`: the suggested policy, and the public-suffix guard on its wildcards.

The suggestion is checked the only way that matters: it must load with the project's own
policy loader and, compiled, allow what the runs were allowed and nothing they were denied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.audit import suffixes, summary
from launcher.audit import suggest as suggesting
from launcher.audit.logs import read_logs
from launcher.audit.suggest import suggest
from launcher.audit.summary import summarize
from launcher.config import load as lpolicy
from launcher.config import yamlfile
from netguard import policy as netpolicy
from netguard import rules
from netguard.audit import Record

from ..support.audit_records import TS, dec, empty_policy, patterns, real_bundled, two_runs


def load_suggestion(text: str) -> netpolicy.NetworkPolicy:
    """Exactly how the brief says a suggestion must parse: the project's YAML loader, then netguard."""
    doc = yamlfile.parse_yaml(text, "suggested")
    assert doc["version"] == 1
    return netpolicy.parse_network(doc["network"], "suggested")


def effective(text: str, tmp_path: Path) -> rules.Ruleset:
    """The suggestion as `sandgate run --policy` would enforce it, includes resolved."""
    f = tmp_path / "suggested.yaml"
    f.write_text(text, encoding="utf-8")
    return rules.compile_policy(lpolicy.build_policy([f], [], []).network)


def allow_entries(text: str) -> list[Any]:
    return list(yamlfile.parse_yaml(text, "suggested")["network"].get("allow") or [])


def wildcards(text: str) -> list[str]:
    out = []
    for e in allow_entries(text):
        pat = e if isinstance(e, str) else e.get("host")
        if isinstance(pat, str) and pat.startswith("*."):
            out.append(pat)
    return out


# ---- public suffixes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.b.example.com", "example.com"),
        ("example.com", "example.com"),
        ("a.github.io", "a.github.io"),
        ("github.io", None),
        ("x.co.uk", "x.co.uk"),
        ("deep.x.co.uk", "x.co.uk"),
        ("co.uk", None),
        ("a.b.internal", "b.internal"),  # unknown TLDs are public suffixes (the PSL's default rule)
        ("internal", None),
        ("a.www.ck", "www.ck"),  # exception rule !www.ck
        ("a.foo.ck", "a.foo.ck"),  # wildcard rule *.ck
    ],
)
def test_registrable_domain(name: str, expected: str | None) -> None:
    assert suffixes.registrable_domain(name) == expected


# ---- suggest ---------------------------------------------------------------------------------


def test_suggestion_header_and_description() -> None:
    recs = [dec("t1", "a.test", 443), dec("t2", "b.test", 443)]
    text = suggest(recs, name='pip "install"\nfor CI')
    assert text.splitlines()[0] == "# suggested by sandgate audit suggest from 2 records of 2 runs (tasks: t1, t2)"
    doc = yamlfile.parse_yaml(text, "suggested")
    assert doc["description"] == 'pip "install"\nfor CI'
    assert "description" not in yamlfile.parse_yaml(suggest(recs), "suggested")


def test_suggest_uses_bundled_list_when_its_host_is_seen(tmp_path: Path) -> None:
    recs = [dec("t", "pypi.org", 443), dec("t", "files.pythonhosted.org", 443), dec("t", "other.test", 443)]
    text = suggest(recs, bundled=real_bundled("pypi", "npm", "github"))
    doc = yamlfile.parse_yaml(text, "suggested")
    assert doc["include"] == ["pypi"]
    assert allow_entries(text) == ["other.test"]
    load_suggestion(text)
    rs = effective(text, tmp_path)
    for host in ("pypi.org", "files.pythonhosted.org", "other.test"):
        assert rules.decide(rs, host, 443).allowed


def test_bundled_host_on_another_port_is_still_listed(tmp_path: Path) -> None:
    recs = [dec("t", "github.com", 443), dec("t", "github.com", 22), dec("t", "api.github.com", 443)]
    text = suggest(recs, bundled={"github": patterns("github.com", "api.github.com")})
    assert yamlfile.parse_yaml(text, "suggested")["include"] == ["github"]
    assert allow_entries(text) == [{"host": "github.com", "ports": [22, 443]}]
    rs = effective(text, tmp_path)
    assert rules.decide(rs, "github.com", 22).allowed and rules.decide(rs, "api.github.com", 443).allowed


def test_bundled_wildcard_patterns_and_denied_note() -> None:
    recs = [dec("t", "us.archive.ubuntu.com", 80), dec("t", "security.ubuntu.com", 80, "deny")]
    text = suggest(recs, bundled={"ubuntu": patterns("*.archive.ubuntu.com", "security.ubuntu.com")})
    assert yamlfile.parse_yaml(text, "suggested")["include"] == ["ubuntu"]
    assert "# denied, not suggested: security.ubuntu.com:80 (1 time); note: include ubuntu allows it" in text


def test_three_siblings_make_a_wildcard_two_do_not(tmp_path: Path) -> None:
    three = [dec("t", f"{s}.example.com", 443, sec=i) for i, s in enumerate("abc")] + [dec("t", "example.com", 443)]
    text = suggest(three)
    assert wildcards(text) == ["*.example.com"]
    assert '- "*.example.com"' in text
    assert "covers a.example.com, b.example.com, c.example.com: 3 connections, first seen " + TS.format(0) in text
    assert "example.com" in allow_entries(text)  # the apex is not covered by *.example.com
    rs = effective(text, tmp_path)
    for h in ("a.example.com", "b.example.com", "c.example.com", "example.com"):
        assert rules.decide(rs, h, 443).allowed

    two = suggest([dec("t", "a.example.com", 443), dec("t", "b.example.com", 443)])
    assert wildcards(two) == []
    assert allow_entries(two) == ["a.example.com", "b.example.com"]


def test_wildcard_counts_distinct_hosts_not_connections() -> None:
    recs = [dec("t", "a.example.com", 443) for _ in range(5)] + [dec("t", "b.example.com", 443)]
    assert wildcards(suggest(recs)) == []


def test_wildcard_goes_at_the_registrable_domain() -> None:
    recs = [dec("t", h, 443) for h in ("x.cdn.example.co.uk", "y.cdn.example.co.uk", "z.example.co.uk")]
    assert wildcards(suggest(recs)) == ["*.example.co.uk"]


@pytest.mark.parametrize("suffix", ["github.io", "co.uk", "s3.amazonaws.com", "internal"])
def test_no_wildcard_at_a_public_suffix(suffix: str) -> None:
    recs = [dec("t", f"{s}.{suffix}", 443) for s in ("a", "b", "c", "d")]
    text = suggest(recs)
    assert wildcards(text) == []
    assert allow_entries(text) == sorted(f"{s}.{suffix}" for s in "abcd")


def test_wildcard_is_not_proposed_over_a_denied_sibling(tmp_path: Path) -> None:
    recs = [dec("t", f"{s}.example.com", 443) for s in "abc"] + [dec("t", "evil.example.com", 443, "deny")]
    text = suggest(recs)
    assert wildcards(text) == []
    assert "# denied, not suggested: evil.example.com:443 (1 time)" in text
    assert not rules.decide(effective(text, tmp_path), "evil.example.com", 443).allowed
    # a denial on a port the wildcard would not allow does not block it
    recs[-1] = dec("t", "evil.example.com", 22, "deny")
    assert wildcards(suggest(recs)) == ["*.example.com"]


def test_non_web_ports_use_the_mapping_form(tmp_path: Path) -> None:
    recs = [
        dec("t", "git.example.org", 22),
        dec("t", "git.example.org", 443),
        dec("t", "web.example.org", 80),
        dec("t", "web.example.org", 443),
    ]
    text = suggest(recs)
    assert allow_entries(text) == [{"host": "git.example.org", "ports": [22, 443]}, "web.example.org"]
    rs = effective(text, tmp_path)
    assert rules.decide(rs, "git.example.org", 22).allowed and not rules.decide(rs, "git.example.org", 80).allowed


def test_a_denied_web_port_is_not_reopened_by_the_default_ports(tmp_path: Path) -> None:
    recs = [dec("t", "api.example.org", 443), dec("t", "api.example.org", 80, "deny")]
    text = suggest(recs)
    assert allow_entries(text) == [{"host": "api.example.org", "ports": [443]}]
    assert not rules.decide(effective(text, tmp_path), "api.example.org", 80).allowed


def test_denied_destinations_appear_only_as_comments(tmp_path: Path) -> None:
    recs = [
        dec("t", "ok.test", 443),
        dec("t", "evil.test", 443, "deny"),
        dec("t", "evil.test", 443, "deny"),
        dec("t", "exfil.test", None, "deny", kind="dns", qtype="TXT"),
        dec("t", "203.0.113.9", 4444, "deny", kind="tcp"),
        dec("t", "9.9.9.9", 53, "deny", kind="packet", proto="udp"),
    ]
    text = suggest(recs)
    assert allow_entries(text) == ["ok.test"]
    comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
    assert "# denied, not suggested: evil.test:443 (2 times)" in comments
    assert "# denied, not suggested: exfil.test (dns lookup) (1 time)" in comments
    assert "# denied, not suggested: 203.0.113.9:4444 (1 time)" in comments
    assert "# dropped, not suggested: udp 9.9.9.9:53 (1 time)" in comments
    rs = effective(text, tmp_path)
    assert not rules.decide(rs, "evil.test", 443).allowed
    assert not rules.decide(rs, "exfil.test", None).allowed
    assert not rules.decide(rs, "203.0.113.9", 4444).allowed


def test_learn_mode_would_denies_are_suggested(tmp_path: Path) -> None:
    recs = [dec("t", "new.test", 443, would="deny"), dec("t", "old.test", 443)]
    text = suggest(recs)
    assert allow_entries(text) == ["new.test", "old.test"]
    rs = effective(text, tmp_path)
    assert rules.decide(rs, "new.test", 443).allowed


def test_dns_only_hosts_are_comments() -> None:
    recs = [
        dec("t", "looked.up.test", None, kind="dns"),
        dec("t", "used.test", None, kind="dns"),
        dec("t", "used.test", 443),
    ]
    text = suggest(recs)
    assert allow_entries(text) == ["used.test"]
    assert "# resolved only: looked.up.test (1 lookup)" in text


def test_ip_destinations_become_cidr_entries_with_ports(tmp_path: Path) -> None:
    recs = [
        dec("t", "203.0.113.7", 22, kind="tcp"),
        dec("t", "203.0.113.7", 443, kind="connect"),
        dec("t", "2001:db8::7", 8080, kind="tcp", would="deny"),
    ]
    text = suggest(recs)
    assert allow_entries(text) == [
        {"cidr": "203.0.113.7/32", "ports": [22, 443]},
        {"cidr": "2001:db8::7/128", "ports": [8080]},
    ]
    rs = effective(text, tmp_path)
    assert rules.decide(rs, "203.0.113.7", 22).allowed and rules.decide(rs, "2001:db8::7", 8080).allowed
    assert not rules.decide(rs, "203.0.113.7", 80).allowed


def test_logged_text_cannot_inject_policy_lines(tmp_path: Path) -> None:
    evil = "x.test\n    - attacker.test\n#"
    recs = [
        dec("t", evil, 443, "deny"),
        dec("t\n    - task.test", "ok.test", 443),
        dec("t", "y.test\u2028- ls.test", 443, "deny"),
        dec("t", "z.test\x85- nel.test", 443, "deny"),
    ]
    text = suggest(recs, name="n\n  allow: [name.test]")
    assert allow_entries(text) == ["ok.test"]
    load_suggestion(text)
    rs = effective(text, tmp_path)
    for h in ("attacker.test", "task.test", "ls.test", "nel.test", "name.test"):
        assert not rules.decide(rs, h, 443).allowed
    assert all(ch == "\n" or 0x20 <= ord(ch) < 0x7F for ch in text)


def test_empty_log_suggests_an_empty_but_valid_policy() -> None:
    text = suggest([])
    assert load_suggestion(text).allow == ()
    assert text.startswith("# suggested by sandgate audit suggest from 0 records of 0 runs")


def _policy(learn: bool | None) -> Record:
    return empty_policy("t", "/w", learn)


def test_a_learn_run_that_fetched_nothing_is_said_to_maybe_have_been_served_by_caches() -> None:
    note = f"  # note: {summary.NOTHING_FETCHED}"
    text = suggest([_policy(True)])
    assert note in text.splitlines() and load_suggestion(text).allow == ()  # still a valid (empty) policy
    assert note not in suggest([_policy(True), dec("t", "x.test", 443)]).splitlines()  # it fetched something
    assert note not in suggest([_policy(False)]).splitlines() and note not in suggest([_policy(None)]).splitlines()


def test_full_round_trip_through_the_policy_loader(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    records = (
        read_logs([a, b])
        + [dec("run3", f"{s}.cdn.example.net", 443) for s in ("eu", "us", "ap")]
        + [dec("run3", "git.example.org", 2222), dec("run3", "203.0.113.5", 8443, kind="tcp")]
    )
    text = suggest(records, name="two runs", bundled=real_bundled("pypi", "github"))
    net = load_suggestion(text)
    assert yamlfile.parse_yaml(text, "suggested")["include"] == ["pypi"]
    assert {r.describe() for r in net.allow} == {
        "*.example.net:80,443",
        "git.example.org:2222",
        "new.example.com:80,443",
        "203.0.113.5/32:8443",
    }
    rs = effective(text, tmp_path)
    for row in summarize(records):
        if row.dns or row.proto is not None:
            continue
        assert rules.decide(rs, row.host or "", row.port).allowed == bool(row.decisions & summary.ALLOWED), row.label


# ---- properties -------------------------------------------------------------------------------

PUBLIC_SUFFIXES = [
    "com",
    "org",
    "uk",
    "co.uk",
    "github.io",
    "s3.amazonaws.com",
    "blogspot.com",
    "herokuapp.com",
    "internal",
    "test",
    "ck",
    "jp",
    "kawasaki.jp",
    "appspot.com",
    "io",
]
LABEL = st.sampled_from(["a", "b", "c", "d", "www", "api", "cdn", "x-1", "city", "foo"])
PORT = st.sampled_from([80, 443, 443, 8443, 22])


@st.composite
def seen_hosts(draw: st.DrawFn) -> list[tuple[str, int, str]]:
    """(host, port, action) under a few public suffixes, including hosts that are suffixes themselves (PSL wildcards)."""
    suffix = draw(st.sampled_from(PUBLIC_SUFFIXES))
    base = draw(LABEL)  # a shared parent label makes sibling groups (and so wildcard candidates) common
    out = []
    for _ in range(draw(st.integers(1, 12))):
        labels = draw(st.lists(LABEL, min_size=0 if draw(st.booleans()) else 1, max_size=2))
        if draw(st.booleans()) or not labels:
            labels.append(base)
        action = draw(st.sampled_from(["allow", "allow", "allow", "would-deny", "deny"]))
        out.append((".".join([*labels, suffix]), draw(PORT), action))
    return out


def _records(seen: list[tuple[str, int, str]]) -> list[Record]:
    recs = []
    for host, port, action in seen:
        if action == "would-deny":
            recs.append(dec("t", host, port, would="deny"))
        else:
            recs.append(dec("t", host, port, action))
    return recs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seen_hosts())
def test_property_no_wildcard_at_a_public_suffix(seen: list[tuple[str, int, str]]) -> None:
    text = suggest(_records(seen))
    known = set(PUBLIC_SUFFIXES)
    for pat in wildcards(text):
        body = pat[2:]
        assert body not in known
        assert suffixes.public_suffix(body) != body  # the wildcard's suffix is registrable, not public
        covered = {h for h, _, _ in seen if h.endswith("." + body)}
        assert len(covered) >= suggesting.WILDCARD_MIN_SIBLINGS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seen_hosts())
def test_property_suggestion_allows_exactly_what_was_allowed(seen: list[tuple[str, int, str]]) -> None:
    records = _records(seen)
    text = suggest(records)
    rs = rules.compile_policy(load_suggestion(text))  # no includes here: the file alone is the policy
    for row in summarize(records):
        assert rules.decide(rs, row.host or "", row.port).allowed == bool(row.decisions & summary.ALLOWED), row.label
