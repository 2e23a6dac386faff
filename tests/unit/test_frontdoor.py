"""The front door decides as mitmproxy does: every case through the real `sandgate proxy` code twice.

Each scenario runs once with the front door (netguard.daemon.frontdoor.FAST) and once with every
connection handed to mitmproxy, and the two must agree on what the client got, what the fake upstream
saw and the audit records (ids and times aside). `took` says which flows the front door relayed
itself: without it these tests could pass with the front door never taking anything.

The transparent listener's original destination (SO_ORIGINAL_DST, which needs an nft redirect) is
faked for both paths alike by patching mitmproxy.platform.original_addr; the e2e tests run it for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import platform

from netguard import rules
from netguard.audit import AuditLog, read_records
from netguard.daemon import doorflow, frontdoor, standalone
from netguard.decision import decide, limits
from netguard.decision.binding import Binding
from netguard.policy import parse_network
from netguard.relay import handoff

from ..support.dnsfake import FakeDns
from ..support.tcpfake import serve_in_threads
from ..support.tlsharness import loopback, run_ca

BLOCKED_DST = "198.18.0.7"  # the transparent client's original destination: allowed by nothing


class Upstream:
    """A raw TCP server on 127.0.0.1: records what each connection sent, answers b"pong", then closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got: list[bytes] = []
        serve_in_threads(self.sock, self._serve)

    def _serve(self, c: socket.socket) -> None:
        c.settimeout(5)
        buf = b""
        with c:
            try:
                while b"END" not in buf and (data := c.recv(65536)):
                    buf += data
                c.sendall(b"pong")
                c.shutdown(socket.SHUT_WR)
                while c.recv(65536):
                    pass
            except OSError:
                pass
        self.got.append(buf)


@pytest.fixture(autouse=True)
def no_flow_left() -> Iterator[None]:
    """A spliced flow outliving its proxy would be cut by nobody (and fail later tests that count them)."""
    yield
    left = dict(handoff._LIVE)
    handoff._LIVE.clear()
    assert not left


def hello(sni: str | None) -> bytes:
    """A real ClientHello (Python's ssl), as a client would send it first."""
    ctx = ssl.create_default_context()
    if sni is None:
        ctx.check_hostname = False
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


