"""Inspected requests through the real proxy with real TLS (netguard.daemon.master: TlsInspect and the Gate).

The fake upstreams and the proxy come from test_tlsinspect. What the upstream saw is the judge: a
refused request never reaches it, the requests after a refusal on the same connection (HTTP/1.1
kept alive, HTTP/2 multiplexed) do, and only the bound host gets the real credential.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from netguard import rules
from netguard.audit import AuditLog
from netguard.credentials import Secret
from netguard.decision.binding import Binding
from netguard.policy import parse_network
from selftest.certs import CA
from sgbase.origin import Origin

from ..support.dnsfake import FakeDns
from ..support.tlsharness import Proxy, Upstream, loopback, run_ca

REAL = "sk-REALVALUE-abcdefghijklmnop"
SENTINEL = "sk-sandgate-sentinel-1234abcd"


class H2Upstream(Upstream):
    """An upstream that records h2 requests as method, path and authorization; HTTP/1.1 kept alive (one
    request per connection would make mitmproxy pass the close on to the client)."""

    def __init__(self, tmp: Path, ca: CA, name: str, alpn: tuple[str, ...]) -> None:
        super().__init__(tmp, ca, name, alpn=alpn, keep_alive=True)

    def h2_record(self, headers: dict[bytes, bytes]) -> bytes:
        return b"%s %s %s" % (headers[b":method"], headers[b":path"], headers.get(b"authorization", b"-"))


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.dns = FakeDns(loopback)
        self.upstream_ca = CA("upstream CA")
        self.api = H2Upstream(tmp, self.upstream_ca, "api.test", alpn=("h2", "http/1.1"))
        self.other = H2Upstream(tmp, self.upstream_ca, "other.test", alpn=("h2",))
        ports = [self.api.port, self.other.port]
        pol = parse_network(
            {
                "allow": [
                    {"host": "api.test", "http": ["read-only"], "ports": [self.api.port]},
                    {"host": "other.test", "inspect": True, "ports": [self.other.port]},
                    {"cidr": "127.0.0.0/8", "ports": ports},
                ],
                "resolver": f"127.0.0.1:{self.dns.port}",
            },
            "p.yaml",
        )
        secret = Secret("api.test", "Authorization", f"Bearer {REAL}", REAL, SENTINEL, "API_KEY", Origin("p.yaml", 9))
        self.ca = run_ca()
        self.log = tmp / "audit.jsonl"
        self.binding = Binding(
            "t1",
            rules.compile_policy(pol),
            AuditLog(self.log),
            ca=self.ca,
            upstream_ca=self.upstream_ca.cert_pem.decode(),
            secrets=(secret,),
        )
        self.proxy = Proxy(self.binding)

    def h2_socket(self, host: str, port: int) -> ssl.SSLSocket:
        ctx = ssl.create_default_context(cadata=self.ca.cert)
        ctx.set_alpn_protocols(["h2"])
        s = ctx.wrap_socket(self.proxy.tunnel(host, port), server_hostname=host)
        assert s.selected_alpn_protocol() == "h2"
        return s

    def close(self) -> None:
        self.proxy.close()
        self.api.close()
        self.other.close()
        self.dns.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.close()


def h2_requests(
    s: ssl.SSLSocket, host: str, reqs: list[tuple[str, str, list[tuple[str, str]]]]
) -> list[tuple[int, bytes]]:
    """Each request on its own stream of one connection, one after the other: (status, body) each."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    out = []
    for i, (method, path, extra) in enumerate(reqs):
        sid = 1 + 2 * i
        hdrs = [(":method", method), (":path", path), (":scheme", "https"), (":authority", host), *extra]
        conn.send_headers(sid, hdrs, end_stream=True)
        s.sendall(conn.data_to_send())
        status, body, done = 0, b"", False
        while not done:
            data = s.recv(65536)
            assert data, "connection closed"
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    status = int(dict(ev.headers)[b":status"])
                elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                    body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset) and ev.stream_id == sid:
                    done = True
            s.sendall(conn.data_to_send())
        out.append((status, body))
    return out


