"""The inspected upstreams' canaries: HTTPS servers that record each request in full, headers included.

Issue 13's probes are judged by what an inspected upstream received: whether a refused request
reached it at all, and whether the bound host got the real credential in its header while the
sandbox held only a sentinel. So, unlike the http canary, these record every header and the
start of the body, and they never echo a header back: a reply carrying the injected secret would
hand it to the sandbox.

Kinds:
  upstream  answers every request with "hello from NAME" (status 200)
  git       git smart HTTP: every request goes to the real `git http-backend` CGI over the
            repositories under --git-root (receive-pack enabled per repository by its config)

Records (besides connect/tls as the http canary writes them):
  {"kind": "request", "method", "path", "host", "sni", "peer", "headers": {lower-case name: value},
   "body_len", "body" (the first BODY_KEEP bytes, non-ASCII as \\x escapes)}
"""

from __future__ import annotations

import os
import ssl
import subprocess
from typing import Any

from selftest.canary.http_canary import FakeHTTPServer, HTTPHandler
from selftest.canary.log import JsonLog, fmt_peer

BODY_KEEP = 512
BODY_LIMIT = 16 << 20  # a request body this canary reads at most: pushes of a one-commit repository are tiny
CGI_TIMEOUT = 30.0


class UpstreamServer(FakeHTTPServer):
    """The https canary's server, with a git root when it serves `git http-backend`."""

    def __init__(
        self, addr: tuple[str, int], log: JsonLog, name: str, ctx: ssl.SSLContext, git_root: str | None
    ) -> None:
        self.git_root = git_root
        super().__init__(addr, log, name, ctx)
        self.RequestHandlerClass = UpstreamHandler


class UpstreamHandler(HTTPHandler):
    """Reads the whole body, records the request with its headers (before answering), then answers."""

    server: UpstreamServer

    def handle_any(self) -> None:
        body = self._read_body()
        self.server.log.write(
            {
                "kind": "request",
                "method": self.command,
                "path": self.path,
                "host": self.headers.get("Host"),
                "sni": self.sni,
                "peer": fmt_peer(self.client_address),
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body_len": len(body),
                "body": body[:BODY_KEEP].decode("ascii", "backslashreplace"),
            }
        )
        if self.server.git_root is not None and self.command != "CONNECT":
            self._git(body)
        else:
            self._reply(200, f"hello from {self.server.name}\n".encode())

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_CONNECT = handle_any

    def _read_body(self) -> bytes:
        """The request body, Content-Length or chunked (git sends large packs chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return b""
        return self.rfile.read(min(max(length, 0), BODY_LIMIT))

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while len(out) < BODY_LIMIT:
            size_line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            size = int(size_line or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers, up to the blank line
                    pass
                break
            out += self.rfile.read(size)
            self.rfile.readline(8)  # the CRLF after each chunk
        return bytes(out)

    def _git(self, body: bytes) -> None:
        """One request through `git http-backend` (the CGI git itself ships): the real protocol, pushes included."""
        path, _, query = self.path.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.server.git_root),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_PROJECT_ROOT": str(self.server.git_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type") or "",
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "SERVER_PROTOCOL": "HTTP/1.1",
            # the repositories belong to whoever built the world: serve them whoever runs this canary
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
        }
        for header, var in (("Content-Encoding", "HTTP_CONTENT_ENCODING"), ("Git-Protocol", "GIT_PROTOCOL")):
            if self.headers.get(header):
                env[var] = str(self.headers.get(header))
        try:
            r = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=CGI_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            self._reply(500, f"git http-backend failed: {e}\n".encode())
            return
        self._cgi_reply(r.stdout)

    def _cgi_reply(self, out: bytes) -> None:
        """Turn the CGI's output (headers, blank line, body) into the HTTP response."""
        head, sep, body = out.partition(b"\r\n\r\n")
        if not sep:
            head, _, body = out.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name.strip(), value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def serve_upstream(ip: str, port: int, log: JsonLog, name: str, ctx: ssl.SSLContext, git_root: Any) -> UpstreamServer:
    """An upstream or git canary on ip:port (TLS with --cert/--key)."""
    return UpstreamServer((ip, port), log, name, ctx, git_root)