class World:
    """`sandgate proxy` (standalone.serve) with an explicit and a transparent listener, a fake DNS, an upstream."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, fast: bool, up: Upstream, dns: FakeDns) -> None:
        self.up, self.dns = up, dns
        up.got = []
        p = self.up.port
        pol = parse_network(
            {
                "allow": [
                    {"host": "allowed.test", "ports": [p]},
                    {"host": "insp.test", "ports": [p], "inspect": True},
                    {"cidr": "127.0.0.1/32", "ports": [p]},
                ],
                "resolver": f"127.0.0.1:{self.dns.port}",
            },
            "p.yaml",
        )
        self.ca = run_ca()
        self.log = tmp / ("fast.jsonl" if fast else "mitm.jsonl")
        self.binding = Binding("t1", rules.compile_policy(pol), AuditLog(self.log), ca=self.ca)
        self.dst: tuple[str, int] = (BLOCKED_DST, p)
        monkeypatch.setattr(platform, "original_addr", lambda _s: self.dst)
        monkeypatch.setattr(frontdoor, "FAST", fast)
        self.took: list[str] = []
        self.nodelay: list[int] = []  # TCP_NODELAY of the client's and the upstream's socket, last flow taken
        start = doorflow.Flow.start

        def counted(flow: doorflow.Flow, *a: Any) -> None:
            self.took.append(flow.kind)
            self.nodelay = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in a[:2]]
            start(flow, *a)

        monkeypatch.setattr(doorflow.Flow, "start", counted)
        self._stop: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        for _ in range(5):  # a free port can be taken by another test before the proxy binds it
            self.regular, self.transparent = _free_port(), _free_port()
            ready, failed = threading.Event(), list[BaseException]()
            self._thread = threading.Thread(target=asyncio.run, args=(self._run(ready, failed),), daemon=True)
            self._thread.start()
            assert ready.wait(10), "proxy did not start"
            if not failed:
                return
            assert isinstance(failed[0], standalone.ProxyError), failed
        raise AssertionError(f"proxy did not start: {failed}")

    async def _run(self, ready: threading.Event, failed: list[BaseException]) -> None:
        stop = asyncio.Event()
        self._stop.append((asyncio.get_running_loop(), stop))
        where = standalone.Listeners(regular=("127.0.0.1", self.regular), transparent=("127.0.0.1", self.transparent))
        try:
            await standalone.serve([(where, self.binding)], ready.set, stop)
        except BaseException as e:
            failed.append(e)
            self._stop.pop()
            ready.set()

    def close(self) -> None:
        loop, stop = self._stop[0]
        loop.call_soon_threadsafe(stop.set)
        self._thread.join(10)

    def records(self) -> list[dict[str, Any]]:
        """The audit records without what differs between any two runs (ids, times, durations)."""
        return [{k: v for k, v in r.items() if k not in ("id", "ts", "duration_ms")} for r in read_records(self.log)]

    def settled(self, n: int) -> list[dict[str, Any]]:
        assert eventually(lambda: len(read_records(self.log)) >= n), self.records()
        time.sleep(0.1)  # no record more than expected
        return self.records()


@contextlib.contextmanager
def upstream() -> Iterator[tuple[Upstream, FakeDns]]:
    up, dns = Upstream(), FakeDns(loopback)  # every name: 127.0.0.1 (opened by the cidr rule, as a real address)
    try:
        yield up, dns
    finally:
        up.sock.close()
        dns.close()


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


def eventually(check: Callable[[], bool], timeout: float = 5) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return True
        time.sleep(0.02)
    return check()


def read_all(s: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while data := s.recv(65536):
            out += data
    return out


def transparent(w: World, *chunks: bytes, gap: float = 0.0) -> bytes:
    s = socket.create_connection(("127.0.0.1", w.transparent), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with s:
        for c in chunks:
            s.sendall(c)
            time.sleep(gap)
        return read_all(s)


def explicit(w: World, head: bytes, *after: bytes) -> bytes:
    s = socket.create_connection(("127.0.0.1", w.regular), timeout=5)
    with s:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got and (data := s.recv(65536)):
            got += data
        if got.startswith(b"HTTP/1.1 200") or got.startswith(b"HTTP/1.0 200"):
            for c in after:
                s.sendall(c)
        return got + read_all(s)


def issuer(s: ssl.SSLSocket) -> str:
    """The common name of the issuer of the certificate the proxy presented (verified by `s`'s context)."""
    cert: Any = s.getpeercert()
    return str(dict(x[0] for x in cert["issuer"])["commonName"])


Scenario = Callable[[World], tuple[Any, int]]  # what the client got, and how many audit records to wait for


#: One run of a scenario: its world, what its client got, its records, what the upstream saw.
type Seen[W: World] = tuple[W, Any, list[dict[str, Any]], list[bytes]]


def twice[W: World](
    mp: pytest.MonkeyPatch,
    make: Callable[[pytest.MonkeyPatch, bool], W],
    upstream_saw: Callable[[], list[bytes]],
    scenario: Callable[[W], tuple[Any, int]],
) -> tuple[Seen[W], Seen[W]]:
    """`scenario` through mitmproxy alone (fast=False), then through the front door: what each run saw."""
    out: list[Seen[W]] = []
    for fast in (False, True):
        with mp.context() as m:
            w = make(m, fast)
            try:
                got, n = scenario(w)
                out.append((w, got, w.settled(n), upstream_saw()))
            finally:
                w.close()
    return out[0], out[1]


def both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: Scenario) -> tuple[World, Any]:
    """Run `scenario` through mitmproxy alone, then through the front door; they must agree."""
    with upstream() as (up, dns):
        (mitm, got_m, rec_m, up_m), (fast_w, got_f, rec_f, up_f) = twice(
            monkeypatch, lambda m, fast: World(tmp_path, m, fast, up, dns), lambda: sorted(up.got), scenario
        )
    assert got_f == got_m
    assert rec_f == rec_m
    assert up_f == up_m
    assert not mitm.took
    assert not handoff._LIVE
    return fast_w, got_f


