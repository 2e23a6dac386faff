"""Decided tunnels leave mitmproxy for the kernel relay: through a real proxy (make_master) and a real daemon.

Every proxy test runs twice: spliced in the proxy's own process, and in a relay worker.

The upstream is a raw TCP server on 127.0.0.1 that records what it got and answers as each test
tells it. Judged by the far ends (bytes, order, EOFs), by the close record (exact counts) and by
the Relay having been handed off (else these would only test mitmproxy's own relay).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from mitmproxy.proxy.context import Context

from netguard import rules
from netguard.audit import AuditLog, read_records
from netguard.daemon.master import make_master
from netguard.decision import layers
from netguard.decision.binding import Binding
from netguard.policy import parse_network
from netguard.relay import handoff, relay, relaypool

from ..support.daemonfake import Box, Daemon, eventually
from ..support.tcpfake import serve_in_threads

Serve = Callable[[socket.socket], None]
T = TypeVar("T")


class Upstream:
    """One-connection-at-a-time TCP server; `serve` runs per accepted connection (in a thread)."""

    def __init__(self, serve: Serve) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        serve_in_threads(self.sock, lambda c: self._serve(c, serve))

    def _serve(self, c: socket.socket, serve: Serve) -> None:
        c.settimeout(10)
        self.conns.append(c)
        serve(c)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


class Proxy:
    """make_master's proxy on its own loop thread; every Relay it makes is kept in `relays`."""

    def __init__(self, tmp: Path, ports: list[int], network: dict[str, Any] | None = None, where: str = "here") -> None:
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.audit = tmp / "audit.jsonl"
        pol = parse_network(network or {"allow": [{"cidr": "127.0.0.0/8", "ports": ports}]}, "p.yaml")
        self.binding = Binding("t1", rules.compile_policy(pol), AuditLog(self.audit))
        self.relays: list[layers.Relay] = []
        self._ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "proxy did not start"
        self.pool: relaypool.Pool = self.on_loop(relaypool.pool)
        self.where = where
        if where == "worker":
            self.on_loop(self.pool.start)
            assert eventually(lambda: all(w.capacity for w in self.pool.workers) and bool(self.pool.workers), 10)
        else:
            self.pool.place = lambda *_: None  # type: ignore[method-assign]  # no worker: spliced in this process

    def on_loop(self, fn: Callable[[], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(lambda: fut.set_result(fn()))
        return fut.result(10)

    async def _main(self) -> None:
        master, self.proxyserver, gate = make_master({self.port: self.binding}, [f"regular@127.0.0.1:{self.port}"])
        make = gate._relay

        def keep(ctx: Context) -> layers.Relay:
            r = make(ctx)
            self.relays.append(r)
            return r

        gate._relay = keep  # type: ignore[method-assign]
        self._stop = asyncio.Event()
        assert await self.proxyserver.setup_servers()
        await master.running()
        self._ready.set()
        await self._stop.wait()
        master.should_exit.set()
        await self.proxyserver.servers.update([])
        await master.done()

    def close(self) -> None:
        self.on_loop(self.pool.stop)
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def tunnel(self, port: int, early: bytes = b"") -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode() + early)
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        return s

    def closes(self) -> list[Any]:
        return [r for r in read_records(self.audit) if r["event"] == "close"]

    def handed_off(self) -> bool:
        return bool(self.relays) and all(r.handoff is not None for r in self.relays)


def _read_all(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(1 << 20):
        out += chunk
    return bytes(out)


def _echo_upper(c: socket.socket) -> None:
    """Reads to EOF, then answers (a half-closed request still gets its reply), then closes."""
    data = _read_all(c)
    c.sendall(data.upper())
    c.close()


@pytest.fixture(params=["here", "worker", "moved"])
def proxy_for(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Serve], tuple[Proxy, Upstream]]]:
    """here: spliced in the proxy's process throughout; worker: in a relay worker from the start;
    moved: here, then moved to a worker after its first byte (netguard.relay.relay), mid-flow."""
    made: list[tuple[Proxy, Upstream]] = []
    monkeypatch.setattr(relay, "MOVE_AFTER", {"here": relay.MOVE_AFTER, "worker": 0, "moved": 1}[request.param])

    def make(serve: Serve) -> tuple[Proxy, Upstream]:
        up = Upstream(serve)
        px = Proxy(tmp_path, [up.port], where="here" if request.param == "here" else "worker")
        made.append((px, up))
        return px, up

    try:
        yield make
    finally:
        for px, up in made:
            px.close()
            up.close()


