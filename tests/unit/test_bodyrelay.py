"""A large plain-HTTP response body leaves mitmproxy for a counted splice: through a real proxy (make_master).

Judged by what the client got (every byte, in order, then the end of the connection), by what the
fake upstream saw (a pipelined second request never reaches it), by the close record (exact counts)
and by the body relay having been used at all (else these would only test mitmproxy's own path).
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from netguard.audit import read_records
from netguard.relay import bodyrelay

from ..support.tcpfake import serve_in_threads
from .test_splice_proxy import Proxy

BIG = 3 * 1024 * 1024 + 17  # not a multiple of any pipe or read size


def _beyond_buffers() -> int:
    """A body the kernel cannot hold all of on the way to a client that stopped reading: more than the
    proxy's socket send buffer may grow to (tcp_wmem's max, 4 MiB here) plus a pipe, twice over. With a
    smaller body a loaded machine could splice the whole of it into buffers before the client leaves."""
    try:
        wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        wmem = 4 << 20
    return 2 * (wmem + (1 << 20)) + 17


def _body(n: int) -> bytes:
    return (hashlib.sha256(b"x").digest() * (n // 32 + 1))[:n]


class Web:
    """A raw HTTP/1.1 upstream: each request line it reads is recorded; answers with a body of `size`."""

    def __init__(self, size: int, head_extra: bytes = b"") -> None:
        self.size, self.extra = size, head_extra
        self.requests: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        serve_in_threads(self.sock, self._serve)

    def _serve(self, c: socket.socket) -> None:
        buf = b""
        with c:
            c.settimeout(10)
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = c.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    self.requests.append(head.split(b"\r\n", 1)[0].decode())
                    body = _body(self.size)
                    # Headers and the first body bytes in one send: mitmproxy reads them together.
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), self.extra) + body)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def web_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Proxy, Web, list[Any]]]:
    yield from _web_proxy(tmp_path, monkeypatch, BIG)


@pytest.fixture
def huge_web_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Proxy, Web, list[Any]]]:
    yield from _web_proxy(tmp_path, monkeypatch, _beyond_buffers())


def _web_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> Iterator[tuple[Proxy, Web, list[Any]]]:
    web = Web(size)
    px = Proxy(tmp_path, [web.port])
    relays: list[Any] = []
    take = bodyrelay.BodyRelay.take

    def keep(*a: Any) -> Any:
        r = take(*a)
        relays.append(r)
        return r

    monkeypatch.setattr(bodyrelay.BodyRelay, "take", keep)
    try:
        yield px, web, relays
    finally:
        px.close()
        web.close()


def _read_response(s: socket.socket) -> tuple[bytes, bytes, bytes]:
    """(head, body, what came after the body before the end of the connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    n = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    body = bytearray(rest)
    while chunk := s.recv(1 << 20):
        body += chunk
    return head, bytes(body[:n]), bytes(body[n:])


def test_a_large_body_is_spliced_whole_and_the_close_record_counts_it(web_proxy: tuple[Proxy, Web, list[Any]]) -> None:
    px, web, relays = web_proxy
    with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
        s.sendall(f"GET http://127.0.0.1:{web.port}/big HTTP/1.1\r\nHost: 127.0.0.1:{web.port}\r\n\r\n".encode())
        head, body, after = _read_response(s)
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert body == _body(BIG) and after == b""
    assert len(relays) == 1 and relays[0] is not None and relays[0].over and relays[0].moved > BIG // 2
    closes = [r for r in read_records(px.audit) if r["event"] == "close"]
    assert [(c["kind"], c["bytes_up"], c["bytes_down"]) for c in closes] == [("http", 0, BIG)]


def test_a_pipelined_second_request_never_reaches_the_upstream(web_proxy: tuple[Proxy, Web, list[Any]]) -> None:
    """The second request (to another host, which the policy would deny, and to the same one) rides behind
    the first on one connection: the relay moves only the first body, and the connection then ends."""
    px, web, relays = web_proxy
    first = f"GET http://127.0.0.1:{web.port}/big HTTP/1.1\r\nHost: 127.0.0.1:{web.port}\r\n\r\n"
    again = f"GET http://127.0.0.1:{web.port}/second HTTP/1.1\r\nHost: 127.0.0.1:{web.port}\r\n\r\n"
    other = f"GET http://127.0.0.2:{web.port + 1}/evil HTTP/1.1\r\nHost: 127.0.0.2:{web.port + 1}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
        s.sendall((first + again + other).encode())
        head, body, after = _read_response(s)
    assert head.startswith(b"HTTP/1.1 200") and body == _body(BIG)
    assert after == b""  # no second response: the connection ended after the first body
    assert relays and relays[0] is not None and relays[0].moved > 0
    assert web.requests == ["GET /big HTTP/1.1"]  # what the upstream saw: the first request only
    decisions = [r for r in read_records(px.audit) if r["event"] == "decision"]
    assert len(decisions) == 1 and decisions[0]["action"] == "allow"
    # The permitted action in the same test: the same second request on a new connection passes.
    with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
        s.sendall(again.encode())
        head, body, _ = _read_response(s)
    assert head.startswith(b"HTTP/1.1 200") and body == _body(BIG)
    assert web.requests == ["GET /big HTTP/1.1", "GET /second HTTP/1.1"]


def test_a_client_that_leaves_mid_body_cuts_the_relay_and_the_record_counts_what_was_sent(
    huge_web_proxy: tuple[Proxy, Web, list[Any]],
) -> None:
    px, web, relays = huge_web_proxy
    s = socket.create_connection(("127.0.0.1", px.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(f"GET http://127.0.0.1:{web.port}/big HTTP/1.1\r\nHost: 127.0.0.1:{web.port}\r\n\r\n".encode())
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200")
    s.close()
    px_closes: list[Any] = []
    for _ in range(100):
        px_closes = [r for r in read_records(px.audit) if r["event"] == "close"]
        if px_closes:
            break
        threading.Event().wait(0.05)
    assert len(px_closes) == 1 and 0 < px_closes[0]["bytes_down"] < web.size
    assert relays and relays[0] is not None and relays[0].over


def _flow(status: int = 200, length: str = str(BIG), method: str = "GET", **headers: str) -> http.HTTPFlow:
    f = tflow.tflow(resp=True)
    f.request.scheme, f.request.method = "http", method
    f.request.headers.clear()
    assert f.response is not None
    f.response.status_code = status
    f.response.headers.clear()
    if length:
        f.response.headers["content-length"] = length
    for k, v in headers.items():
        f.response.headers[k.replace("_", "-")] = v
    return f


def test_only_a_large_known_length_body_of_a_bodiless_plain_http1_request_qualifies() -> None:
    assert bodyrelay.length(_flow()) == BIG
    assert bodyrelay.length(_flow(length=str(bodyrelay.THRESHOLD))) is None  # small: cheaper through mitmproxy
    assert bodyrelay.length(_flow(length="")) is None  # close-delimited: no count to stop at
    assert bodyrelay.length(_flow(transfer_encoding="chunked")) is None
    assert bodyrelay.length(_flow(method="HEAD")) is None and bodyrelay.length(_flow(status=304)) is None
    f = _flow()
    f.request.headers["content-length"] = "5"  # a request body still on its way: stays with mitmproxy
    assert bodyrelay.length(f) is None
    f = _flow()
    f.request.scheme = "https"
    assert bodyrelay.length(f) is None
    f = _flow()
    assert f.response is not None
    f.response.headers.add("content-length", str(BIG))  # two lengths: ambiguous framing stays with mitmproxy
    assert bodyrelay.length(f) is None


def test_end_of_the_sandbox_cuts_a_body_in_flight_at_both_ends(tmp_path: Path) -> None:
    """Through the real daemon: a slow upstream is mid-body when the sandbox is dropped."""
    import shutil
    import tempfile
    import time

    from ..support.daemonfake import Box, Daemon

    base = Path(tempfile.mkdtemp(prefix="sgb"))  # AF_UNIX paths are short
    base.chmod(0o700)
    ended = threading.Event()
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        c, _ = srv.accept()
        c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 30))
        try:
            while True:
                c.sendall(bytes(65536))  # a download in progress, far from its end
                time.sleep(0.01)
        except OSError:
            ended.set()

    threading.Thread(target=serve, daemon=True).start()
    d = Daemon(base)
    try:
        a = Box(d, "a", {"allow": [{"cidr": "127.0.0.0/8", "ports": [port]}]})
        s = socket.create_connection(("127.0.0.1", a.regular), timeout=5)
        s.sendall(f"GET http://127.0.0.1:{port}/big HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        got = 0
        while got < 2 << 20:
            chunk = s.recv(1 << 20)
            assert chunk
            got += len(chunk)
        a.client.end()
        assert ended.wait(10)  # the upstream was cut, not left streaming to nobody
        s.settimeout(5)
        try:
            while s.recv(1 << 20):
                pass  # the client sees its end too (EOF or reset), not a connection left open
        except ConnectionResetError:
            pass
        closes = [r for r in read_records(a.audit) if r["event"] == "close"]
        assert len(closes) == 1 and closes[0]["kind"] == "http" and closes[0]["bytes_down"] > 1 << 20
    finally:
        d.stop()
        srv.close()
        shutil.rmtree(base, ignore_errors=True)


def test_without_splice_on_this_os_no_body_and_no_flow_leaves_mitmproxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Windows proxy has no splice(2): both takeovers decline before touching mitmproxy's handler."""
    from netguard.relay import bodycopy, handoff, splice

    class Untouchable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"mitmproxy's handler was touched ({name})")

    f = _flow()
    assert bodyrelay.length(f) == BIG  # it would qualify
    monkeypatch.setattr(splice, "AVAILABLE", False)
    assert bodyrelay.BodyRelay.take({f.client_conn.id: Untouchable()}, f, bodycopy.Counter()) is None
    h = handoff.Handoff(Untouchable(), f.client_conn, f.server_conn, 0, lambda *a: None)
    assert h.take(60.0) is False and not h.spliced
