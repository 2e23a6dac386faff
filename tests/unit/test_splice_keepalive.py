"""Plain HTTP through the explicit proxy keeps its upstream connection alive, and stays pinned.

A fake DNS answers 127.0.0.1 for every name (a cidr rule for 127.0.0.0/8 lets the loopback veto
pass); the upstream is an HTTP/1.1 keep-alive server that counts its connections and requests.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.dnsfake import FakeDns
from ..support.tlsharness import loopback
from .test_splice_proxy import Proxy


class Web:
    def __init__(self) -> None:
        self.conns = 0
        self.requests: list[str] = []
        web = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                web.conns += 1
                super().setup()

            def do_GET(self) -> None:
                web.requests.append(f"{self.headers['Host']} {self.path}")
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Proxy, Web]]:
    dns, web = FakeDns(loopback), Web()
    network = {
        "allow": [{"host": h, "ports": [web.port]} for h in ("web.test", "other.test")]
        + [{"cidr": "127.0.0.0/8", "ports": [web.port]}],
        "deny": ["denied.test"],
        "resolver": f"127.0.0.1:{dns.port}",
    }
    px = Proxy(tmp_path, [web.port], network)
    try:
        yield px, web
    finally:
        px.close()
        web.close()
        dns.close()


def _get(s: socket.socket, host: str, port: int) -> bytes:
    s.sendall(f"GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    body = s.recv(2) if b"Content-Length: 2\r\n" in head else b""
    if head.startswith(b"HTTP/1.1 403"):
        length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            body += s.recv(length - len(body))
    return head.split(b"\r\n", 1)[0] + b" " + body


def test_requests_to_one_name_reuse_one_upstream_connection(setup: tuple[Proxy, Web]) -> None:
    px, web = setup
    with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
        for _ in range(3):
            assert _get(s, "web.test", web.port) == b"HTTP/1.1 200 OK ok"
    assert web.conns == 1 and len(web.requests) == 3
    decisions = [r for r in read_records(px.audit) if r["event"] == "decision"]
    assert [(r["host"], r["ip"]) for r in decisions] == [("web.test", "127.0.0.1")] * 3  # each request judged


def test_another_name_gets_its_own_connection_and_a_denied_one_none(setup: tuple[Proxy, Web]) -> None:
    px, web = setup
    with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
        assert _get(s, "web.test", web.port).startswith(b"HTTP/1.1 200")
        assert _get(s, "other.test", web.port).startswith(b"HTTP/1.1 200")
        assert _get(s, "web.test", web.port).startswith(b"HTTP/1.1 200")
    assert web.conns == 2 and len(web.requests) == 3
    with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
        assert _get(s, "denied.test", web.port).startswith(b"HTTP/1.1 403")
    assert web.conns == 2 and len(web.requests) == 3  # the refused request never left
