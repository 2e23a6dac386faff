"""The front door's inspected path (netguard.daemon.tlshttp) answers as mitmproxy's path does.

Each scenario runs through the real `sandgate proxy` code twice, once with every connection handed to
mitmproxy and once with the front door, on the explicit listener (CONNECT, then TLS) and on the
transparent one (TLS with its SNI at once), against a fake HTTPS origin that keeps connections alive and
writes heads and bodies apart (tests/support/httpsorigin.py). What the client got, what the origin got and
the audit records must agree; `served` lists the requests the inspected path judged itself, so these
tests fail if it never takes any. Where the two paths legitimately say something else (error texts),
each path's own answer is asserted and a comment says why. The edge cases are in test_frontdoor_tls_edges.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard import rules
from netguard.daemon import tlshttp
from netguard.policy import parse_network
from netguard.relay import handoff

from ..support.dnsfake import FakeDns
from ..support.httpsorigin import ANSWERS, BODY, HttpsOrigin, frame, unframe
from ..support.tlsharness import loopback
from .test_frontdoor import World, twice

LISTENERS = ["explicit", "transparent"]
RULES: list[Any] = [
    {"methods": ["GET", "HEAD"], "paths": ["/len", "/chunked", "/close", "/empty", "/same", "/id/*", "/wsno"]},
    {"methods": ["POST"], "paths": ["/echo"]},
    {"methods": ["GET"], "paths": ["/ws"], "websocket": True},
]
WS = b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"


class Tls(World):
    """The front door's World with an HTTPS origin for insp.test (judged by RULES), counting what tlshttp served."""

    def __init__(self, tmp: Path, mp: pytest.MonkeyPatch, fast: bool, up: HttpsOrigin, dns: FakeDns) -> None:
        self.served: list[str] = []
        self.warmed = False
        one = tlshttp.Inspected._one

        async def counted(conn: tlshttp.Inspected, client: Any, req: Any, idle: float) -> bool:
            self.served.append(req.target)
            return await one(conn, client, req, idle)

        mp.setattr(tlshttp.Inspected, "_one", counted)
        super().__init__(tmp, mp, fast, up, dns)  # type: ignore[arg-type]
        self.p, self.origin = up.port, up
        allow: list[dict[str, Any]] = [
            {"host": "insp.test", "ports": [self.p], "http": RULES},
            {"cidr": "127.0.0.1/32", "ports": [self.p]},  # the fake DNS answers loopback: else vetoed (rebinding)
        ]
        pol = parse_network({"allow": allow, "resolver": f"127.0.0.1:{dns.port}"}, "p.yaml")
        self.binding.rules = rules.compile_policy(pol)
        self.binding.upstream_ca = up.ca_pem  # the origin's CA: its certificate verifies

    def warm(self) -> None:
        """One CONNECT and one GET /len, mitmproxy's on either path (2 records, not in `served`): the front door
        takes a CONNECT only to an upstream known to answer HTTP/1.1 (tlshttp.takes), which this one teaches."""
        if not self.warmed:
            self.warmed = True
            with self.connect("explicit") as c:
                assert c.ask(req("/len")).endswith(BODY)
            assert not self.served
            self.origin.got.clear()
            self.origin.conns = 0

    def connect(self, listener: str, alpn: list[str] | None = None) -> Client:
        """A TLS connection to insp.test through `listener`, verified against the run's CA."""
        ctx = ssl.create_default_context(cadata=self.ca.cert)
        if alpn is not None:
            ctx.set_alpn_protocols(alpn)
        if listener == "explicit":
            self.warm()
            raw = socket.create_connection(("127.0.0.1", self.regular), timeout=5)
            raw.sendall(b"CONNECT insp.test:%d HTTP/1.1\r\nHost: insp.test:%d\r\n\r\n" % (self.p, self.p))
            head = b""
            while b"\r\n\r\n" not in head and (data := raw.recv(1)):
                head += data
            assert head == b"HTTP/1.1 200 Connection established\r\n\r\n", head
        else:
            raw = socket.create_connection(("127.0.0.1", self.transparent), timeout=5)
        return Client(ctx.wrap_socket(raw, server_hostname="insp.test"))


def req(path: str, method: str = "GET", host: str = "insp.test", extra: bytes = b"") -> bytes:
    line = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: t\r\n".encode()
    return line + extra + b"\r\n"


