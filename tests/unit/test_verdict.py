"""netguard.verdict: the one pipeline (decide -> learn -> ask -> resolve + veto) for TCP, HTTP and DNS.

The pure steps are tested on their own; `run` is tested with fake ask and resolve steps that
record whether they were called, so each test shows which step decided.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import get_args

import pytest

from netguard import rules, verdict
from netguard.approval import Answer
from netguard.policy import parse_network
from netguard.rules import Decision
from netguard.verdict import Verdict

RS = rules.compile_policy(
    parse_network(
        {
            "allow": ["allowed.test", {"host": "web.test", "ports": [443]}, {"cidr": "203.0.113.0/24"}],
            "deny": ["evil.allowed.test", {"cidr": "198.51.100.66/32"}],
            "ask": ["ask.test"],
        },
        "p.yaml",
    )
)
A = ipaddress.ip_address
ALLOW = Decision("allow", "p.yaml", "allowed by rule allowed.test:80,443")


class Steps:
    """Fake ask and resolve steps that remember what they were handed."""

    def __init__(self, answer: Decision | None = None, ip: str | None = "192.0.2.1") -> None:
        self.answer, self.ip = answer, ip
        self.asked: list[Decision] = []
        self.resolved: list[Verdict] = []

    async def ask(self, d: Decision) -> Decision:
        self.asked.append(d)
        assert self.answer is not None
        return self.answer

    async def resolve(self, v: Verdict) -> Verdict:
        self.resolved.append(v)
        return Verdict(v.decision, v.by, v.would, self.ip)


def run(host: str, port: int | None, steps: Steps | None = None, *, asker: bool = True, **mode: bool) -> Verdict:
    s = steps or Steps()
    return asyncio.run(verdict.run(RS, host, port, ask=s.ask if asker else None, resolve=s.resolve, **mode))


# ---- judge: the policy, learn mode and --ask -------------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "action", "rule"),
    [
        ("allowed.test", 443, "allow", "p.yaml"),
        ("ALLOWED.test.", 80, "allow", "p.yaml"),  # judged on the canonical name
        ("evil.allowed.test", 443, "deny", "p.yaml"),
        ("web.test", 443, "allow", "p.yaml"),
        ("web.test", 80, "deny", None),  # allowed on other ports only
        ("other.test", 443, "deny", None),
        ("203.0.113.9", 443, "allow", "p.yaml"),
        ("203.0.113.9", 22, "deny", None),  # cidr rules have ports too
        ("198.51.100.66", 22, "deny", "p.yaml"),
        ("ask.test", 443, "ask", "p.yaml"),
        ("a..b", 443, "deny", None),  # invalid destination
        ("allowed.test", None, "allow", "p.yaml"),  # DNS: is the name usable at all
    ],
)
def test_judge_is_the_policy_when_no_mode_is_set(host: str, port: int | None, action: str, rule: str | None) -> None:
    v = verdict.judge(RS, host, port)
    assert (v.decision.action, v.decision.rule, v.by, v.would, v.ip) == (action, rule, "policy", None, None)
    assert v.decision == rules.decide(RS, host, port)


def test_learn_lets_only_the_default_deny_of_a_name_pass() -> None:
    v = verdict.judge(RS, "other.test", 443, learn=True)
    assert v == Verdict(Decision("allow", None, "learn mode: no allow rule matches"), "learn", "deny")
    for host, port in (("evil.allowed.test", 443), ("198.51.100.66", 22), ("192.0.2.7", 443), ("a..b", 443)):
        # an explicit deny rule holds; addresses stay governed by cidr rules; garbage is never learned
        assert not verdict.judge(RS, host, port, learn=True).allowed, host
    assert verdict.judge(RS, "ask.test", 443, learn=True).decision.action == "ask"  # an ask rule still asks


def test_ask_all_turns_only_the_default_deny_of_a_name_into_a_question() -> None:
    v = verdict.judge(RS, "other.test", 443, ask_all=True)
    assert v == Verdict(Decision("ask", None, "no allow rule matches (--ask)"))
    assert verdict.judge(RS, "evil.allowed.test", 443, ask_all=True).decision.action == "deny"
    assert verdict.judge(RS, "192.0.2.7", 443, ask_all=True).decision.action == "deny"
    assert verdict.judge(RS, "allowed.test", 443, ask_all=True).decision.action == "allow"


def test_learn_wins_over_ask_all() -> None:
    assert verdict.judge(RS, "other.test", 443, learn=True, ask_all=True).by == "learn"


@pytest.mark.parametrize(
    ("host", "expected"),
    [("pypi.org", True), ("PyPI.org.", True), ("10.0.0.1", False), ("[::1]", False), ("0x7f.1", False), ("", False)],
)
def test_is_name(host: str, expected: bool) -> None:
    assert verdict.is_name(host) is expected


# ---- the ask step's pure parts -----------------------------------------------------------------


ASK = Decision("ask", "p.yaml", "needs approval by rule ask.test")


@pytest.mark.parametrize("answer", get_args(Answer))
def test_every_answer_of_a_human_maps_to_one_decision(answer: Answer) -> None:
    d = verdict.answered(ASK, answer)
    assert d.rule == "p.yaml"
    if answer in ("once", "run", "always"):
        assert d == Decision("allow", "p.yaml", f"approved by a human ({answer})")
    elif answer == "timeout":
        assert d == Decision("deny", "p.yaml", "needs approval by rule ask.test: no answer in time")
    else:
        assert d == Decision("deny", "p.yaml", "needs approval by rule ask.test: denied by a human")


def test_unasked_and_deferred() -> None:
    assert verdict.unasked(ASK) == Decision(
        "deny", "p.yaml", "needs approval by rule ask.test (no approval channel; denied)"
    )
    d = verdict.deferred(ASK)
    assert d.allowed and d.rule == "p.yaml" and d.reason.startswith("needs approval by rule ask.test: needs approval;")
    assert "not looked up upstream" in d.reason


# ---- run: the steps in order ----------------------------------------------------------------------


def test_an_allowed_destination_is_resolved_and_never_asked() -> None:
    s = Steps(ip="192.0.2.1")
    v = run("allowed.test", 443, s)
    assert v == Verdict(ALLOW, "policy", None, "192.0.2.1")
    assert s.asked == [] and s.resolved == [Verdict(ALLOW)]


def test_a_denied_destination_is_neither_asked_nor_resolved() -> None:
    s = Steps()
    v = run("other.test", 443, s)
    assert not v.allowed and v.decision.reason == "no allow rule matches"
    assert s.asked == [] and s.resolved == []


def test_an_ask_goes_to_the_ask_step_and_an_approval_is_resolved() -> None:
    s = Steps(answer=Decision("allow", "p.yaml", "approved by a human (once)"))
    v = run("ask.test", 443, s)
    assert v.by == "approval" and v.allowed and v.ip == "192.0.2.1"
    assert s.asked == [Decision("ask", "p.yaml", "needs approval by rule ask.test:80,443")] and len(s.resolved) == 1


def test_a_refused_ask_is_not_resolved() -> None:
    s = Steps(answer=Decision("deny", "p.yaml", "denied by a human"))
    v = run("ask.test", 443, s)
    assert v.by == "approval" and not v.allowed and s.resolved == []


def test_an_ask_without_an_approval_channel_fails_closed() -> None:
    s = Steps()
    v = run("ask.test", 443, s, asker=False)
    assert v.decision == Decision(
        "deny", "p.yaml", "needs approval by rule ask.test:80,443 (no approval channel; denied)"
    )
    assert s.resolved == []
    v = run("other.test", 443, s, asker=False, ask_all=True)
    assert v.decision.reason == "no allow rule matches (--ask) (no approval channel; denied)"


def test_learn_mode_is_resolved_and_keeps_its_would() -> None:
    s = Steps()
    v = run("other.test", 443, s, learn=True)
    assert (v.by, v.would, v.ip) == ("learn", "deny", "192.0.2.1") and len(s.resolved) == 1


def test_the_resolve_step_may_turn_an_allow_into_a_deny() -> None:
    async def refuse(v: Verdict) -> Verdict:
        return verdict.unresolved(v, "allowed.test", "NXDOMAIN")

    v = asyncio.run(verdict.run(RS, "allowed.test", 443, resolve=refuse))
    assert v.decision == Decision("deny", "p.yaml", "cannot resolve allowed.test: NXDOMAIN") and v.ip is None


def test_without_a_resolve_step_the_decision_stands() -> None:
    v = asyncio.run(verdict.run(RS, "allowed.test", None))
    assert v == Verdict(ALLOW)


# ---- veto: special addresses and this host's own ---------------------------------------------------


def test_veto_pins_the_first_address_that_passes() -> None:
    v = verdict.veto(RS, Verdict(ALLOW), "allowed.test", [A("10.0.0.1"), A("192.0.2.10"), A("192.0.2.11")], 443, None)
    assert v == Verdict(ALLOW, ip="192.0.2.10")


def test_veto_refuses_with_the_first_veto_when_no_address_passes() -> None:
    learned = Verdict(Decision("allow", None, "learn mode: no allow rule matches"), "learn", "deny")
    v = verdict.veto(RS, learned, "x.test", [A("127.0.0.1"), A("169.254.169.254")], 443, None)
    assert not v.allowed and v.ip is None and v.would is None
    assert v.decision.reason.startswith("resolved to loopback address 127.0.0.1")


def test_veto_applies_deny_cidrs_and_the_hosts_own_addresses() -> None:
    v = verdict.veto(RS, Verdict(ALLOW), "allowed.test", [A("198.51.100.66")], 443, None)
    assert v.decision.rule == "p.yaml" and "denied by rule" in v.decision.reason
    own = rules.own_table([ipaddress.ip_network("192.0.2.10/32")])
    v = verdict.veto(RS, Verdict(ALLOW), "allowed.test", [A("192.0.2.10")], 443, own)
    assert not v.allowed and "this host's own address 192.0.2.10" in v.decision.reason


def test_veto_reopened_by_a_cidr_allow_and_mapped_addresses_unwrapped() -> None:
    v = verdict.veto(RS, Verdict(ALLOW), "allowed.test", [A("::ffff:203.0.113.5")], 443, None)
    assert v.allowed and v.ip == str(A("::ffff:203.0.113.5"))  # pinned as resolved; connect() unwraps it
    v = verdict.veto(RS, Verdict(ALLOW), "allowed.test", [A("::ffff:127.0.0.1")], 443, None)
    assert not v.allowed


def test_veto_of_no_address() -> None:
    v = verdict.veto(RS, Verdict(ALLOW), "allowed.test", [], 443, None)
    assert v.decision == Decision("deny", "p.yaml", "cannot resolve allowed.test: no address")


# ---- what a refused client is told -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "d", "text"),
    [
        (
            "pypi.org",
            443,
            Decision("deny", None, "no allow rule matches"),
            "sandgate: blocked pypi.org:443: no allow rule matches",
        ),
        (
            "pypi.org",
            None,
            Decision("deny", None, "no allow rule matches"),
            "sandgate: blocked pypi.org: no allow rule matches",
        ),
        (
            "a.test",
            80,
            Decision("deny", "p.yaml:3", "denied by rule a.test"),
            "sandgate: blocked a.test:80: denied by rule a.test [p.yaml:3]",
        ),
        (None, None, Decision("deny", None, "malformed"), "sandgate: blocked ?: malformed"),
    ],
)
def test_refusal_text(host: str | None, port: int | None, d: Decision, text: str) -> None:
    assert verdict.refusal_text(host, port, d) == text
