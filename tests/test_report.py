"""`sandgate audit` reports: reading logs, the per-destination summary, and suggested policies.

The suggestion is checked the only way that matters: it must load with the project's own
policy loader and, compiled, allow what the runs were allowed and nothing they were denied.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher import report
from launcher.config import bundled, yamlfile
from launcher.config import load as lpolicy
from launcher.report import ReportError, read_logs, suggest, summarize
from netguard import policy as netpolicy
from netguard import rules

TS = "2026-11-29T09:48:{:02d}.000Z"
_ids = iter(range(10**9))


def dec(
    task: str,
    host: str | None,
    port: int | None,
    action: str = "allow",
    *,
    kind: str = "connect",
    sec: int = 0,
    would: str | None = None,
    rule: str | None = "policy.yaml:3",
    id: str | None = None,
    proto: str | None = None,
    qtype: str | None = None,
) -> dict[str, Any]:
    """A decision record as netguard.audit writes it (plus the learn-mode `would`)."""
    allowed_by_rule = action == "allow" and would is None
    r: dict[str, Any] = {
        "ts": TS.format(sec),
        "task": task,
        "event": "decision",
        "id": id or f"id{next(_ids)}",
        "kind": kind,
        "action": action,
        "host": host,
        "port": port,
        "ip": "198.51.100.7" if action == "allow" else None,
        "proto": proto,
        "method": None,
        "url": None,
        "qtype": qtype,
        "rule": rule if allowed_by_rule else None,
        "reason": "allowed by rule" if allowed_by_rule else "no allow rule matches",
    }
    if would is not None:
        r["would"] = would
    return r


def close(task: str, id: str, host: str, port: int, up: int, down: int, sec: int = 1) -> dict[str, Any]:
    return {
        "ts": TS.format(sec),
        "task": task,
        "event": "close",
        "id": id,
        "kind": "connect",
        "host": host,
        "port": port,
        "ip": "198.51.100.7",
        "bytes_up": up,
        "bytes_down": down,
        "duration_ms": 12,
    }


def write_log(path: Path, records: Sequence[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


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


def real_bundled(*names: str) -> dict[str, set[str]]:
    out = {}
    for n in names:
        path = bundled.bundled_path(n)
        assert path is not None
        sections = lpolicy.load_policy_file(path)
        out[n] = report.bundled_hosts(netpolicy.merge([s.network for s in sections]))
    return out


# ---- read_logs ----------------------------------------------------------------------------


def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    run1 = [
        {
            "ts": TS.format(0),
            "task": "run1",
            "event": "policy",
            "kind": "policy",
            "write": ["."],
            "private_tmp": True,
            "protect": [],
            "hidden": [],
            "env_dropped": [],
            "landlock_abi": 4,
            "warnings": [],
        },
        dec("run1", "pypi.org", None, kind="dns", sec=1, qtype="A"),
        dec("run1", "pypi.org", 443, sec=2, id="same-id"),
        dec("run1", "files.pythonhosted.org", 443, sec=3, id="f1"),
        close("run1", "same-id", "pypi.org", 443, 100, 2000, sec=4),
        close("run1", "f1", "files.pythonhosted.org", 443, 50, 70000, sec=5),
        dec("run1", "evil.test", 443, "deny", sec=6),
    ]
    run2 = [
        # The same decision id in another run must not steal run1's bytes.
        dec("run2", "pypi.org", 443, sec=10, id="same-id"),
        close("run2", "same-id", "pypi.org", 443, 1, 2, sec=11),
        dec("run2", "pypi.org", 443, sec=12, id="p2"),
        dec("run2", "new.example.com", 443, would="deny", sec=13, id="n1"),
        close("run2", "n1", "new.example.com", 443, 3, 4, sec=14),
        dec("run2", "evil.test", 443, "deny", sec=15),
        dec("run2", "evil.test", 443, "deny", sec=16),
        dec("run2", "9.9.9.9", 53, "deny", kind="packet", proto="udp", sec=17),
    ]
    return write_log(tmp_path / "a.jsonl", run1), write_log(tmp_path / "b.jsonl", run2)


def test_read_logs_keeps_file_and_line_order(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    records = read_logs([a, b])
    assert [r["task"] for r in records] == ["run1"] * 7 + ["run2"] * 8
    assert records[0]["event"] == "policy"
    assert read_logs([]) == []


def test_summary_of_two_runs_matches_bytes_by_id_and_orders_by_risk(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    rows = summarize(read_logs([a, b]))
    labels = [(r.label, r.dns) for r in rows]
    # denials first (most frequent first), then learn-mode would-denies, then allowed by count, then host
    assert labels == [
        ("evil.test:443", False),
        ("udp 9.9.9.9:53", False),
        ("new.example.com:443", False),
        ("pypi.org:443", False),
        ("files.pythonhosted.org:443", False),
        ("pypi.org", True),
    ]
    by = {(r.label, r.dns): r for r in rows}
    pypi = by[("pypi.org:443", False)]
    assert pypi.count == 3 and (pypi.bytes_up, pypi.bytes_down) == (101, 2002)
    assert pypi.decisions == {"allow"} and pypi.kinds == {"connect"} and pypi.rules == {"policy.yaml:3"}
    assert (pypi.first_seen, pypi.last_seen) == (TS.format(2), TS.format(12))
    assert pypi.tasks == {"run1", "run2"}
    assert by[("files.pythonhosted.org:443", False)].bytes_down == 70000
    evil = by[("evil.test:443", False)]
    assert evil.count == 3 and evil.decisions == {"deny"} and evil.rules == set()
    assert (evil.first_seen, evil.last_seen) == (TS.format(6), TS.format(16))
    new = by[("new.example.com:443", False)]
    assert new.decisions == {"would-deny"} and new.rules == set() and (new.bytes_up, new.bytes_down) == (3, 4)
    dns = by[("pypi.org", True)]
    assert dns.port is None and dns.kinds == {"dns"} and dns.count == 1
    packet = by[("udp 9.9.9.9:53", False)]
    assert packet.proto == "udp" and packet.port == 53


def test_summary_mixed_decisions_and_packet_keys() -> None:
    rows = summarize(
        [
            dec("t", "x.test", 443),
            dec("t", "x.test", 443, would="deny"),
            dec("t", "9.9.9.9", 53, "deny", kind="packet", proto="udp"),
            dec("t", "9.9.9.9", 53, "deny", kind="packet", proto="tcp"),
            dec("t", "x.test", None, kind="dns"),
        ]
    )
    by = {r.label: r for r in rows}
    assert by["x.test:443"].decisions == {"allow", "would-deny"}
    assert {"udp 9.9.9.9:53", "tcp 9.9.9.9:53", "x.test"} <= set(by)
    assert rows[-1].risk == 2 and by["x.test:443"].risk == 1


def test_truncated_last_line_is_skipped(tmp_path: Path) -> None:
    recs = [dec("t", "a.test", 443), dec("t", "b.test", 443)]
    cut = json.dumps(dec("t", "c.test", 443))[:40]
    assert [r["host"] for r in read_logs([write_log(tmp_path / "cut.jsonl", recs, cut)])] == ["a.test", "b.test"]
    # garbage on the last line even with its newline (NUL padding after a crash), then blank lines
    nul = write_log(tmp_path / "nul.jsonl", recs, "\0\0\0\0\n\n")
    assert len(read_logs([nul])) == 2
    # a complete record that only lacks its newline is kept: no prefix of a JSON object is one
    whole = write_log(tmp_path / "whole.jsonl", recs, json.dumps(dec("t", "c.test", 443)))
    assert [r["host"] for r in read_logs([whole])] == ["a.test", "b.test", "c.test"]


@pytest.mark.parametrize("garbage", ["{not json", "[1, 2]", "42", "\udcff"])
def test_invalid_line_mid_file_names_file_and_line(tmp_path: Path, garbage: str) -> None:
    path = tmp_path / "bad.jsonl"
    body = json.dumps(dec("t", "a.test", 443)) + "\n" + garbage + "\n" + json.dumps(dec("t", "b.test", 443)) + "\n"
    path.write_bytes(body.encode("utf-8", "surrogateescape"))
    with pytest.raises(ReportError) as e:
        read_logs([write_log(tmp_path / "ok.jsonl", [dec("t", "z.test", 443)]), path])
    assert str(e.value) == f"{path}:2: not a JSON record"
    assert "\n" not in str(e.value)


def test_missing_log_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ReportError, match="nope.jsonl"):
        read_logs([missing])
    with pytest.raises(ReportError, match="cannot read"):
        read_logs([tmp_path])


# ---- table and JSON ------------------------------------------------------------------------


def test_format_table_is_aligned_and_escapes_logged_text(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    records = read_logs([a, b]) + [dec("t", "\x1b[31mred\nx.test", 443, "deny")]
    text = report.format_table(summarize(records))
    lines = text.splitlines()
    assert lines[0].split() == [
        "STATUS",
        "DESTINATION",
        "KINDS",
        "COUNT",
        "UP",
        "DOWN",
        "FIRST",
        "SEEN",
        "LAST",
        "SEEN",
        "RULES",
    ]
    assert len(lines) == 1 + 7
    assert "\x1b" not in text and "\\x1b[31mred\\x0ax.test:443" in text
    col = lines[0].index("DESTINATION")
    assert all(line[col - 2 : col] == "  " for line in lines)  # every row starts its DESTINATION at the same column
    assert lines[1].startswith("deny ")
    assert any(line.startswith("would-deny") and "new.example.com:443" in line for line in lines)
    assert report.format_table([]).startswith("STATUS")


def test_as_json_is_plain_json(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    out = report.as_json(summarize(read_logs([a, b])))
    assert json.loads(json.dumps(out)) == out
    first = out[0]
    assert first["host"] == "evil.test" and first["decisions"] == ["deny"] and first["count"] == 3
    pypi = next(r for r in out if r["host"] == "pypi.org" and not r["dns"])
    assert pypi["bytes_up"] == 101 and pypi["tasks"] == ["run1", "run2"] and pypi["kinds"] == ["connect"]


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
    assert report.registrable_domain(name) == expected


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
    text = suggest(recs, bundled={"github": {"github.com", "api.github.com"}})
    assert yamlfile.parse_yaml(text, "suggested")["include"] == ["github"]
    assert allow_entries(text) == [{"host": "github.com", "ports": [22, 443]}]
    rs = effective(text, tmp_path)
    assert rules.decide(rs, "github.com", 22).allowed and rules.decide(rs, "api.github.com", 443).allowed


def test_bundled_wildcard_patterns_and_denied_note() -> None:
    recs = [dec("t", "us.archive.ubuntu.com", 80), dec("t", "security.ubuntu.com", 80, "deny")]
    text = suggest(recs, bundled={"ubuntu": {"*.archive.ubuntu.com", "security.ubuntu.com"}})
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
        assert rules.decide(rs, row.host or "", row.port).allowed == bool(row.decisions & report.ALLOWED), row.label


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


def _records(seen: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
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
        assert report.public_suffix(body) != body  # the wildcard's suffix is registrable, not public
        covered = {h for h, _, _ in seen if h.endswith("." + body)}
        assert len(covered) >= report.WILDCARD_MIN_SIBLINGS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seen_hosts())
def test_property_suggestion_allows_exactly_what_was_allowed(seen: list[tuple[str, int, str]]) -> None:
    records = _records(seen)
    text = suggest(records)
    rs = rules.compile_policy(load_suggestion(text))  # no includes here: the file alone is the policy
    for row in summarize(records):
        assert rules.decide(rs, row.host or "", row.port).allowed == bool(row.decisions & report.ALLOWED), row.label
