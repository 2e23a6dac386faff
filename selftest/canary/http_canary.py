"""The http and https canaries: log every connection, handshake and request, then say hello."""

from __future__ import annotations

import socketserver
import ssl
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from selftest.canary.log import JsonLog, fmt_peer

CHUNK = 64 * 1024


class FakeHTTPServer(ThreadingHTTPServer):
    """Threaded HTTP/1.1 server; TLS (if any) is done per connection in the worker thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], log: JsonLog, name: str, ctx: ssl.SSLContext | None) -> None:
        self.log = log
        self.name = name
        self.ctx = ctx
        super().__init__(addr, HTTPHandler)

    def server_bind(self) -> None:
        """Skip HTTPServer's socket.getfqdn(): its PTR lookup would pollute the fake DNS's canary log."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up mid-stream (e.g. /big aborted by a proxy) are normal here, not errors."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError, OSError)):
            return
        super().handle_error(request, client_address)


class HTTPHandler(BaseHTTPRequestHandler):
    """Routes: /big?bytes=N streams N bytes of b"x"; /echo-host returns Host; anything else says hello."""

    protocol_version = "HTTP/1.1"
    server: FakeHTTPServer
    sni: str | None = None

    def setup(self) -> None:
        srv = self.server
        peer = fmt_peer(self.client_address)
        srv.log.write({"kind": "connect", "peer": peer, "tls": srv.ctx is not None})
        if srv.ctx is not None:
            # Handshake here (worker thread), not in accept(), so one stalled client cannot block the server.
            tls = srv.ctx.wrap_socket(self.request, server_side=True, do_handshake_on_connect=False)
            tls.settimeout(10)
            try:
                tls.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                srv.log.write(
                    {
                        "kind": "tls",
                        "peer": peer,
                        "sni": getattr(tls, "sandgate_sni", None),
                        "ok": False,
                        "error": str(exc),
                    }
                )
                raise
            tls.settimeout(None)
            self.sni = getattr(tls, "sandgate_sni", None)
            srv.log.write({"kind": "tls", "peer": peer, "sni": self.sni, "ok": True, "error": None})
            self.request = tls
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log; the JSON log is the record."""

    def handle_any(self) -> None:
        srv = self.server
        body_len = self._drain_body()
        record: dict[str, Any] = {
            "kind": "https" if srv.ctx is not None else "http",
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host"),
            "peer": fmt_peer(self.client_address),
            "body_len": body_len,
        }
        if srv.ctx is not None:
            record["sni"] = self.sni
        srv.log.write(record)

        if self.command == "CONNECT":
            self._reply(405, b"CONNECT not supported by fake host\n")
            self.close_connection = True
            return
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/big":
            try:
                size = int(urllib.parse.parse_qs(url.query).get("bytes", ["0"])[0])
            except ValueError:
                size = -1
            if size < 0:
                self._reply(400, b"bad bytes\n")
                return
            self._stream(size)
        elif url.path == "/echo-host":
            self._reply(200, (self.headers.get("Host") or "").encode())
        else:
            self._reply(200, f"hello from {srv.name}\n".encode())

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_CONNECT = handle_any

    def _drain_body(self) -> int:
        """Read and discard a Content-Length body so keep-alive stays in sync; chunked bodies close the connection."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return -1
        try:
            left = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return -1
        total = left
        while left > 0:
            got = self.rfile.read(min(left, CHUNK))
            if not got:
                break
            left -= len(got)
        return total - left

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _stream(self, size: int) -> None:
        """Stream without building `size` bytes in memory (sizes up to 1 GB are used for limit tests)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if self.command == "HEAD":
            return
        chunk = b"x" * CHUNK
        left = size
        while left > 0:
            n = min(left, CHUNK)
            self.wfile.write(chunk if n == CHUNK else chunk[:n])
            left -= n


def make_tls_context(cert: str, key: str) -> ssl.SSLContext:
    """Server context that records the client's SNI on the SSLSocket (the callback gets the socket)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def remember_sni(sock: Any, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        sock.sandgate_sni = server_name

    ctx.sni_callback = remember_sni
    return ctx