def test_http2_refusals_keep_the_connection_and_only_the_bound_host_gets_the_secret(world: World) -> None:
    w = world
    bearer = [("authorization", f"Bearer {SENTINEL}")]
    with w.h2_socket("api.test", w.api.port) as s:
        got = h2_requests(
            s,
            "api.test",
            [
                ("GET", "/v1/models", bearer),
                ("POST", "/v1/chat", [*bearer, ("content-length", "0")]),  # read-only: refused
                ("GET", "/v1/after", []),  # the same connection goes on; the header is added
            ],
        )
    assert [g[0] for g in got] == [200, 403, 200]
    assert b"POST /v1/chat on api.test" in got[1][1]
    assert w.api.requests == [
        f"GET /v1/models Bearer {REAL}".encode(),
        f"GET /v1/after Bearer {REAL}".encode(),
    ]  # the refused POST never reached it; both others carried the real header
    with w.h2_socket("other.test", w.other.port) as s:
        leak, fine = h2_requests(s, "other.test", [("GET", "/", bearer), ("GET", "/ok", [])])
    assert leak[0] == 403 and b"attempted credential leak" in leak[1] and fine[0] == 200
    assert w.other.requests == [b"GET /ok -"]  # the sentinel never left; the real value never went there
    text = w.log.read_text()
    assert REAL not in text and SENTINEL not in text
    recs = [json.loads(line) for line in text.splitlines() if '"event":"request"' in line]
    assert [(r["host"], r["path"], r["status"], r["leak"]) for r in recs] == [
        ("api.test", "/v1/models", 200, None),
        ("api.test", "/v1/chat", 403, None),
        ("api.test", "/v1/after", 200, None),
        ("other.test", "/", 403, "API_KEY"),
        ("other.test", "/ok", 200, None),
    ]


def read_response(f: Any) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length from a file over the socket: (status, body)."""
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, f.read(length)


def test_http1_keep_alive_over_inspected_tls_goes_on_after_a_refusal(world: World) -> None:
    w = world
    ctx = ssl.create_default_context(cadata=w.ca.cert)
    ctx.set_alpn_protocols(["http/1.1"])
    with ctx.wrap_socket(w.proxy.tunnel("api.test", w.api.port), server_hostname="api.test") as s:
        f = s.makefile("rb")
        got = []
        for method, path in [("GET", "/a"), ("POST", "/b"), ("GET", "/c")]:
            s.sendall(f"{method} {path} HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n\r\n".encode())
            got.append(read_response(f))  # the same TLS connection each time: a close would end this loop
    assert [g[0] for g in got] == [200, 403, 200] and got[0][1] == got[2][1] == b"upstream"
    assert [r.split(b"\r\n", 1)[0] for r in w.api.requests] == [b"GET /a HTTP/1.1", b"GET /c HTTP/1.1"]
    assert all(f"\r\nAuthorization: Bearer {REAL}\r\n".encode() in r for r in w.api.requests)  # added by the proxy


def test_a_host_header_naming_another_host_is_domain_fronting_and_refused(world: World) -> None:
    """CONNECT api.test with `Host: other.test` inside (both allowed and inspected): a CDN routing by the
    inner Host would serve other.test through api.test's door. Refused; the matching Host passes."""
    w = world
    ctx = ssl.create_default_context(cadata=w.ca.cert)
    ctx.set_alpn_protocols(["http/1.1"])
    with ctx.wrap_socket(w.proxy.tunnel("api.test", w.api.port), server_hostname="api.test") as s:
        f = s.makefile("rb")
        got = []
        for host in ("other.test", "API.test."):
            s.sendall(f"GET /x HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode())
            got.append(read_response(f))
    assert got[0][0] == 403 and b"domain fronting" in got[0][1] and got[1][0] == 200
    assert [r.split(b"\r\n", 1)[0] for r in w.api.requests] == [b"GET /x HTTP/1.1"]
    assert w.other.requests == []
    with w.h2_socket("api.test", w.api.port) as s:
        (fronted,) = h2_requests(s, "other.test", [("GET", "/h2", [])])  # :authority other.test
    assert fronted[0] == 403 and b"domain fronting" in fronted[1]
    assert len(w.api.requests) == 1 and w.other.requests == []
