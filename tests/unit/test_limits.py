"""A sandbox's share of the shared daemon (netguard.decision.limits, fdlimit.Budget.admit), the first-bytes test
(netguard.daemon.firstbytes) and the control peer check (netguard.daemon.peercheck): the pure rules, exhaustively."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.audit import LimitRecord, parse
from netguard.daemon import firstbytes, peercheck
from netguard.daemon.fdlimit import PER_CONNECTION, RESERVE, Budget
from netguard.decision import limits

# ---- the fair share -------------------------------------------------------------------------


def test_one_sandbox_alone_gets_its_cap_but_never_more_than_half_the_budget() -> None:
    assert limits.share_cap(100_000, 0, 1) == limits.PER_SANDBOX
    assert limits.share_cap(1000, 0, 1) == 500  # a small budget: the other half stays for the others
    assert limits.share_cap(100, 0, 1) == limits.MIN_SHARE


@given(st.integers(16, 1_000_000), st.integers(1, 500))
def test_under_pressure_each_sandbox_gets_a_fair_part(limit: int, sandboxes: int) -> None:
    cap = limits.share_cap(limit, limit // 2, sandboxes)
    assert cap >= limits.MIN_SHARE  # npm's sockets always fit while the budget lasts
    assert cap <= max(limits.MIN_SHARE, limit // (2 * sandboxes))
    assert cap <= limits.share_cap(limit, 0, sandboxes)  # pressure never raises a share


def budget(connections: int) -> Budget:
    return Budget(RESERVE + connections * PER_CONNECTION)


def test_a_hog_cannot_take_what_another_sandbox_needs() -> None:
    """Issue 22: one sandbox's 19,000 silent connections took the whole budget; the victim's curl failed."""
    b = budget(4000)
    b.sandboxes = 2
    hog, victim = limits.Share(), limits.Share()
    taken = 0
    while b.admit(hog) is None:
        taken += 1
    assert taken == 2000 and hog.live == 2000  # half the budget, then the fair share under pressure
    why = b.admit(hog)
    assert why is not None and why.startswith("per-sandbox connection limit")
    for _ in range(limits.MIN_SHARE):  # npm's 15-50 sockets, and then some
        assert b.admit(victim) is None
    b.release(hog)
    assert hog.live == 1999 and b.live == 1999 + limits.MIN_SHARE


def test_the_whole_budget_still_bounds_every_sandbox_together() -> None:
    b = budget(200)
    b.sandboxes = 1
    shares = [limits.Share() for _ in range(10)]
    got = sum(b.admit(s) is None for s in shares for _ in range(100))
    assert got == 200 and b.refused > 0
    assert b.admit(limits.Share()) == "the daemon's connection budget is full (200 connections)"


# ---- the records of refusals ------------------------------------------------------------------


def test_a_flood_of_refusals_is_one_record_at_once_then_a_count_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "FLUSH", 0.2)
    out: list[LimitRecord] = []

    async def flood() -> None:
        r = limits.Refusals("t1", out.append)
        for _ in range(500):
            r.refuse("connections", "tcp", "per-sandbox connection limit (2048 open)")
        r.refuse("deadline", "connect", "slow")
        assert [(x["limit"], x["count"]) for x in out] == [("connections", 1), ("deadline", 1)]
        await asyncio.sleep(0.3)
        assert [(x["limit"], x["count"]) for x in out][2:] == [("connections", 499)]
        r.refuse("connections", "tcp", "again")
        r.flush()  # the sandbox goes: what is pending is written now
        assert r.total == {"connections": 501, "deadline": 1}

    asyncio.run(flood())
    assert sum(x["count"] for x in out if x["limit"] == "connections") == 501
    for x in out:
        assert parse(dict(x)) == x  # the one reader takes what the writer wrote


def test_a_full_disk_does_not_turn_a_refusal_into_an_error() -> None:
    def full(_: Any) -> None:
        raise OSError(28, "No space left on device")

    async def go() -> None:
        limits.Refusals("t1", full).refuse("head", "http", "big")

    asyncio.run(go())


# ---- has the connection said where it goes? ---------------------------------------------------


def hello(sni: str) -> bytes:
    ctx = ssl.create_default_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def test_a_hello_is_ready_only_when_whole() -> None:
    h = hello("allowed.test")
    assert [firstbytes.state(h[:n]) for n in (0, 1, 2, 5, len(h) - 1)] == ["more"] * 5
    assert firstbytes.state(h) == "ready" and firstbytes.state(h + b"more") == "ready"


@pytest.mark.parametrize(
    ("buf", "want"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "ready"),
        (b"GET / HTTP/1.1\nHost: a\n\n", "ready"),  # mitmproxy reads bare LF heads too
        (b"GET / HTTP/1.1\r\nHost: a\r\n", "more"),
        (b"CONNECT a.test:443 HTTP/1.1\r\n", "more"),
        (b"GE", "more"),
        (b"\x00\x01binary", "ready"),  # judged by its address, by mitmproxy
        (b"SSH-2.0-OpenSSH_9.6\r\n", "ready"),  # no space after the token: not a request line
        (b"\x16\x03\x01\x00", "more"),
        (b"\x16\x99", "more"),
        (b"\x16\x99\x99", "ready"),
    ],
)
def test_what_is_ready(buf: bytes, want: str) -> None:
    assert firstbytes.state(buf) == want


def test_a_head_that_outgrows_the_limit_is_too_large_however_it_is_cut() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"X-A: " + b"a" * limits.HEAD_MAX
    assert firstbytes.state(head[: limits.HEAD_MAX - 1]) == "more"
    assert firstbytes.state(head[: limits.HEAD_MAX]) == "too-large"
    assert firstbytes.state(head + b"\r\n\r\n") == "ready"  # whole: the peek never holds that much anyway


@given(st.binary(max_size=200))
def test_state_never_fails(buf: bytes) -> None:
    assert firstbytes.state(buf, limit=100) in ("more", "ready", "too-large")


# ---- the control peer ----------------------------------------------------------------------------


def test_a_peer_in_our_namespaces_passes_and_its_pid_is_named() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        assert peercheck.check(a, peercheck.own_namespaces()) == os.getpid()
        assert peercheck.refusal(a, peercheck.own_namespaces()) is None


def test_a_peer_that_claims_other_namespaces_is_refused() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours = peercheck.own_namespaces()
    theirs = {ns: (dev, ino + 1) for ns, (dev, ino) in ours.items()}  # as a daemon in another netns sees us
    with a, b, pytest.raises(peercheck.PeerRefused, match="another user namespace"):
        peercheck.check(a, theirs)


# ---- a sandbox's part of the shared resolver and of the disk -----------------------------------


def _binding(out: list[Any]) -> Any:
    from netguard import rules
    from netguard.audit import AuditLog
    from netguard.decision.binding import Binding
    from netguard.policy import parse_network

    log = AuditLog(None)
    log.write = out.append  # type: ignore[method-assign,assignment]
    b = Binding("t1", rules.compile_policy(parse_network({"allow": ["ok.test"]}, "p.yaml")), log)
    b.refusals = limits.Refusals("t1", out.append)
    return b


def test_past_the_denials_a_log_holds_they_are_counted_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A churn of denied connections once wrote ~1 GB an hour into the user's disk."""
    from netguard.audit import decision_record

    monkeypatch.setattr(limits, "DENIALS_LOGGED", 50)
    out: list[Any] = []

    async def churn() -> None:
        b = _binding(out)
        for i in range(80):
            b.write_decision(decision_record("t1", f"i{i}", "tcp", "deny", "x.test", 80, reason="no"))
        b.write_decision(decision_record("t1", "ok", "tcp", "allow", "ok.test", 80, ip="198.18.0.1"))
        assert b.refusals is not None
        b.refusals.flush()

    asyncio.run(churn())
    decisions = [r for r in out if r["event"] == "decision"]
    assert len(decisions) == 51 and decisions[-1]["action"] == "allow"  # allowed ones are always written
    assert sum(r["count"] for r in out if r["event"] == "limit" and r["limit"] == "records") == 30


def test_a_sandbox_past_its_lookups_in_flight_is_refused_without_asking_the_resolver() -> None:
    """One sandbox's 2,100 slow names once filled the daemon's resolver: others' hosts were refused."""
    from netguard.decision.decide import Conn, Decider

    out: list[Any] = []

    class Never:
        async def addresses(self, *_: Any) -> list[Any]:
            raise AssertionError("the resolver was asked")

    async def go() -> str:
        b = _binding(out)
        b.lookups = limits.LOOKUPS
        d = await Decider(Never()).authorize(Conn(b), "connect", "ok.test", 443)  # type: ignore[arg-type]
        assert not d.allowed and b.lookups == limits.LOOKUPS
        return d.verdict.decision.reason

    reason = asyncio.run(go())
    assert reason == f"cannot resolve ok.test: more than {limits.LOOKUPS} lookups of this sandbox in flight"
    assert [(r["limit"], r["kind"]) for r in out if r["event"] == "limit"] == [("lookups", "connect")]
