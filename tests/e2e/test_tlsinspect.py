"""TLS inspection through a real proxy (make_master: Proxyserver, TlsInspect, Gate) on 127.0.0.1.

Fake upstreams are TLS servers on loopback with certificates from selftest.certs; the
proxy's per-run CA is a separate one made here. A fake DNS answers 127.0.0.1 for every name and
a cidr allow for 127.0.0.0/8 on the upstream ports lets the loopback veto pass them. The clients
are Python's ssl (HTTP/1.1) and h2 (HTTP/2) through CONNECT; what the upstream saw is the judge.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rdatatype
import dns.rrset
import h2.config
import h2.connection
import h2.events
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mitmproxy import http
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers.tls import ServerTLSLayer
from mitmproxy.test import taddons

from netguard import rules
from netguard.audit import AuditLog
from netguard.daemon.master import make_master
from netguard.decision import layers
from netguard.decision.binding import Binding
from netguard.decision.gate import Gate
from netguard.policy import parse_network
from netguard.spec import CaPair
from selftest.certs import CA

from ..support.dnsfake import FakeDns
from ..unit.test_gate import client, client_hello, next_layer


def run_ca() -> CaPair:
    """A per-run inspection CA as the launcher makes one: EC P-256, basicConstraints CA, in memory."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandgate run CA (test)")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return CaPair(cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode())


def loopback(q: dns.message.Message, proto: str) -> dns.message.Message:
    r = dns.message.make_response(q)
    if q.question[0].rdtype == dns.rdatatype.A:
        r.answer.append(dns.rrset.from_text(q.question[0].name, 60, "IN", "A", "127.0.0.1"))
    return r


class Upstream:
    """A TLS server on 127.0.0.1 speaking HTTP/1.1, and h2 when `alpn` offers it; records each request head."""

    def __init__(self, tmp: Path, ca: CA, *names: str, alpn: tuple[str, ...] = ("http/1.1",)) -> None:
        leaf = ca.issue(*names)
        chain, key = leaf.write(tmp / f"{names[0]}.pem", tmp / f"{names[0]}.key")
        self.der = x509.load_pem_x509_certificate(leaf.cert_pem).public_bytes(serialization.Encoding.DER)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(chain, key)
        self.ctx.set_alpn_protocols(list(alpn))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.handshakes = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(raw,), daemon=True).start()

    def _one(self, raw: socket.socket) -> None:
        raw.settimeout(5)
        self.handshakes += 1
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as s:
                if s.selected_alpn_protocol() == "h2":
                    return self._h2(s)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = s.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self.requests.append(head)
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nupstream")
        except (OSError, ssl.SSLError):
            return

    def _h2(self, s: ssl.SSLSocket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        s.sendall(conn.data_to_send())
        while data := s.recv(65536):
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    hdrs = dict((bytes(k), bytes(v)) for k, v in ev.headers or [])
                    self.requests.append(b"h2 %s %s %s" % (hdrs[b":method"], hdrs[b":path"], hdrs[b":authority"]))
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", "8")])
                    conn.send_data(ev.stream_id, b"upstream", end_stream=True)
            s.sendall(conn.data_to_send())

    def close(self) -> None:
        self.sock.close()


class Errors:
    """A test addon after the Gate: the flow error message every addon saw last."""

    def __init__(self) -> None:
        self.msgs: list[str] = []

    def error(self, flow: http.HTTPFlow) -> None:
        assert flow.error is not None
        self.msgs.append(flow.error.msg)


class Proxy:
    """make_master's proxy on a thread with its own event loop, one regular listener."""

    def __init__(self, binding: Binding) -> None:
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.errors = Errors()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(binding),))
        self._thread.start()
        assert self._ready.wait(10), "proxy did not start"

    async def _main(self, binding: Binding) -> None:
        master, proxyserver, _ = make_master({self.port: binding}, [f"regular@127.0.0.1:{self.port}"])
        master.addons.add(self.errors)  # type: ignore[no-untyped-call]
        self._stop = asyncio.Event()
        assert await proxyserver.setup_servers()
        await master.running()
        self._ready.set()
        await self._stop.wait()
        master.should_exit.set()
        await proxyserver.servers.update([])
        await master.done()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def tunnel(self, host: str, port: int) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        return s


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


def get_http1(s: ssl.SSLSocket, host: str, path: str = "/x") -> bytes:
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def get_h2(s: ssl.SSLSocket, host: str, path: str) -> tuple[int, bytes]:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":path", path), (":scheme", "https"), (":authority", host)], True)
    s.sendall(conn.data_to_send())
    status, body = 0, b""
    while True:
        data = s.recv(65536)
        assert data, "connection closed before the response ended"
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.DataReceived):
                body += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                return status, body
        s.sendall(conn.data_to_send())


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