def records(listener: str, conns: int, requests: int) -> int:
    """How many audit records a scenario leaves: a decision per connection (the transparent one's at its first
    request), one record per request, and on the explicit listener the warm-up's two."""
    return conns + requests + (2 if listener == "explicit" else 0)


class Client:
    """One TLS client connection reading whole responses by their framing (no waiting for quiet)."""

    def __init__(self, s: ssl.SSLSocket) -> None:
        self.s, self.buf, self.eof = s, b"", False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.s.close()

    def _more(self) -> bool:
        if not self.eof:
            try:
                data = self.s.recv(65536)  # a timeout (5 s) fails the test: the proxy hung
            except (ssl.SSLEOFError, ConnectionResetError):
                data = b""
            self.buf += data
            self.eof = not data
        return not self.eof

    def take(self, n: int) -> bytes:
        while len(self.buf) < n and self._more():
            pass
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf and self._more():
            pass
        return self.take(self.buf.index(b"\r\n") + 2) if b"\r\n" in self.buf else b""

    def head(self) -> bytes:
        """The next response head (what came, then b"<EOF>", when the connection ended first)."""
        while b"\r\n\r\n" not in self.buf:
            if not self._more():
                return self.take(len(self.buf)) + b"<EOF>"
        return self.take(self.buf.index(b"\r\n\r\n") + 4)

    def ask(self, request: bytes, method: str = "GET") -> bytes:
        self.s.sendall(request)
        return self.answer(method)

    def answer(self, method: str = "GET") -> bytes:
        """The next whole response as it came, interim heads first (`<EOF>` when the close delimits it)."""
        out = head = self.head()
        while head[9:10] == b"1" and head[9:12] != b"101":
            out += (head := self.head())
        low = head.lower()
        if head.endswith(b"<EOF>") or method == "HEAD" or head[9:12] in (b"101", b"204", b"304"):
            return out
        if b"\r\ntransfer-encoding: chunked" in low:
            while (line := self._line()) and (size := int(line.split(b";")[0], 16)):
                out += line + self.take(size + 2)
            return out + line + self._line() if line else out + b"<EOF>"
        if b"\r\ncontent-length:" in low:
            return out + self.take(int(low.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0]))
        return out + self.rest()

    def rest(self) -> bytes:
        """Everything until the close, then `<EOF>`."""
        while self._more():
            pass
        return self.take(len(self.buf)) + b"<EOF>"


@pytest.fixture
def origin() -> Iterator[tuple[HttpsOrigin, FakeDns]]:
    up, dns = HttpsOrigin(), FakeDns(loopback)
    try:
        yield up, dns
    finally:
        up.close()
        dns.close()


Scenario = Callable[[Tls], tuple[Any, int]]  # what the client got, and how many audit records to wait for
Run = tuple[Tls, Any, list[dict[str, Any]], list[bytes]]  # a world, what its client got, its records, its origin's


def both(mp: pytest.MonkeyPatch, tmp: Path, origin: tuple[HttpsOrigin, FakeDns], scenario: Scenario) -> tuple[Run, Run]:
    """`scenario` through mitmproxy alone, then through the front door: what each run saw."""
    up, dns = origin

    def make(m: pytest.MonkeyPatch, fast: bool) -> Tls:
        up.got, up.conns, up.ctx = [], 0, up.trusted
        return Tls(tmp, m, fast, up, dns)

    def seen() -> list[bytes]:
        # On the transparent listener mitmproxy rewrites the Host field to the name it judged, with the port
        # (`Host: insp.test:PORT`); the front door sends the head as the client sent it: the same name.
        return [r.replace(b"\r\nHost: insp.test:%d\r\n" % up.port, b"\r\nHost: insp.test\r\n") for r in up.got]

    mitm, fast = twice(mp, make, seen, scenario)
    assert not mitm[0].served and not handoff._LIVE
    return mitm, fast


def same(mp: pytest.MonkeyPatch, tmp: Path, origin: tuple[HttpsOrigin, FakeDns], scenario: Scenario) -> tuple[Tls, Any]:
    """`scenario` twice: the client's bytes, the records and the origin's requests must agree."""
    (_, got_m, rec_m, up_m), (fast, got_f, rec_f, up_f) = both(mp, tmp, origin, scenario)
    assert got_f == got_m
    assert rec_f == rec_m
    assert up_f == up_m
    return fast, got_f


