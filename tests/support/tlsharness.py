"""A real inspecting proxy on loopback for the tests of TLS inspection (tests/e2e/test_tlsinspect.py and
the unit tests of bodies, keep-alive and the front door): the per-run CA, TLS upstreams that record what
they got, make_master's proxy on a thread, and HTTP/1.1 and h2 clients. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl
import threading
from pathlib import Path

import dns.message
import dns.rdatatype
import dns.rrset
import h2.config
import h2.connection
import h2.events
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mitmproxy import http

from netguard.daemon.master import make_master
from netguard.decision.binding import Binding
from netguard.spec import CaPair
from selftest.certs import CA


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
    """A TLS server on 127.0.0.1 speaking HTTP/1.1, and h2 when `alpn` offers it (no ALPN at all when empty);
    records each request head. One request per connection (`Connection: close`) unless `keep_alive`.
    Subclasses change what is answered (`respond`) or recorded of an h2 request (`h2_record`)."""

    def __init__(
        self,
        tmp: Path,
        ca: CA,
        *names: str,
        alpn: tuple[str, ...] = ("http/1.1",),
        keep_alive: bool = False,
        timeout: float = 5,
    ) -> None:
        leaf = ca.issue(*names)
        chain, key = leaf.write(tmp / f"{names[0]}.pem", tmp / f"{names[0]}.key")
        self.der = x509.load_pem_x509_certificate(leaf.cert_pem).public_bytes(serialization.Encoding.DER)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(chain, key)
        if alpn:
            self.ctx.set_alpn_protocols(list(alpn))
        self.keep_alive, self.timeout = keep_alive, timeout
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
        raw.settimeout(self.timeout)
        self.handshakes += 1
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as s:
                if s.selected_alpn_protocol() == "h2":
                    return self._h2(s)
                f = s.makefile("rb")
                while True:
                    head = b""
                    while (line := f.readline()) not in (b"\r\n", b""):
                        head += line
                    if not line:
                        return  # the client (the proxy) closed the connection
                    self.requests.append(head)
                    self.respond(s, head)
                    if not self.keep_alive:
                        return
        except (OSError, ssl.SSLError):
            return

    def respond(self, s: ssl.SSLSocket, head: bytes) -> None:
        close = b"" if self.keep_alive else b"Connection: close\r\n"
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n" + close + b"\r\nupstream")

    def h2_record(self, headers: dict[bytes, bytes]) -> bytes:
        return b"h2 %s %s %s" % (headers[b":method"], headers[b":path"], headers[b":authority"])

    def _h2(self, s: ssl.SSLSocket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        s.sendall(conn.data_to_send())
        while data := s.recv(65536):
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    self.requests.append(self.h2_record({bytes(k): bytes(v) for k, v in ev.headers or []}))
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