def test_a_tunnel_is_spliced_half_closes_travel_and_the_close_record_is_exact(
    proxy_for: Callable[[Serve], tuple[Proxy, Upstream]],
) -> None:
    px, up = proxy_for(_echo_upper)
    s = px.tunnel(up.port, early=b"first bytes, sent with the CONNECT; ")
    body = b"abc" * 400000  # 1.2 MB after the handoff
    s.sendall(body)
    s.shutdown(socket.SHUT_WR)
    got = _read_all(s)
    assert got == (b"first bytes, sent with the CONNECT; " + body).upper()
    s.close()
    assert eventually(lambda: len(px.closes()) == 1)
    rec = px.closes()[0]
    assert (rec["kind"], rec["bytes_up"], rec["bytes_down"]) == ("connect", len(got), len(got))
    assert px.handed_off()
    moved = px.relays[0].handoff
    assert moved is not None and isinstance(moved.relay, relay.Relay)
    assert moved.relay.in_worker == (px.where == "worker")  # "moved": mid-flow, both legs counted above


def test_a_server_that_speaks_first_and_bytes_buffered_at_the_handoff_arrive_in_order(
    proxy_for: Callable[[Serve], tuple[Proxy, Upstream]],
) -> None:
    greeting = b"220 hello\r\n" + bytes(range(256)) * 4000  # lands in mitmproxy's buffers around the handoff

    def greet(c: socket.socket) -> None:
        c.sendall(greeting)
        c.sendall(_read_all(c))
        c.close()

    px, up = proxy_for(greet)
    s = px.tunnel(up.port, early=b"x")  # a CONNECT tunnel relays once the client spoke
    assert eventually(px.handed_off)
    s.sendall(b"QUIT\r\n")
    s.shutdown(socket.SHUT_WR)
    assert _read_all(s) == greeting + b"xQUIT\r\n"
    assert eventually(lambda: len(px.closes()) == 1)
    assert (px.closes()[0]["bytes_up"], px.closes()[0]["bytes_down"]) == (7, len(greeting) + 7)


def test_a_drop_cuts_the_spliced_tunnel_at_both_ends_and_mitmproxy_tears_down(
    proxy_for: Callable[[Serve], tuple[Proxy, Upstream]],
) -> None:
    """What the daemon's drop does (handoff.cut_slots: mitmproxy holds no transport to abort) ends both sides."""
    seen = threading.Event()

    def hold(c: socket.socket) -> None:
        c.recv(10)
        seen.set()
        try:
            assert _read_all(c) == b""
        except ConnectionResetError:
            pass
        seen.clear()  # the upstream saw the end

    px, up = proxy_for(hold)
    s = px.tunnel(up.port, early=b"x")
    assert seen.wait(5) and eventually(px.handed_off)
    handler = next(iter(px.proxyserver.connections.values()))
    writers = [io.writer for io in handler.transports.values()]
    assert all(isinstance(w, asyncio.StreamWriter) and w.transport.is_closing() for w in writers)  # given up: no fd
    px.loop.call_soon_threadsafe(handoff.cut_slots, [px.port + 1], "another sandbox's drop")
    time.sleep(0.2)
    assert seen.is_set() and not px.closes()  # another slot's drop leaves this tunnel alone
    px.loop.call_soon_threadsafe(handoff.cut_slots, [px.port], "closed by the proxy")
    assert eventually(lambda: not seen.is_set())
    try:
        assert s.recv(10) == b""
    except ConnectionResetError:
        pass
    assert eventually(lambda: len(px.closes()) == 1) and px.closes()[0]["bytes_up"] == 1
    assert eventually(lambda: not px.proxyserver.connections)  # mitmproxy tore down as after any close
    assert not handoff._LIVE


def test_end_cuts_a_spliced_tunnel_of_that_sandbox_at_both_ends(tmp_path: Path) -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sgs"))  # AF_UNIX paths are short
    base.chmod(0o700)
    ended = threading.Event()

    def stream(c: socket.socket) -> None:
        c.recv(10)
        try:
            while True:
                c.sendall(bytes(65536))  # a download in progress
        except OSError:
            ended.set()

    up = Upstream(stream)
    d = Daemon(base)
    try:
        a = Box(d, "a", {"allow": [{"cidr": "127.0.0.0/8", "ports": [up.port]}]})
        s = socket.create_connection(("127.0.0.1", a.regular), timeout=5)
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\nx" % up.port)
        assert s.recv(19).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:
            assert s.recv(65536)
        a.client.end()
        assert ended.wait(10)  # the upstream was cut, not left streaming into a dead tunnel
        s.settimeout(5)
        try:
            while s.recv(1 << 20):
                pass
        except ConnectionResetError:
            pass
        closes = [r for r in read_records(a.audit) if r["event"] == "close"]
        assert len(closes) == 1 and closes[0]["bytes_down"] > 1 << 20
    finally:
        d.stop()
        up.close()
        shutil.rmtree(base, ignore_errors=True)