@pytest.mark.parametrize("listener", LISTENERS)
def test_allowed_requests_on_one_kept_alive_connection_are_forwarded_as_mitmproxy_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    paths = ["/len", "/chunked", "/empty", "/same", "/len", "/close"]

    def scenario(w: Tls) -> tuple[Any, int]:
        with w.connect(listener) as c:
            got = [c.ask(req(p, "HEAD" if i == 4 else "GET"), "HEAD" if i == 4 else "GET") for i, p in enumerate(paths)]
        return got, records(listener, 1, 6)

    fast, got = same(monkeypatch, tmp_path, origin, scenario)
    assert fast.served == paths and fast.origin.conns == 1  # one upstream connection, kept alive
    head, pieces, _ = ANSWERS["/chunked"]
    assert got[:2] == [ANSWERS["/len"][0] + BODY, head + b"".join(pieces)]  # byte for byte, chunks as sent
    assert got[2:5] == [ANSWERS["/empty"][0], ANSWERS["/same"][0], ANSWERS["/len"][0]]  # no body, none waited for
    assert got[5] == ANSWERS["/close"][0] + b"until the end<EOF>"  # delimited by the close: the client's ends too
    rec = [r for r in fast.records() if r["event"] == "request"][-6:]
    assert [(r["method"], r["path"], r["status"], r["bytes_down"]) for r in rec] == [
        ("GET", "/len", 200, 13), ("GET", "/chunked", 200, 13), ("GET", "/empty", 204, 0),
        ("GET", "/same", 304, 0), ("HEAD", "/len", 200, 0), ("GET", "/close", 200, 13),
    ]  # fmt: skip
    assert fast.origin.got[0] == req("/len")  # the head goes upstream as the client sent it


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_request_the_rules_refuse_gets_the_gates_403_and_the_connection_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    def scenario(w: Tls) -> tuple[Any, int]:
        with w.connect(listener) as c:
            refused = [
                req("/len", "DELETE"),
                req("/secret"),
                req("/len", "POST", extra=b"Content-Length: 5\r\n") + b"abcde",
            ]
            got = [c.ask(r) for r in refused]
            got.append(c.ask(req("/len")))  # the same connection still carries an allowed request
        return got, records(listener, 1, 4)

    fast, got = same(monkeypatch, tmp_path, origin, scenario)
    assert fast.served == ["/len", "/secret", "/len", "/len"]
    assert all(g.startswith(b"HTTP/1.1 403 Forbidden\r\n") and b"X-Sandgate: blocked" in g for g in got[:3])
    assert b"request refused: DELETE /len on insp.test: DELETE /len not allowed" in got[0]
    assert b"GET /secret not allowed" in got[1] and got[3] == ANSWERS["/len"][0] + BODY
    assert fast.origin.got == [req("/len")]  # no refused request, nor the refused body, reached the origin
    rec = [r for r in fast.records() if r["event"] == "request"][-4:]
    assert [(r["action"], r["method"], r["path"], r["status"]) for r in rec] == [
        ("deny", "DELETE", "/len", 403), ("deny", "GET", "/secret", 403), ("deny", "POST", "/len", 403),
        ("allow", "GET", "/len", 200),
    ]  # fmt: skip


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_request_naming_another_origin_inside_the_tunnel_is_refused_as_fronting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    """A shared server (a CDN) serves by the Host or an absolute-form target: other.test must never be asked for."""

    def scenario(w: Tls) -> tuple[Any, int]:
        with w.connect(listener) as c:
            got = [c.ask(req("/len", host="other.test")), c.ask(req(f"https://other.test:{w.p}/len"))]
            got.append(c.ask(req("/len")))
        return got, records(listener, 1, 3)

    (_, got_m, rec_m, up_m), (fast, got_f, rec_f, up_f) = both(monkeypatch, tmp_path, origin, scenario)
    assert fast.served == ["/len", "/len", "/len"]
    assert got_f[0].startswith(b"HTTP/1.1 403") and b"Host header names other.test, not insp.test" in got_f[0]
    assert got_f[1].startswith(b"HTTP/1.1 403") and b"request target names other.test:" in got_f[1]
    assert got_f[2] == got_m[2] == ANSWERS["/len"][0] + BODY
    assert up_f == [req("/len")] and not any(b"other.test" in r for r in up_m)
    if listener == "explicit":  # the CONNECT named the origin: both paths judge the request against it alike
        assert (got_f, rec_f, up_f) == (got_m, rec_m, up_m)
        return
    # Transparent: mitmproxy judges the Host as the destination (blocked other.test: a decision record), and
    # rewrites an absolute-form target to the name it judged (insp.test) before forwarding it; the front door
    # refuses both as fronting (request records). Neither lets other.test be asked for.
    assert got_m[0].startswith(b"HTTP/1.1 403") and b"blocked other.test" in got_m[0]
    assert rec_m[0]["host"] == "other.test" and rec_m[0]["action"] == "deny"
    assert up_m[0].startswith(b"GET https://insp.test:%d/len HTTP/1.1\r\n" % fast.p)
    refused, allowed = ("request", "deny"), ("request", "allow")
    assert [(r["event"], r["action"]) for r in rec_f] == [("decision", "allow"), refused, refused, allowed]


