"""TLS inspection through a real proxy (make_master: Proxyserver, TlsInspect, Gate) on 127.0.0.1.

Fake upstreams are TLS servers on loopback with certificates from selftest.certs; the
proxy's per-run CA is a separate one (both from tests/support/tlsharness.py, shared with unit tests). A fake DNS answers 127.0.0.1 for every name and
a cidr allow for 127.0.0.0/8 on the upstream ports lets the loopback veto pass them. The clients
are Python's ssl (HTTP/1.1) and h2 (HTTP/2) through CONNECT; what the upstream saw is the judge.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers.tls import ServerTLSLayer
from mitmproxy.test import taddons

from netguard import rules
from netguard.audit import AuditLog
from netguard.decision import layers
from netguard.decision.binding import Binding
from netguard.decision.gate import Gate
from netguard.policy import parse_network
from selftest.certs import CA

from ..support.dnsfake import FakeDns
from ..support.mitmhooks import client, client_hello, next_layer
from ..support.tlsharness import Proxy, Upstream, get_h2, get_http1, loopback, run_ca


class World:
    def __init__(self, tmp: Path) -> None:
        self.dns = FakeDns(loopback)
        self.upstream_ca, self.other_ca = CA("upstream CA"), CA("untrusted CA")
        self.good = Upstream(tmp, self.upstream_ca, "in.test", "plain.test")
        self.badca = Upstream(tmp, self.other_ca, "badca.test")
        self.wrong = Upstream(tmp, self.upstream_ca, "other.test")
        self.h2 = Upstream(tmp, self.upstream_ca, "h2.test", alpn=("h2", "http/1.1"))
        ports = [self.good.port, self.badca.port, self.wrong.port, self.h2.port]
        pol = parse_network(
            {
                "allow": [
                    {"host": "in.test", "inspect": True, "ports": [self.good.port]},
                    {"host": "plain.test", "ports": [self.good.port]},
                    {"host": "badca.test", "inspect": True, "ports": [self.badca.port]},
                    {"host": "wrong.test", "inspect": True, "ports": [self.wrong.port]},
                    {"host": "h2.test", "inspect": True, "ports": [self.h2.port]},
                    {"cidr": "127.0.0.0/8", "ports": ports},
                ],
                "resolver": f"127.0.0.1:{self.dns.port}",
            },
            "p.yaml",
        )
        self.ca = run_ca()
        self.binding = Binding(
            "t1",
            rules.compile_policy(pol),
            AuditLog(tmp / "audit.jsonl"),
            ca=self.ca,
            upstream_ca=self.upstream_ca.cert_pem.decode(),
        )
        self.proxy = Proxy(self.binding)

    def trusting(self, pem: str | bytes, alpn: list[str] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=pem.decode() if isinstance(pem, bytes) else pem)
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx

    def close(self) -> None:
        self.proxy.close()
        for u in (self.good, self.badca, self.wrong, self.h2):
            u.close()
        self.dns.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_an_inspected_host_is_served_by_the_run_ca_over_http1_and_http2(world: World) -> None:
    w = world
    # h2 first: once this upstream answered HTTP/1.1, a client offering both gets HTTP/1.1 (test_tlsbody.py)
    ctx = w.trusting(w.ca.cert, ["h2", "http/1.1"])
    with ctx.wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="in.test") as s:
        assert s.selected_alpn_protocol() == "h2"  # the client speaks h2 to the proxy ...
        assert get_h2(s, "in.test", "/one") == (200, b"upstream")
    with w.trusting(w.ca.cert).wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="in.test") as s:
        leaf = x509.load_der_x509_certificate(s.getpeercert(binary_form=True) or b"")
        assert leaf.issuer.rfc4514_string() == "CN=sandgate run CA (test)"
        assert get_http1(s, "in.test", "/two").endswith(b"upstream")
    heads = [h.split(b"\r\n", 1)[0] for h in w.good.requests]
    assert heads == [b"GET /one HTTP/1.1", b"GET /two HTTP/1.1"]  # ... and the http/1.1-only upstream got both
    assert all(b"\r\nhost: in.test" in h.lower() for h in w.good.requests)


def test_an_h2_upstream_serves_h2_and_http1_clients(world: World) -> None:
    w = world
    ctx = w.trusting(w.ca.cert, ["h2", "http/1.1"])
    with ctx.wrap_socket(w.proxy.tunnel("h2.test", w.h2.port), server_hostname="h2.test") as s:
        assert get_h2(s, "h2.test", "/a") == (200, b"upstream")
    with w.trusting(w.ca.cert).wrap_socket(w.proxy.tunnel("h2.test", w.h2.port), server_hostname="h2.test") as s:
        reply = get_http1(s, "h2.test", "/b")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"upstream")
    # h2 end to end for the h2 client; the ALPN-less HTTP/1.1 client is kept on HTTP/1.1 upstream too
    assert w.h2.requests[0] == b"h2 GET /a h2.test"
    assert w.h2.requests[1].startswith(b"GET /b HTTP/1.1")


def test_interception_is_real_and_only_for_inspected_hosts(world: World) -> None:
    w = world
    only_upstream = w.trusting(w.upstream_ca.cert_pem)
    with pytest.raises(ssl.SSLCertVerificationError):  # the proxy's leaf, not the upstream's certificate
        only_upstream.wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="in.test")
    with only_upstream.wrap_socket(w.proxy.tunnel("plain.test", w.good.port), server_hostname="plain.test") as s:
        seen = s.getpeercert(binary_form=True) or b""
        assert hashlib.sha256(seen).digest() == hashlib.sha256(w.good.der).digest()  # passthrough: unchanged
        assert get_http1(s, "plain.test").endswith(b"upstream")
    assert len(w.good.requests) == 1


@pytest.mark.parametrize("host", ["badca.test", "Wrong.Test"])
def test_an_unverifiable_upstream_is_refused_with_the_reason(world: World, host: str) -> None:
    w = world
    up = w.badca if host == "badca.test" else w.wrong
    with w.trusting(w.ca.cert).wrap_socket(w.proxy.tunnel(host, up.port), server_hostname=host) as s:
        reply = get_http1(s, host)
    assert reply.startswith(b"HTTP/1.1 502"), reply
    assert up.handshakes >= 1 and up.requests == []  # the upstream was contacted but never got the request
    (msg,) = w.proxy.errors.msgs
    assert msg.startswith(f"sandgate: upstream certificate verify failed for {host.lower()}:{up.port}"), msg
    assert ("hostname mismatch" if up is w.wrong else "unable to get local issuer certificate") in msg


def test_a_connect_to_an_inspected_host_takes_the_connect_name_not_the_sni(world: World) -> None:
    w = world
    with w.trusting(w.ca.cert).wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="in.test") as s:
        pass
    ctx = w.trusting(w.ca.cert)
    ctx.check_hostname = False  # look at what the leaf names, whatever SNI was sent
    with ctx.wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="evil.test") as s:
        leaf = x509.load_der_x509_certificate(s.getpeercert(binary_form=True) or b"")
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == ["in.test"]
        assert get_http1(s, "in.test").endswith(b"upstream")
    assert len(w.good.requests) == 1


def test_plain_bytes_in_an_inspected_tunnel_are_refused_and_http_is_parsed(world: World) -> None:
    w = world
    with w.proxy.tunnel("in.test", w.good.port) as s:
        s.sendall(b"\x00\x01binary")
        assert s.recv(100) == b""  # closed, not relayed
    assert w.good.handshakes == 0  # no upstream connection was made for it
    with w.proxy.tunnel("in.test", w.good.port) as s:
        s.sendall(b"GET /p HTTP/1.1\r\nHost: in.test\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 502")  # parsed as HTTP: plain HTTP to a TLS upstream fails there
    assert w.good.requests == []


def test_decrypted_bytes_that_are_not_http_are_refused(world: World) -> None:
    w = world
    with w.trusting(w.ca.cert).wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="in.test") as s:
        s.sendall(b"\x00\x01 not http\r\n")
        assert s.recv(100) == b""  # closed by the proxy
    assert w.good.handshakes == 0
    with w.trusting(w.ca.cert).wrap_socket(w.proxy.tunnel("in.test", w.good.port), server_hostname="in.test") as s:
        assert get_http1(s, "in.test").endswith(b"upstream")  # the same tunnel with HTTP passes


# ---- transparent detection (no sockets) ------------------------------------------------------------


def hello_without_sni() -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO())
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def test_transparent_tls_is_intercepted_only_for_inspected_names(tmp_path: Path) -> None:
    pol = parse_network({"allow": [{"host": "in.test", "inspect": True}, "plain.test"]}, "p.yaml")
    binding = Binding("t", rules.compile_policy(pol), AuditLog(tmp_path / "a.jsonl"), ca=run_ca())
    gate = Gate({3129: binding})
    c = client("transparent@127.0.0.1:3129")

    async def main() -> None:
        with taddons.context(gate, loadcore=False) as tctx:  # type: ignore[no-untyped-call]  # mitmproxy
            nl, ctx = next_layer(tctx, c, ("198.51.100.9", 443), client_hello("In.Test"))
            await tctx.master.addons.invoke_addon(gate, layer.NextLayerHook(nl))
            assert isinstance(nl.layer, ServerTLSLayer) and ctx.server.sni == "in.test"
            for hello in (client_hello("plain.test"), hello_without_sni()):
                nl, ctx = next_layer(tctx, c, ("198.51.100.9", 443), hello)
                await tctx.master.addons.invoke_addon(gate, layer.NextLayerHook(nl))
                assert isinstance(nl.layer, layers.Relay)

    asyncio.run(main())