def test_transparent_tls_allowed_by_its_sni_is_relayed_by_the_front_door(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = hello("allowed.test")
    fast, got = both(tmp_path, monkeypatch, lambda w: (transparent(w, h + b"END"), 2))
    assert got == b"pong" and fast.up.got == [h + b"END"]
    assert fast.took == ["tls"]
    dec, close = fast.records()
    assert (dec["action"], dec["kind"], dec["host"], dec["ip"]) == ("allow", "tls", "allowed.test", "127.0.0.1")
    assert (close["event"], close["bytes_up"], close["bytes_down"]) == ("close", len(h) + 3, 4)


def test_a_hello_split_over_many_segments_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = hello("allowed.test") + b"END"
    parts = [h[i : i + 10] for i in range(0, len(h), 10)]
    fast, got = both(tmp_path, monkeypatch, lambda w: (transparent(w, *parts, gap=0.002), 2))
    assert got == b"pong" and fast.took == ["tls"]


def test_transparent_tls_to_a_denied_name_is_refused_and_never_reaches_the_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = hello("denied.test")
    fast, got = both(tmp_path, monkeypatch, lambda w: (transparent(w, h + b"END"), 1))
    assert got == b"" and fast.up.got == [] and fast.took == []
    (dec,) = fast.records()
    assert (dec["action"], dec["kind"], dec["host"]) == ("deny", "tls", "denied.test")


def test_an_inspected_sni_goes_to_mitmproxy_and_gets_the_run_cas_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def scenario(w: World) -> tuple[Any, int]:
        ctx = ssl.create_default_context(cadata=w.ca.cert)
        raw = socket.create_connection(("127.0.0.1", w.transparent), timeout=5)
        with ctx.wrap_socket(raw, server_hostname="insp.test") as s:  # verified against the run's CA
            return issuer(s), 0

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == "sandgate run CA (test)" and fast.took == []


def test_non_tls_bytes_on_the_transparent_port_are_mitmproxys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _ = both(tmp_path, monkeypatch, lambda w: (transparent(w, b"\x00\x01garbage END"), 1))
    assert fast.took == [] and fast.up.got == []
    (dec,) = fast.records()
    assert (dec["action"], dec["kind"], dec["host"]) == ("deny", "tcp", BLOCKED_DST)


def test_a_client_that_sends_its_hello_late_is_still_decided_by_its_sni(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = hello("allowed.test") + b"END"

    def scenario(w: World) -> tuple[Any, int]:
        with socket.create_connection(("127.0.0.1", w.transparent), timeout=5):
            time.sleep(0.5)  # and goes away: no record
        s = socket.create_connection(("127.0.0.1", w.transparent), timeout=5)
        with s:
            time.sleep(1.5)  # longer than the 1 s the front door once waited before handing over
            s.sendall(h)
            return read_all(s), 2

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == b"pong" and fast.took == ["tls"] and fast.up.got == [h]


def limit_records(w: World) -> list[dict[str, Any]]:
    return [r for r in w.records() if r["event"] == "limit"]


def test_a_connection_that_never_says_where_it_goes_is_closed_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A silent connection held a daemon's fd for ever (issue 22: 19,000 of them starved other sandboxes)."""
    monkeypatch.setattr(limits, "DEADLINE", 0.5)

    def scenario(w: World) -> tuple[Any, int]:
        got = []
        for port in (w.transparent, w.regular):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                t0 = time.monotonic()
                data = read_all(s)
                took = time.monotonic() - t0
                got.append((data, 0.4 < took < 4))  # closed by the proxy at its deadline, not by our timeout
        return got, 2

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == [(b"", True), (b"", True)] and fast.up.got == []
    assert [(r["limit"], r["kind"], r["count"]) for r in limit_records(fast)] == [
        ("deadline", "tcp", 1),
        ("deadline", "connect", 1),
    ]
    assert "ClientHello within 0.5 s" in limit_records(fast)[0]["reason"]


def test_an_oversized_hello_is_refused_before_anyone_buffers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = bytes(40000)  # a handshake message longer than the front door lets a head be (three records)
    msg = b"\x01" + len(body).to_bytes(3, "big") + body
    records = b"".join(
        b"\x16\x03\x01" + len(msg[i : i + 16384]).to_bytes(2, "big") + msg[i : i + 16384]
        for i in range(0, len(msg), 16384)
    )
    fast, got = both(tmp_path, monkeypatch, lambda w: (transparent(w, records + b"END"), 1))
    assert got == b"" and fast.took == [] and fast.up.got == []
    ((limit, kind, reason),) = [(r["limit"], r["kind"], r["reason"]) for r in limit_records(fast)]
    assert (limit, kind) == ("head", "tcp") and str(limits.HEAD_MAX) in reason


def test_an_endless_request_head_gets_a_431_on_either_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """600 MB of header lines once grew the shared daemon by 2.3 GB: now the head stops at HEAD_MAX."""
    filler = b"".join(b"X-Fill-%d: %s\r\n" % (i, b"a" * 200) for i in range(400))  # ~85 KiB, no end of head

    def scenario(w: World) -> tuple[Any, int]:
        p = w.up.port
        via_proxy = explicit(w, b"GET http://allowed.test:%d/ HTTP/1.1\r\nHost: allowed.test\r\n" % p + filler)
        plain = transparent(w, b"GET / HTTP/1.1\r\nHost: allowed.test\r\n" + filler)
        try:  # a CONNECT gets no answer: closed (reset: its unread bytes are dropped with it)
            connect = explicit(w, b"CONNECT allowed.test:%d HTTP/1.1\r\n" % p + filler)
        except ConnectionResetError:
            connect = b""
        return (via_proxy[:12], plain[:12], connect), 1

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == (b"HTTP/1.1 431", b"HTTP/1.1 431", b"") and fast.up.got == []
    assert [(r["limit"], r["kind"]) for r in limit_records(fast)][:1] == [("head", "http")]
    assert sum(r["count"] for r in limit_records(fast)) == 3


def test_a_later_head_inside_inspected_tls_is_bounded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front door cannot see inside TLS: mitmproxy's HTTP/1 layer is bounded (netguard.decision.headlimit)."""
    filler = b"".join(b"X-Fill-%d: %s\r\n" % (i, b"a" * 200) for i in range(400))

    def scenario(w: World) -> tuple[Any, int]:
        ctx = ssl.create_default_context(cadata=w.ca.cert)
        raw = socket.create_connection(("127.0.0.1", w.transparent), timeout=5)
        with ctx.wrap_socket(raw, server_hostname="insp.test") as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: insp.test\r\n" + filler)
            return read_all(s)[:12], 1

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == b"HTTP/1.1 431" and fast.up.got == []
    assert [(r["limit"], r["kind"], r["count"]) for r in limit_records(fast)] == [("head", "http", 1)]


def test_a_plain_connect_is_relayed_by_the_front_door(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = hello("denied.test")  # the CONNECT name is judged, not the SNI (as in mitmproxy's uninspected tunnel)

    def scenario(w: World) -> tuple[Any, int]:
        head = b"CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n" % (w.up.port, w.up.port)
        return explicit(w, head, h, b"END"), 2

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == b"HTTP/1.1 200 Connection established\r\n\r\npong"
    assert fast.took == ["connect"]
    assert all(fast.nodelay) and len(fast.nodelay) == 2  # no 40 ms Nagle + delayed-ACK stall (issue 25)
    dec, close = fast.records()
    assert (dec["kind"], dec["host"], close["bytes_down"]) == ("connect", "allowed.test", 4)


def test_a_denied_connect_gets_mitmproxys_403(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = b"CONNECT denied.test:443 HTTP/1.1\r\n\r\n"
    fast, got = both(tmp_path, monkeypatch, lambda w: (explicit(w, head), 1))
    assert got.startswith(b"HTTP/1.1 403") and b"denied.test" in got and fast.took == []


def test_a_connect_vetoed_after_the_rules_allowed_it_gets_the_same_403(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def scenario(w: World) -> tuple[Any, int]:
        w.binding.rules = rules.compile_policy(
            parse_network(
                {"allow": [{"host": "allowed.test", "ports": [w.up.port]}], "resolver": f"127.0.0.1:{w.dns.port}"},
                "p.yaml",
            )
        )  # no cidr rule: the loopback answer is vetoed (rebinding)
        return explicit(w, b"CONNECT allowed.test:%d HTTP/1.1\r\n\r\n" % w.up.port), 1

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got.startswith(b"HTTP/1.1 403") and fast.up.got == []
    (dec,) = fast.records()
    assert dec["action"] == "deny"


def test_an_inspected_connect_and_plain_http_are_mitmproxys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> tuple[Any, int]:
        ctx = ssl.create_default_context(cadata=w.ca.cert)
        raw = socket.create_connection(("127.0.0.1", w.regular), timeout=5)
        raw.sendall(b"CONNECT insp.test:%d HTTP/1.1\r\n\r\n" % w.up.port)
        assert raw.recv(100).startswith(b"HTTP/1.1 200")
        with ctx.wrap_socket(raw, server_hostname="insp.test") as s:
            name = issuer(s)
        get = explicit(w, b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        return (name, get.split(b"\r\n", 1)[0]), 2

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == ("sandgate run CA (test)", b"HTTP/1.1 403 Forbidden") and fast.took == []


def test_bytes_sent_before_the_200_are_the_tunnels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mitmproxy relays what follows the CONNECT head into the tunnel; so does the front door (its head only is read)."""

    def scenario(w: World) -> tuple[Any, int]:
        return explicit(w, b"CONNECT allowed.test:%d HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\nEND" % w.up.port), 2

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got.endswith(b"pong") and fast.took == ["connect"] and fast.up.got == [b"GET / HTTP/1.1\r\n\r\nEND"]


@pytest.mark.parametrize("path", ["explicit", "transparent"])
def test_an_error_in_the_front_door_closes_the_client_and_relays_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    async def broken(*_a: Any, **_k: Any) -> decide.Decided:
        raise RuntimeError("injected")

    with upstream() as (up, dns):
        w = World(tmp_path, monkeypatch, True, up, dns)
        try:
            monkeypatch.setattr(decide.Decider, "authorize", broken)
            if path == "explicit":
                got = explicit(w, b"CONNECT allowed.test:%d HTTP/1.1\r\n\r\n" % w.up.port, b"END")
            else:
                got = transparent(w, hello("allowed.test") + b"END")
            assert got == b""  # closed: no 200, nothing relayed
            time.sleep(0.2)
            assert w.up.got == [] and w.took == [] and w.records() == []
        finally:
            w.close()


def test_a_huge_hello_inside_a_connect_to_an_inspected_host_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mitmproxy reads this hello itself (the CONNECT was allowed first); it once buffered up to 16 MiB of it."""
    body = bytes(40000)
    msg = b"\x01" + len(body).to_bytes(3, "big") + body
    records = b"".join(
        b"\x16\x03\x01" + len(msg[i : i + 16384]).to_bytes(2, "big") + msg[i : i + 16384]
        for i in range(0, len(msg), 16384)
    )

    def scenario(w: World) -> tuple[Any, int]:
        got = explicit(w, b"CONNECT insp.test:%d HTTP/1.1\r\n\r\n" % w.up.port, records)
        return got.split(b"\r\n", 1)[0], 2

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == b"HTTP/1.1 200 Connection established" and fast.up.got == []
    assert [(r["limit"], r["kind"], r["count"]) for r in limit_records(fast)] == [("head", "tls", 1)]


def test_a_head_trickled_inside_inspected_tls_is_cut_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte every few seconds once kept kept-alive connections (and the daemon's memory) for ever."""
    monkeypatch.setattr(limits, "DEADLINE", 1.0)

    def scenario(w: World) -> tuple[Any, int]:
        ctx = ssl.create_default_context(cadata=w.ca.cert)
        raw = socket.create_connection(("127.0.0.1", w.transparent), timeout=5)
        with ctx.wrap_socket(raw, server_hostname="insp.test") as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: insp.test\r\n")
            with contextlib.suppress(OSError):
                for i in range(12):  # 2.4 s of trickle: past the deadline, far under mitmproxy's idle timeout
                    time.sleep(0.2)
                    s.sendall(b"X-%d: a\r\n" % i)
            return read_all(s)[:12], 1

    fast, got = both(tmp_path, monkeypatch, scenario)
    assert got == b"HTTP/1.1 408" and fast.up.got == []
    assert [(r["limit"], r["kind"], r["count"]) for r in limit_records(fast)] == [("deadline", "http", 1)]
