"""The front door's inspected path (netguard.daemon.tlshttp) attacked from the sandbox: smuggling, fronting,
framing, starvation and leaks. Each test judges by what the origin saw (tests/support/httpsorigin.py `got`)
or by what the daemon holds. The first group fails against the code it was written for: each one is a
finding of the review that wrote this module; the rest pin down attacks the path withstands.
Machinery: test_frontdoor_tls (`Tls`, `Client`, `req`) and test_frontdoor_tls_edges (`fast_only`)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.daemon import fdlimit, frontdoor
from netguard.decision import limits

from ..support.dnsfake import FakeDns
from ..support.httpsorigin import ANSWERS, BODY, HttpsOrigin, frame
from ..support.tlsharness import loopback
from .test_frontdoor_tls import Client, Tls, origin, req
from .test_frontdoor_tls_edges import fast_only

__all__ = ["origin"]  # the fixture, shared with test_frontdoor_tls
OK = ANSWERS["/len"][0] + BODY
KEY = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
Origin = tuple[HttpsOrigin, FakeDns]


class Scripted(HttpsOrigin):
    """An origin that reads until `heads` blank lines came, records the raw bytes, answers `reply` (what no
    good server sends), then closes (`close`) or reads and drops what else comes."""

    def __init__(self, reply: bytes, heads: int = 1, close: bool = False) -> None:
        self.reply, self.heads, self.close_after = reply, heads, close
        super().__init__()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(2)
        with contextlib.suppress(OSError), self.ctx.wrap_socket(raw, server_side=True) as c:
            buf = b""
            while buf.count(b"\r\n\r\n") < self.heads and (data := c.recv(65536)):
                buf += data
            self.got.append(buf)
            c.sendall(self.reply)
            while not self.close_after and c.recv(65536):
                pass


@contextlib.contextmanager
def world(tmp: Path, mp: pytest.MonkeyPatch, up: HttpsOrigin) -> Iterator[Tls]:
    """The front door's world (fast) with its own origin."""
    dns = FakeDns(loopback)
    w = Tls(tmp, mp, True, up, dns)
    try:
        yield w
    finally:
        w.close()
        up.close()
        dns.close()


# ---- findings: each fails against the code reviewed ----------------------------------------------------


