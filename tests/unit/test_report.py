"""`sandgate audit` reports: reading logs, and the per-destination summary (why each was refused)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from launcher.audit import summary
from launcher.audit.logs import read_logs
from launcher.audit.summary import summarize
from netguard import audit
from netguard.audit import LogError as ReportError
from netguard.audit import Record

from ..support.audit_records import TS, dec, real_bundled, two_runs, write_log

# ---- read_logs ----------------------------------------------------------------------------


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


def hosts(records: Sequence[Record]) -> list[str | None]:
    return [r["host"] for r in records if r["event"] == "decision"]


def test_truncated_last_line_is_skipped(tmp_path: Path) -> None:
    recs = [dec("t", "a.test", 443), dec("t", "b.test", 443)]
    cut = json.dumps(dec("t", "c.test", 443))[:40]
    assert hosts(read_logs([write_log(tmp_path / "cut.jsonl", recs, cut)])) == ["a.test", "b.test"]
    # garbage on the last line even with its newline (NUL padding after a crash), then blank lines
    nul = write_log(tmp_path / "nul.jsonl", recs, "\0\0\0\0\n\n")
    assert len(read_logs([nul])) == 2
    # a complete record that only lacks its newline is kept: no prefix of a JSON object is one
    whole = write_log(tmp_path / "whole.jsonl", recs, json.dumps(dec("t", "c.test", 443)))
    assert hosts(read_logs([whole])) == ["a.test", "b.test", "c.test"]


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
    with pytest.raises(ReportError, match=r"nope\.jsonl"):
        read_logs([missing])
    with pytest.raises(ReportError, match="cannot read"):
        read_logs([tmp_path])


# ---- table and JSON ------------------------------------------------------------------------


def test_format_table_is_aligned_and_escapes_logged_text(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    records = [*read_logs([a, b]), dec("t", "\x1b[31mred\nx.test", 443, "deny")]
    text = summary.format_table(summarize(records))
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
        "REASON",
    ]
    assert len(lines) == 1 + 7
    assert "\x1b" not in text and "\\x1b[31mred\\x0ax.test:443" in text
    col = lines[0].index("DESTINATION")
    assert all(line[col - 2 : col] == "  " for line in lines)  # every row starts its DESTINATION at the same column
    assert lines[1].startswith("deny ")
    assert any(line.startswith("would-deny") and "new.example.com:443" in line for line in lines)
    assert summary.format_table([]).startswith("STATUS")


def test_as_json_is_plain_json(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path)
    out = summary.as_json(summarize(read_logs([a, b])))
    assert json.loads(json.dumps(out)) == out
    first = out[0]
    assert first["host"] == "evil.test" and first["decisions"] == ["deny"] and first["count"] == 3
    pypi = next(r for r in out if r["host"] == "pypi.org" and not r["dns"])
    assert pypi["bytes_up"] == 101 and pypi["tasks"] == ["run1", "run2"] and pypi["kinds"] == ["connect"]


# ---- why each destination was refused (issue 11) -------------------------------------------------


def test_summary_reason_says_why_and_what_would_allow_it() -> None:
    recs = [
        dec("t", "files.pythonhosted.org", 443, "deny"),
        dec("t", "blocked.test", 443, "deny", rule=None),
        dec("t", "ok.test", 443),
        dec("t", "new.test", 443, would="deny"),
        dec("t", "9.9.9.9", 53, "deny", kind="packet", proto="udp"),
    ]
    recs[1] = audit.parse({**recs[1], "reason": "denied by rule blocked.test"})
    recs[4] = audit.parse({**recs[4], "reason": "udp packet dropped by the sandbox firewall"})
    rows = summarize(recs)
    bundled = real_bundled("pypi")
    got = {d.label: summary.reason(d, bundled) for d in rows}
    assert got["files.pythonhosted.org:443"] == (
        "no allow rule matches: allow it with --allow pypi (or --allow files.pythonhosted.org)"
    )
    assert got["blocked.test:443"] == "denied by rule blocked.test (deny beats allow: remove that rule to reach it)"
    assert got["new.test:443"] == "no allow rule matches: allow it with --allow new.test"  # learn mode: what to add
    assert (got["udp 9.9.9.9:53"] or "").startswith(
        "udp packet dropped by the sandbox firewall: udp traffic never leaves"
    )
    assert got["ok.test:443"] is None
    table = summary.format_table(rows, bundled).splitlines()
    col = table[0].index("REASON")
    assert table[0].endswith("REASON") and all(line[col - 2 : col] == "  " for line in table if len(line) > col)
    assert next(x for x in table if "ok.test" in x).endswith("-")
    assert any(x[col:].startswith("no allow rule matches: allow it with --allow pypi") for x in table)
    out = {(r["host"], r["port"]): r for r in summary.as_json(rows, bundled)}
    assert out[("blocked.test", 443)]["reasons"] == ["denied by rule blocked.test"]
    assert out[("blocked.test", 443)]["reason"] == got["blocked.test:443"] and out[("ok.test", 443)]["reason"] is None


def test_summary_reason_is_escaped() -> None:
    rec = audit.parse({**dec("t", "x.test", 443, "deny"), "reason": "no allow rule\x1b[2J\nmatches"})
    text = summary.format_table(summarize([rec]))
    assert "\x1b" not in text and len(text.splitlines()) == 2 and "rule\\x1b[2J\\x0amatches" in text


# ---- inspected requests and attempted leaks ------------------------------------------------------


def inspected_run() -> list[Record]:
    """One run: git.test inspected (a fetch allowed, a push refused twice), other.test an attempted leak,
    all.test inspected with a connection-level close (its bytes count once)."""
    req = audit.request_record
    return [
        audit.decision_record("r", "c1", "connect", "allow", "git.test", 443, ip="192.0.2.1", rule="p.yaml:3"),
        req("r", "c1", "connect", "allow", "git.test", 443, "POST", "/o/r/git-upload-pack", status=200, bytes_down=5),
        *[
            req("r", "c1", "connect", "deny", "git.test", 443, "POST", "/o/r/git-receive-pack", status=403,
                rule="p.yaml:3", reason="POST /o/r/git-receive-pack not allowed on git.test (allowed: read-only)")
            for _ in range(2)
        ],
        audit.decision_record("r", "c2", "connect", "allow", "other.test", 443, ip="192.0.2.2", rule="p.yaml:9"),
        req("r", "c2", "connect", "deny", "other.test", 443, "GET", "/", status=403, rule="p.yaml:20",
            reason="attempted leak: the sentinel of $API_KEY (bound to api.test) sent to other.test in header X",
            leak="API_KEY"),
        audit.decision_record("r", "c3", "connect", "allow", "all.test", 443, ip="192.0.2.3", rule="p.yaml:5"),
        req("r", "c3", "connect", "allow", "all.test", 443, "GET", "/", status=200, bytes_down=7),
        audit.close_record("r", "c3", "connect", "all.test", 443, "192.0.2.3", 10, 100, 5),
    ]  # fmt: skip


def test_attempted_leaks_come_first_and_refused_requests_are_listed_apart() -> None:
    rows = summarize(inspected_run())
    assert [r.label for r in rows] == ["other.test:443", "git.test:443", "all.test:443"]
    leak, git, whole = rows
    assert leak.risk == -1 and git.risk == 0 and whole.risk == 2  # a refused request is not "all allowed"
    assert (git.count, git.requests, git.bytes_down) == (1, 3, 5)  # one decision, three requests
    assert whole.bytes_down == 100  # the connection's close counts; its request's bytes are not added again
    (push,) = git.refused
    assert (push.method, push.path, push.count, push.rule, push.leak) == ("POST", "/o/r/git-receive-pack", 2,
                                                                          "p.yaml:3", None)  # fmt: skip
    text = summary.format_table(rows)
    assert text.startswith("ATTEMPTED LEAKS (refused)\n  ATTEMPTED LEAK of $API_KEY: GET / on other.test refused")
    assert text.rstrip().endswith(
        "REFUSED REQUESTS\n  refused POST /o/r/git-receive-pack on git.test (2x): POST /o/r/git-receive-pack not "
        "allowed on git.test (allowed: read-only) [rule p.yaml:3]"
    )
    out = summary.as_json(rows)
    assert json.loads(json.dumps(out)) == out
    assert out[0]["refused_requests"][0]["leak"] == "API_KEY" and out[1]["requests"] == 3
    assert [x["count"] for x in out[1]["refused_requests"]] == [2]


def test_learning_a_policy_from_inspected_runs_still_works() -> None:
    from launcher.audit import suggest

    text = suggest.suggest(inspected_run(), name="x", bundled={})
    assert "git.test" in text and "all.test" in text


def test_request_records_round_trip_through_the_reader(tmp_path: Path) -> None:
    written = inspected_run()
    log = write_log(tmp_path / "a.jsonl", written)
    back = list(audit.read(log))
    assert back == written and sum(r["event"] == "request" for r in back) == 5
