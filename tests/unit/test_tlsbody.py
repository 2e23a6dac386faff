"""A large inspected response body leaves mitmproxy's layers for one decrypt/encrypt loop (netguard.relay.tlsbody).

Through a real proxy (make_master) and a real TLS upstream that writes its headers and its body
separately, as servers do. Judged by what the client got (every byte and not one past the
Content-Length), by the request record (status and exact counts, or the failure), by the takeover
having been used at all (else these would test mitmproxy's own path), and by the protocol each
client negotiated (the upstream-ALPN memory that lets an h2-offering client reach the takeover).
"""

from __future__ import annotations

import hashlib
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard import rules
from netguard.audit import AuditLog, read_records
from netguard.decision.binding import Binding
from netguard.policy import parse_network
from netguard.relay import tlsbody
from selftest.certs import CA

from ..support.dnsfake import FakeDns
from ..support.tlsharness import Proxy, Upstream, get_h2, loopback, run_ca

BIG = tlsbody.THRESHOLD + 1024 * 1024 + 17  # above the threshold; not a multiple of any read, record or buffer size
SLOW = 24 * 1024 * 1024 + 5  # more than socket buffers and the takeover's queue hold for a client that pauses


def _body(n: int) -> bytes:
    return (hashlib.sha256(b"tls").digest() * (n // 32 + 1))[:n]


class BigUpstream(Upstream):
    """TLS upstream: `GET /<n>` answers n bytes; `/<n>/extra` sends garbage past them, `/<n>/short` half, then ends."""

    def __init__(self, tmp: Path, ca: CA, name: str, alpn: tuple[str, ...]) -> None:
        super().__init__(tmp, ca, name, alpn=alpn, timeout=20)

    def respond(self, s: ssl.SSLSocket, head: bytes) -> None:
        path = head.split(b" ", 2)[1].decode().strip("/").split("/")
        n, how = int(path[0]), path[1] if len(path) > 1 else ""
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)  # headers, then the body
        body = _body(n)
        if how == "short":
            s.sendall(body[: n // 2])
            return
        s.sendall(body + (b"GARBAGE-PAST-THE-BODY" * 1000 if how == "extra" else b""))
        time.sleep(0.5 if how == "extra" else 0)


class World:
    def __init__(self, tmp: Path) -> None:
        self.dns = FakeDns(loopback)
        self.upstream_ca = CA("upstream CA")
        self.h1 = BigUpstream(tmp, self.upstream_ca, "big.test", ())  # no ALPN at all, like many servers
        self.h2up = Upstream(tmp, self.upstream_ca, "h2.test", alpn=("h2", "http/1.1"))
        pol = parse_network(
            {
                "allow": [
                    {"host": "big.test", "inspect": True, "ports": [self.h1.port]},
                    {"host": "h2.test", "inspect": True, "ports": [self.h2up.port]},
                    {"cidr": "127.0.0.0/8", "ports": [self.h1.port, self.h2up.port]},  # where the fake DNS points
                ],
                "resolver": f"127.0.0.1:{self.dns.port}",
            },
            "p.yaml",
        )
        self.ca = run_ca()
        self.audit = tmp / "audit.jsonl"
        binding = Binding(
            "t1",
            rules.compile_policy(pol),
            AuditLog(self.audit),
            ca=self.ca,
            upstream_ca=self.upstream_ca.cert_pem.decode(),
        )
        self.proxy = Proxy(binding)

    def client(self, host: str, port: int, alpn: list[str]) -> ssl.SSLSocket:
        ctx = ssl.create_default_context(cadata=self.ca.cert)
        ctx.set_alpn_protocols(alpn)
        return ctx.wrap_socket(self.proxy.tunnel(host, port), server_hostname=host)

    def requests(self) -> list[dict[str, Any]]:
        return [dict(r) for r in read_records(self.audit) if r.get("event") == "request"]

    def close(self) -> None:
        self.proxy.close()
        self.h1.close()
        self.h2up.close()
        self.dns.close()


@pytest.fixture
def proxied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[World, list[int]]]:
    taken: list[int] = []  # the limit of every takeover that started
    real = tlsbody.TlsCopy.start

    def start(self: tlsbody.TlsCopy) -> None:
        taken.append(self.left)
        real(self)

    monkeypatch.setattr(tlsbody.TlsCopy, "start", start)
    w = World(tmp_path)
    try:
        yield w, taken
    finally:
        w.close()


def _get(s: ssl.SSLSocket, path: str, pause: float = 0.0) -> tuple[bytes, bytes]:
    """(head, body) of one HTTP/1.1 GET, read until the connection ends; `pause`: stop reading a while first."""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {s.server_hostname}\r\n\r\n".encode())
    data = s.recv(65536)
    time.sleep(pause)
    while True:
        try:
            chunk = s.recv(1 << 20)
        except ssl.SSLEOFError:  # the proxy ends the connection without close_notify, as mitmproxy does
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def _wait_records(w: World, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while len(recs := w.requests()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return recs


def test_a_large_inspected_body_arrives_whole_and_the_record_counts_it(proxied: tuple[World, list[int]]) -> None:
    w, taken = proxied
    with w.client("big.test", w.h1.port, ["http/1.1"]) as s:
        head, body = _get(s, f"/{BIG}")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in head.lower()  # no later request on it goes unjudged
    assert hashlib.sha256(body).digest() == hashlib.sha256(_body(BIG)).digest()
    assert len(taken) == 1 and 0 < taken[0] <= BIG  # the takeover moved the rest of it
    (rec,) = _wait_records(w, 1)
    assert rec["status"] == 200 and rec["bytes_down"] == BIG and rec["reason"].find("failed") < 0


def test_bytes_past_the_content_length_never_reach_the_client(proxied: tuple[World, list[int]]) -> None:
    w, taken = proxied
    with w.client("big.test", w.h1.port, ["http/1.1"]) as s:
        _, body = _get(s, f"/{BIG}/extra")
    assert body == _body(BIG)  # exactly the body: the garbage after it was dropped
    assert taken
    (rec,) = _wait_records(w, 1)
    assert rec["status"] == 200 and rec["bytes_down"] == BIG


def test_an_upstream_ending_early_is_a_failed_request_and_a_short_body(proxied: tuple[World, list[int]]) -> None:
    w, taken = proxied
    with w.client("big.test", w.h1.port, ["http/1.1"]) as s:
        _, body = _get(s, f"/{BIG}/short")
    assert len(body) < BIG and body == _body(BIG)[: len(body)]
    assert taken
    (rec,) = _wait_records(w, 1)
    assert rec["status"] is None and "failed" in rec["reason"]


def test_a_client_that_pauses_still_gets_every_byte(proxied: tuple[World, list[int]]) -> None:
    w, taken = proxied
    with w.client("big.test", w.h1.port, ["http/1.1"]) as s:
        _, body = _get(s, f"/{SLOW}", pause=1.0)  # the takeover queues at most 1 MiB, then stops reading
    assert len(body) == SLOW and body == _body(SLOW)
    assert taken


def test_a_body_below_the_threshold_stays_with_mitmproxy_and_the_connection_is_kept(
    proxied: tuple[World, list[int]],
) -> None:
    w, taken = proxied
    n = tlsbody.THRESHOLD - 1
    with w.client("big.test", w.h1.port, ["http/1.1"]) as s:
        for _ in range(2):  # kept alive: the second request rides the same connection
            s.sendall(f"GET /{n} HTTP/1.1\r\nHost: big.test\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(1)
            assert b"connection: close" not in head.lower()
            body = b""
            while len(body) < n:
                body += s.recv(1 << 20)
            assert body == _body(n)
    assert taken == []


def test_a_client_offering_h2_gets_http1_once_the_upstream_answered_http1(proxied: tuple[World, list[int]]) -> None:
    w, taken = proxied
    with w.client("big.test", w.h1.port, ["h2", "http/1.1"]) as s:
        assert s.selected_alpn_protocol() == "h2"  # nothing known of the upstream yet: the client's preference
        assert get_h2(s, "big.test", "/1000") == (200, _body(1000))
    with w.client("big.test", w.h1.port, ["h2", "http/1.1"]) as s:
        assert s.selected_alpn_protocol() == "http/1.1"  # the upstream speaks HTTP/1.1: so does the client now
        _, body = _get(s, f"/{BIG}")
    assert body == _body(BIG) and taken
    with w.client("big.test", w.h1.port, ["h2"]) as s:
        assert s.selected_alpn_protocol() == "h2"  # an h2-only client (gRPC) is never refused h2
        assert get_h2(s, "big.test", "/1000") == (200, _body(1000))


def test_an_h2_upstream_keeps_h2_clients_on_h2(proxied: tuple[World, list[int]]) -> None:
    w, _ = proxied
    for _ in range(2):
        with w.client("h2.test", w.h2up.port, ["h2", "http/1.1"]) as s:
            assert s.selected_alpn_protocol() == "h2"
            assert get_h2(s, "h2.test", "/a") == (200, b"upstream")
    assert w.h2up.requests == [b"h2 GET /a h2.test"] * 2  # h2 end to end, both times