def test_pipelined_refused_requests_do_not_hold_the_daemons_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    """Refused requests never yield: `_head` reads `_back`, sock_recv/sock_sendall return at once while both
    sockets are ready, and `_skip` returns True, so one client that pipelines refusals and reads its 403s
    holds the loop every sandbox shares (httpexchange._recv yields per read for exactly this reason)."""
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        loop = w._stop[0][0]
        one = req("/len", "DELETE")
        size, n = len(c.ask(one)), 12_000
        got = [0]

        def drain() -> None:
            while got[0] < size * n and (data := c.s.recv(1 << 20)):
                got[0] += len(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        threading.Thread(target=c.s.sendall, args=(one * n,), daemon=True).start()
        worst, t0 = 0.0, time.monotonic()
        while reader.is_alive() and time.monotonic() - t0 < 15:
            turned, asked = threading.Event(), time.monotonic()
            loop.call_soon_threadsafe(turned.set)
            assert turned.wait(15)
            worst = max(worst, time.monotonic() - asked)
            time.sleep(0.005)
        reader.join(5)
        assert got[0] == size * n  # every refusal answered
        assert worst < 0.5, f"the daemon's loop was held {worst:.2f} s by one client's refused requests"


def _daemon_sockets(w: Tls) -> set[int]:
    """This process's socket fds that belong to the daemon (not the tests' clients nor the origin's side)."""
    out = set()
    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
            with s:
                ours, peer = s.getsockname(), (s.getpeername() if s.family != socket.AF_UNIX else "")
                if s.family == socket.AF_INET and (peer[1] == w.regular or ours[1] == w.p):
                    continue
                out.add(fd)
    return out


def _released(w: Tls, before: set[int]) -> None:
    """The daemon's sockets are back to `before` (within 3 s of the clients leaving)."""
    deadline = time.monotonic() + 3
    while (left := _daemon_sockets(w) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"{len(left)} sockets left open"


def test_a_bridged_h2_tunnel_holds_no_more_descriptors_than_the_budget_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    """fdlimit.Budget counts PER_CONNECTION (2) sockets per admitted connection; a CONNECT to an inspected host
    whose client then offers only h2 is bridged to mitmproxy through a socketpair (tlshttp.tunnel): 3 while
    idle, 4 once mitmproxy dials. So the bridge is admitted as a second connection of the sandbox's share
    (frontdoor._bridge): what the daemon holds never outgrows what the budget counts."""
    budget = fdlimit.Budget(1 << 20)
    init = frontdoor.FrontDoor.__init__

    def budgeted(self: frontdoor.FrontDoor, *a: Any, **k: Any) -> None:
        init(self, *a, **{**k, "budget": budget})

    monkeypatch.setattr(frontdoor.FrontDoor, "__init__", budgeted)
    with fast_only(tmp_path, monkeypatch, origin) as w:
        w.warm()
        held, counted = {}, {}
        for alpn in ("http/1.1", "h2"):
            time.sleep(0.2)
            before, live = _daemon_sockets(w), budget.live
            clients = [w.connect("explicit", alpn=[alpn]) for _ in range(6)]
            assert [c.s.selected_alpn_protocol() for c in clients] == [alpn] * 6
            time.sleep(0.3)
            held[alpn] = len(_daemon_sockets(w) - before) / 6
            counted[alpn] = (budget.live - live) / 6
            for c in clients:
                c.s.close()
            _released(w, before)
        assert held["http/1.1"] == fdlimit.PER_CONNECTION and counted["http/1.1"] == 1  # the measure is right
        assert counted["h2"] == 2 and held["h2"] <= counted["h2"] * fdlimit.PER_CONNECTION, (held, counted)
    assert budget.live == 0  # every unit given back


def test_an_empty_upgrade_field_is_judged_as_an_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    """httprules._upgrade reads `Upgrade:` (empty) as no upgrade, so GET /wsno (no websocket rule) is allowed;
    innerhead marks the request as upgrading (the field is there), so the origin's 101 switches the connection
    and frames flow unjudged. (mitmproxy's path does the same: it switches on any 101.)"""
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        got = c.ask(req("/wsno", extra=b"Upgrade: \r\nConnection: Upgrade\r\n" + KEY))
        if got.startswith(b"HTTP/1.1 101"):
            c.s.sendall(frame(b"ping"))
            got += c.take(11)
        assert not got.startswith(b"HTTP/1.1 101"), got  # no rule allows /wsno to leave HTTP


def test_http_1_0_with_transfer_encoding_is_refused_as_mitmproxy_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    """RFC 9112 6.1: a Transfer-Encoding in an HTTP/1.0 message is faulty framing; an HTTP/1.0 upstream reads no
    body and takes the chunks for the next request (smuggled past the rules). mitmproxy answers 400."""
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        head = b"POST /echo HTTP/1.0\r\nHost: insp.test\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
        got = c.ask(head + b"3\r\nabc\r\n0\r\n\r\n")
        assert got[9:10] in (b"4", b"5") and origin[0].got == [], (got, origin[0].got)


def test_request_trailers_never_reach_the_origin_unjudged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules judge the head's fields only (method overrides, upgrades); a chunked body's trailer fields go
    upstream as sent (chunks.Chunked reads past them). mitmproxy's path never forwards them (it fails)."""
    up = Scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", heads=2)
    with world(tmp_path, monkeypatch, up) as w, w.connect("transparent") as c:
        body = b"3\r\nabc\r\n0\r\nX-HTTP-Method-Override: DELETE\r\n\r\n"
        c.ask(req("/echo", "POST", extra=b"Transfer-Encoding: chunked\r\n") + body)
        assert w.served == ["/echo"] and not any(b"Override" in g for g in up.got), up.got


def test_a_host_naming_another_port_is_fronting_as_an_absolute_target_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    """fronting.by_target refuses `https://insp.test:1/len`; fronting.by_host is given the Host's name only, so
    `Host: insp.test:1` (any port, even 99999) goes upstream as sent, where a server routing by authority
    (Envoy's virtual hosts match `name:port`) picks another site. mitmproxy's transparent path rewrites it."""
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        c.ask(req("/len", host="insp.test:1"))
        assert w.served == ["/len"] and not any(b"insp.test:1\r\n" in g for g in origin[0].got), origin[0].got


def test_request_denials_are_capped_like_every_other_denial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    """limits.DENIALS_LOGGED bounds a run's denial records (Binding.write_decision); a refused request's record
    is written directly, so refusals pipelined on one connection (~10,000 a second here) fill the disk."""
    monkeypatch.setattr(limits, "DENIALS_LOGGED", 5)
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        for _ in range(12):
            assert c.ask(req("/len", "DELETE")).startswith(b"HTTP/1.1 403")
        denied = [r for r in w.settled(6) if r["event"] == "request" and r["action"] == "deny"]
        assert len(denied) <= limits.DENIALS_LOGGED, f"{len(denied)} denial records past a cap of 5"


def test_an_upstream_begun_early_and_closed_since_is_redialled_as_mitmproxy_dials_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inspected.prepare dials at the CONNECT; `_upstream` takes that connection without idle_open(), so a client
    that waits past the origin's idle timeout before its first request gets a 502 (mitmproxy: a 200)."""
    with world(tmp_path, monkeypatch, HttpsOrigin(wait=0.5)) as w, w.connect("explicit") as c:  # idle 0.5 s: dropped
        time.sleep(1.0)
        assert c.ask(req("/len")) == OK


# ---- what holds ----------------------------------------------------------------------------------------

REFUSED = {
    "lower-case method": b"get /len HTTP/1.1\r\nHost: insp.test\r\n\r\n",
    "OPTIONS *": b"OPTIONS * HTTP/1.1\r\nHost: insp.test\r\n\r\n",
    "fragment": req("/len#x"),
    "escaped dots": req("/id/%2e%2e"),
    "escaped slash": req("/id/..%2fsecret"),
    "override header": req("/len", extra=b"X_HTTP_Method_Override: DELETE\r\n"),
    "override query": req("/len?%5fmethod=DELETE"),
    "h2c": req("/len", extra=b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABk\r\n"),
    "two upgrades": req("/ws", extra=b"Upgrade: websocket\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n" + KEY),
    "other port": req("https://insp.test:1/len"),
    "userinfo": req("https://insp.test@other.test/len"),
    "fronting": req("/len", host="other.test"),
    "CONNECT": b"CONNECT other.test:443 HTTP/1.1\r\nHost: insp.test\r\n\r\n",
    "h2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "bare LF": b"GET /len HTTP/1.1\r\nHost: insp.test\r\nX: a\nTransfer-Encoding: chunked\r\n\r\n",
}


@pytest.mark.parametrize("case", REFUSED)
def test_requests_the_rules_or_the_parser_refuse_never_reach_the_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin, case: str
) -> None:
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        got = c.ask(REFUSED[case])
        assert got[9:10] in (b"4", b"5") and b"X-Sandgate: blocked" in got and origin[0].got == [], got


def test_absolute_form_http_inside_tls_goes_upstream_in_origin_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        assert c.ask(b"GET http://INSP.test./len HTTP/1.1\r\nHost: insp.test\r\n\r\n") == OK
        assert origin[0].got == [b"GET /len HTTP/1.1\r\nHost: insp.test\r\n\r\n"]


def test_pipelined_requests_after_a_length_body_are_each_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        c.s.sendall(
            req("/echo", "POST", extra=b"Content-Length: 5\r\n") + b"abcde" + req("/len", "DELETE") + req("/len")
        )
        got = [c.answer("POST"), c.answer(), c.answer()]
        assert got[0].endswith(b"abcde") and got[1].startswith(b"HTTP/1.1 403") and got[2] == OK
        assert [g.split(b"\r\n")[0] for g in origin[0].got] == [b"POST /echo HTTP/1.1", b"GET /len HTTP/1.1"]


def test_a_request_pipelined_after_a_chunked_body_never_reaches_the_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        chunked = req("/echo", "POST", extra=b"Transfer-Encoding: chunked\r\n") + b"3\r\nabc\r\n0\r\n\r\n"
        c.s.sendall(chunked + req("/len", "DELETE"))  # in one piece: the refused request must not ride the body
        c.rest()
        assert not any(b"DELETE" in g for g in origin[0].got) and w.served[0] == "/echo"


@pytest.mark.parametrize("framing", ["length", "chunked", "expect"])
def test_a_refused_body_holding_a_request_is_never_read_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin, framing: str
) -> None:
    """The refused POST's body is an allowed request: drained (or, after Expect, the connection ends) and
    never judged nor forwarded; the next real request is."""
    inner = req("/id/smuggled")
    if framing == "length":
        first = req("/len", "POST", extra=b"Content-Length: %d\r\n" % len(inner)) + inner
    elif framing == "chunked":
        first = req("/len", "POST", extra=b"Transfer-Encoding: chunked\r\n") + b"%x\r\n%s\r\n0\r\n\r\n" % (
            len(inner),
            inner,
        )
    else:
        first = req("/len", "POST", extra=b"Expect: 100-continue\r\nContent-Length: %d\r\n" % len(inner))
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        assert c.ask(first).startswith(b"HTTP/1.1 403")
        with contextlib.suppress(OSError):
            c.s.sendall(inner if framing == "expect" else req("/len"))
        after = c.answer()
        assert after == (b"<EOF>" if framing == "expect" else OK)
        assert w.served == ["/len"] * (1 if framing == "expect" else 2)
        assert not any(b"smuggled" in g for g in origin[0].got)


def test_the_rest_of_a_body_the_origin_answered_early_is_never_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = Scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
    with world(tmp_path, monkeypatch, up) as w, w.connect("transparent") as c:
        c.s.sendall(req("/echo", "POST", extra=b"Content-Length: 100\r\n") + b"x" * 10)
        assert c.answer("POST").endswith(b"abc")
        with contextlib.suppress(OSError):
            c.s.sendall(b"y" * 10 + req("/id/smuggled") + b"z" * 100)
        assert c.rest() == b"<EOF>" and w.served == ["/echo"]  # never judged as a request: the connection ended
        assert len(up.got) == 1 and b"smuggled" not in up.got[0]


ODD = {
    "101 unasked": (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nraw", b"502"),
    "length and chunked": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"502",
    ),
    "closed mid-body": (b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\nabc", b"200"),
    "a second answer": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
        b"200",
    ),
}


@pytest.mark.parametrize("case", ODD)
def test_a_response_no_good_server_sends_ends_the_connection_and_answers_no_later_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    reply, status = ODD[case]
    with world(tmp_path, monkeypatch, Scripted(reply, close=True)) as w, w.connect("transparent") as c:
        got = c.ask(req("/len"))
        with contextlib.suppress(OSError):
            c.s.sendall(req("/len"))
        got += c.rest()
        assert got.startswith(b"HTTP/1.1 " + status) and got.endswith(b"<EOF>")
        assert b"raw" not in got and b"evil" not in got and w.served == ["/len"]


def test_an_http_1_0_request_without_keep_alive_ends_the_connection_before_a_pipelined_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        c.s.sendall(b"GET /len HTTP/1.0\r\nHost: insp.test\r\n\r\n" + req("/id/smuggled"))
        assert c.answer() == OK and c.rest() == b"<EOF>"
        assert w.served == ["/len"] and len(origin[0].got) == 1


def test_the_upstreams_sni_is_the_judged_name_whatever_the_client_offers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin
) -> None:
    seen: list[str | None] = []
    origin[0].trusted.sni_callback = lambda _s, name, _c: seen.append(name)
    with fast_only(tmp_path, monkeypatch, origin) as w:
        w.warm()
        seen.clear()
        ctx = ssl.create_default_context(cadata=w.ca.cert)
        ctx.check_hostname = False
        raw = socket.create_connection(("127.0.0.1", w.regular), timeout=5)
        raw.sendall(b"CONNECT insp.test:%d HTTP/1.1\r\nHost: insp.test\r\n\r\n" % w.p)
        assert raw.recv(100).startswith(b"HTTP/1.1 200")
        with Client(ctx.wrap_socket(raw, server_hostname="other.test")) as c:
            assert c.ask(req("/len")) == OK
        assert seen == ["insp.test"] and w.served == ["/len"]


