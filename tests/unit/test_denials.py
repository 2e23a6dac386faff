"""launcher.audit.denials: the exit line names what was refused and the flag that would allow it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.audit import denials
from netguard import audit, rules
from netguard.audit import Record
from netguard.policy import NetworkPolicy, Rule
from sgbase.origin import Origin

PYPI = rules.compile_policy(
    NetworkPolicy(
        allow=(
            Rule("host", "pypi.org", frozenset({443}), Origin("allowlists/pypi.yaml", 3)),
            Rule("wildcard", "pythonhosted.org", frozenset({443}), Origin("allowlists/pypi.yaml", 4)),
        )
    )
)


def rec(kind: audit.Kind, host: str, port: int | None, reason: str = "no allow rule matches", **kw: Any) -> Record:
    """A denial as the writer makes it."""
    task = kw.pop("task", "t")
    return audit.decision_record(task, "id", kind, kw.pop("action", "deny"), host, port, reason=reason, **kw)


def test_most_frequent_first_and_dns_merged_with_its_connection() -> None:
    recs = [
        rec("dns", "files.pythonhosted.org", None),
        rec("connect", "files.pythonhosted.org", 443),
        rec("connect", "evil.test", 443),
        rec("connect", "evil.test", 443),
        rec("connect", "evil.test", 443),
        rec("connect", "x.test", 443, task="other"),
        rec("connect", "ok.test", 443, action="allow"),
    ]
    got = denials.collect(recs, "t")
    assert [(d.host, d.port, d.count) for d in got] == [("evil.test", 443, 3), ("files.pythonhosted.org", 443, 2)]


def test_a_host_in_a_bundled_list_suggests_the_list_then_the_host() -> None:
    lines = denials.lines([rec("connect", "files.pythonhosted.org", 443)], "t", {"pypi": PYPI})
    assert lines == [
        "sandgate: denied files.pythonhosted.org:443: allow it with --allow pypi (or --allow files.pythonhosted.org)"
    ]


def test_other_ports_ips_and_unresolvable_names() -> None:
    b = {"pypi": PYPI}
    assert (
        denials.advice(denials.Denied("git.test", 22, "tcp", 1, "no allow rule matches"), b)
        == "allow it with --allow git.test:22"
    )
    assert (
        denials.advice(denials.Denied("198.51.100.7", 22, "tcp", 1, "IP address not in any allowed cidr"), b)
        == "allow it with --allow 198.51.100.7/32:22"
    )
    assert (
        denials.advice(denials.Denied("2001:db8::1", 443, "tcp", 1, "IP address not in any allowed cidr"), b)
        == "allow it with --allow [2001:db8::1/128]"
    )
    assert (
        denials.advice(denials.Denied("nowhere.test", 443, "connect", 1, "cannot resolve nowhere.test: x"), b)
        == "does not resolve"
    )


def test_nothing_is_suggested_that_should_stay_closed() -> None:
    b = {"pypi": PYPI}
    veto = denials.advice(denials.Denied("a.test", 443, "connect", 1, "resolved to 127.0.0.1 (loopback)"), b)
    assert "--allow" not in veto and "cidr" in veto
    assert "--allow" not in denials.advice(denials.Denied("198.51.100.9", 53, "packet", 1, "x", proto="udp"), b)
    rule = denials.advice(denials.Denied("x.test", 443, "connect", 1, "denied by rule x.test"), b)
    assert "--allow" not in rule and "deny beats allow" in rule


def test_a_resolver_in_trouble_is_not_called_a_name_that_does_not_resolve() -> None:
    """Issue 23: a slow or failing resolver made the exit line say an allowed host "does not resolve"."""
    reasons = {
        "cannot resolve a.test: no such name (NXDOMAIN)": "does not resolve",
        "cannot resolve a.test: no address (NODATA)": "does not resolve",
        "cannot resolve a.test: the resolver did not answer within 15 s": (
            "the resolver did not answer within 15 s (a lookup failure, not the policy: try again)"
        ),
        "cannot resolve a.test: the resolver failed (SERVFAIL)": (
            "the resolver failed (SERVFAIL) (a lookup failure, not the policy: try again)"
        ),
    }
    for reason, said in reasons.items():
        out = denials.lines([rec("connect", "a.test", 443, reason=reason)], "t", {})
        assert out == [f"sandgate: denied a.test:443: {said}"], reason
        assert denials.explain(denials.Denied("a.test", 443, "connect", 1, reason), {}) == reason


def test_only_a_few_are_named_and_the_rest_counted() -> None:
    recs = [rec("connect", f"h{i}.test", 443) for i in range(5)]
    out = denials.lines(recs, "t", {})
    assert len(out) == denials.SHOWN + 1 and "2 more destinations" in out[-1]


def test_explain_says_why_then_what_would_allow_it() -> None:
    b = {"pypi": PYPI}
    d = denials.Denied("files.pythonhosted.org", 443, "connect", 1, "no allow rule matches")
    assert denials.explain(d, b) == (
        "no allow rule matches: allow it with --allow pypi (or --allow files.pythonhosted.org)"
    )
    rule = denials.Denied("x.test", 443, "connect", 1, "denied by rule x.test")
    assert denials.explain(rule, b) == denials.advice(rule, b)  # the advice already names the rule
    dead = denials.Denied("nowhere.test", 443, "connect", 1, "cannot resolve nowhere.test: NXDOMAIN")
    assert denials.explain(dead, b) == "cannot resolve nowhere.test: NXDOMAIN"
    packet = denials.Denied("198.51.100.9", 53, "packet", 1, "udp packet dropped by the sandbox firewall", "udp")
    assert denials.explain(packet, b).startswith("udp packet dropped by the sandbox firewall: udp traffic never")


# ---- the exit line: attempted leaks first, then refused requests, then denied destinations ------------


def test_the_exit_line_shows_attempted_leaks_first_then_refused_requests(tmp_path: Path) -> None:
    from launcher.run.summary import summary

    req = audit.request_record
    records: list[Record] = [
        audit.decision_record("t", "c1", "connect", "allow", "git.test", 443, ip="192.0.2.1"),
        req("t", "c1", "connect", "allow", "git.test", 443, "GET", "/o/r/info/refs", status=200),
        req("t", "c1", "connect", "deny", "git.test", 443, "POST", "/o/r/git-receive-pack", status=403,
            rule="p.yaml:3", reason="POST /o/r/git-receive-pack not allowed on git.test (allowed: read-only)"),
        audit.decision_record("t", "c2", "http", "allow", "other.test", 80, ip="192.0.2.2", url="http://other.test/"),
        req("t", "c2", "http", "deny", "other.test", 80, "GET", "/", status=403, rule="p.yaml:20",
            reason="attempted leak: the sentinel of $API_KEY (bound to api.test) sent to other.test in the URL",
            leak="API_KEY"),
        audit.decision_record("u", "c3", "connect", "deny", "x.test", 443),  # another run's: not counted
    ]  # fmt: skip
    log = tmp_path / "a.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summary(log, "t").splitlines() == [
        f"sandgate: 2 allowed, 0 denied, 1 request refused, 1 ATTEMPTED LEAK -> {log}",
        "sandgate: ATTEMPTED LEAK of $API_KEY: GET / on other.test refused: attempted leak: the sentinel of "
        "$API_KEY (bound to api.test) sent to other.test in the URL",
        "sandgate: refused POST /o/r/git-receive-pack on git.test: POST /o/r/git-receive-pack not allowed on "
        "git.test (allowed: read-only) [rule p.yaml:3]",
    ]
    quiet = tmp_path / "b.jsonl"
    quiet.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    assert summary(quiet, "t") == f"sandgate: 1 allowed, 0 denied -> {quiet}"  # nothing refused: one line