@pytest.mark.parametrize("listener", LISTENERS)
def test_request_bodies_and_expect_100_continue_are_forwarded_as_mitmproxy_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    def scenario(w: Tls) -> tuple[Any, int]:
        with w.connect(listener) as c:
            got = [c.ask(req("/echo", "POST", extra=b"Content-Length: 5\r\n") + b"abcde")]
            chunked = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            got.append(c.ask(req("/echo", "POST", extra=b"Transfer-Encoding: chunked\r\n") + chunked))
            c.s.sendall(req("/echo", "POST", extra=b"Expect: 100-continue\r\nContent-Length: 4\r\n"))
            interim = c.head()  # the body goes only after the 100, as a client that asked waits for it
            c.s.sendall(b"wxyz")
            got.append(interim + c.answer("POST"))
        return got, records(listener, 1, 3)

    (_, got_m, rec_m, up_m), (fast, got, rec_f, up_f) = both(monkeypatch, tmp_path, origin, scenario)
    assert got == got_m and rec_f == rec_m and fast.served == ["/echo"] * 3
    # mitmproxy answers the 100 itself and drops the Expect field; the front door forwards the head as sent
    # and the origin's own 100: the client sees the same, the origin the same body
    expect = b"Expect: 100-continue\r\n"
    assert up_f[:2] == up_m[:2] and up_f[2] == up_m[2].replace(b"Content-Length: 4", expect + b"Content-Length: 4")
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
    assert got == [ok % 5 + b"abcde", ok % 5 + b"abcde", b"HTTP/1.1 100 Continue\r\n\r\n" + ok % 4 + b"wxyz"]
    assert [g.rsplit(b"\r\n\r\n", 1)[1] for g in fast.origin.got] == [b"abcde", b"abcde", b"wxyz"]
    assert [r["bytes_up"] for r in fast.records() if r["event"] == "request"][-3:] == [5, 5, 4]


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_websocket_upgrade_needs_its_rule_and_then_carries_frames_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    def scenario(w: Tls) -> tuple[Any, int]:
        with w.connect(listener) as c:
            refused = c.ask(req("/wsno", extra=WS))  # GET /wsno is allowed, its upgrade is not
        with w.connect(listener) as c:
            switched = c.ask(req("/ws", extra=WS))
            c.s.sendall(frame(b"ping"))
            echo = c.take(11)
            c.s.sendall(frame(b"", opcode=8))  # close: the origin answers it and ends
            return [refused, switched, unframe(echo + c.rest())], records(listener, 2, 2)

    (_, got_m, rec_m, up_m), (fast, got_f, rec_f, up_f) = both(monkeypatch, tmp_path, origin, scenario)
    assert got_f == got_m and up_f == up_m and fast.served == ["/wsno", "/ws"]
    refused, switched, frames = got_f
    assert refused.startswith(b"HTTP/1.1 403") and b"a WebSocket upgrade of GET /wsno not allowed" in refused
    assert switched.startswith(b"HTTP/1.1 101 Switching Protocols\r\n") and frames == [b"echo:ping", b""]
    assert [g.split(b" ")[1] for g in up_f] == [b"/ws"]  # the refused upgrade never reached the origin
    # mitmproxy writes the 101's record when the 101 is through (0 bytes); the front door when the switched
    # connection ends, with what it carried (masked frames up: 10 + 6 bytes; down: 11 + 2): else they agree.
    assert [(r["bytes_up"], r["bytes_down"]) for r in (rec_m[-1], rec_f[-1])] == [(0, 0), (16, 13)]
    assert [{**r, "bytes_up": 0, "bytes_down": 0} for r in rec_f] == [
        {**r, "bytes_up": 0, "bytes_down": 0} for r in rec_m
    ]