def test_many_tiny_chunks_arrive_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin) -> None:
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect("transparent") as c:
        body = b"1\r\nx\r\n" * 5000 + b"0\r\n\r\n"
        assert c.ask(req("/echo", "POST", extra=b"Transfer-Encoding: chunked\r\n") + body, "POST").endswith(b"x" * 5000)
        assert origin[0].got[0].endswith(b"\r\n\r\n" + b"x" * 5000)


def test_abandoned_handshakes_and_failed_upstreams_leave_no_socket_nor_unretrieved_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: Origin, caplog: pytest.LogCaptureFixture
) -> None:
    """A CONNECT begins the upstream beside the client's handshake (Inspected.prepare): a client that leaves
    mid-handshake, or an upstream that fails to verify, must leave nothing behind."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    with fast_only(tmp_path, monkeypatch, origin) as w:
        w.warm()
        time.sleep(0.2)
        before = _daemon_sockets(w)
        for i in range(8):
            raw = socket.create_connection(("127.0.0.1", w.regular), timeout=5)
            raw.sendall(b"CONNECT insp.test:%d HTTP/1.1\r\nHost: insp.test\r\n\r\n" % w.p)
            assert raw.recv(100).startswith(b"HTTP/1.1 200")
            bio = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), False, "insp.test")
            with contextlib.suppress(ssl.SSLWantReadError):
                bio.do_handshake()
            raw.sendall(out.read())
            time.sleep(0.03 * (i % 3))
            raw.close()
        w.origin.ctx = w.origin.untrusted
        for _ in range(3):
            with w.connect("explicit"):
                time.sleep(0.05)
        _released(w, before)
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
