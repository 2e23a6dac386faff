"""Canary hosts for sandgate's fake internet: one server process per (kind, address).

Started by launcher/world.py (the isolated fake internet used by `sandgate verify` and the e2e
tests) INSIDE its network namespace:

    ip netns exec NS python -m launcher.canary KIND --ip IP --port PORT --log LOGFILE [...]
    ip netns exec NS python -m launcher.canary unix|abstract --path PATH|NAME --log LOGFILE [...]

Every thing the server sees is appended to LOGFILE as one JSON line, written with a single
O_APPEND write() so readers never see interleaved records. That log is the canary evidence
used to prove a blocked action never reached its target (and a permitted one did), so we log
*before* answering: once a client has an answer, its record is on disk.

Kinds and records (every record also has "server" (--name) and "t" (unix time)):
  http/https  {"kind":"connect","peer","tls"}                    each accepted TCP connection
              {"kind":"tls","peer","sni","ok","error"}           https: each TLS handshake
              {"kind":"http"|"https","method","path","host","peer","body_len"(,"sni")}
  dns         {"kind":"dns","proto":"udp"|"tcp","qname","qtype","peer"} every query, even malformed;
              qname is the first question's, lower-cased. Parsed queries add "opcode", "qdcount",
              "questions" (every name as received, case kept), "records" (answer/authority/
              additional RRsets as text: UPDATE RRs, an additional TXT) and "edns_options"
              ([{"code","data"}], data latin-1); unparsable ones "error" and "data" (the bytes, latin-1)
  udp         {"kind":"udp","peer","data"}                        every datagram (echoed back)
  tcp         {"kind":"tcp","peer","data"}                        every connection ("tcp-canary\n" reply)
  unix        {"kind":"unix","address","data","pid","uid","gid"}  every connection ("unix-canary\n" reply)
  abstract    the same records ("kind":"unix"); address is "@NAME"

unix listens on the filesystem socket --path (mode 0666, so that a dropped-privilege client is
kept out only by the sandbox, never by file permissions; removed again on SIGTERM); abstract on
the abstract address NUL+NAME, which exists only in the network namespace the server runs in.
pid/uid/gid are the connecting process's SO_PEERCRED, as seen from the server's namespaces.

Prints "ready\n" on stdout once listening. Only stdlib + dnspython: certificates (--cert/--key)
are PEM files made by the caller (launcher/certs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import socketserver
import ssl
import stat
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import dns.rrset

CHUNK = 64 * 1024
DNS_TTL = 1  # short so tests that change a record (rebinding) are not defeated by caches
DATA_LIMIT = 100
RAW_LIMIT = 512  # dns: per record text, and of an unparsable message
IP_KINDS = ("http", "https", "dns", "udp", "tcp")
UNIX_KINDS = ("unix", "abstract")
KINDS = IP_KINDS + UNIX_KINDS


def fmt_peer(addr: Any) -> str:
    """ "ip:port" string; the tests compare peers as plain strings."""
    return f"{addr[0]}:{addr[1]}"


class JsonLog:
    """Append-only JSON-lines log; one write() per record so a crash leaves at most a partial last line."""

    def __init__(self, path: str, server: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.server = server
        self.lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        record = {**record, "server": self.server, "t": time.time()}
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)


# ---------------------------------------------------------------- http / https


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


# ---------------------------------------------------------------- dns


def dns_details(query: dns.message.Message) -> dict[str, Any]:
    """Everything in a query that could carry data besides the first name: the evidence for smuggling."""
    return {
        "opcode": dns.opcode.to_text(query.opcode()),
        "qdcount": len(query.question),
        "questions": [q.name.to_text(omit_final_dot=True) for q in query.question],  # case as received
        "records": [rrset.to_text()[:RAW_LIMIT] for section in query.sections[1:] for rrset in section],
        "edns_options": [
            {"code": int(opt.otype), "data": opt.to_wire().decode("latin-1")[:RAW_LIMIT]} for opt in query.options
        ],
    }


class DNSAnswerer:
    """Answers from a JSON {name: ipv4 | [ipv4...]} file re-read per query, so World.add_host needs no reload signal."""

    def __init__(self, records_path: str, log: JsonLog) -> None:
        self.records_path = records_path
        self.log = log
        self.records: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        try:
            self.records = json.loads(Path(self.records_path).read_text())
        except (OSError, ValueError):
            pass  # World replaces the file atomically; keep the last good copy if something odd happens
        return self.records

    def answer(self, wire: bytes, proto: str, peer: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception as exc:  # malformed packets are evidence too
            self.log.write(
                {
                    "kind": "dns",
                    "proto": proto,
                    "qname": None,
                    "qtype": None,
                    "peer": peer,
                    "error": f"{type(exc).__name__}: {exc}",
                    "data": wire[:RAW_LIMIT].decode("latin-1"),
                }
            )
            return None
        if not query.question:
            self.log.write(
                {"kind": "dns", "proto": proto, "qname": None, "qtype": None, "peer": peer, **dns_details(query)}
            )
            resp = dns.message.make_response(query)
            resp.set_rcode(dns.rcode.FORMERR)
            return resp.to_wire()
        q = query.question[0]
        qname = q.name.to_text(omit_final_dot=True).lower()
        self.log.write(
            {
                "kind": "dns",
                "proto": proto,
                "qname": qname,
                "qtype": dns.rdatatype.to_text(q.rdtype),
                "peer": peer,
                **dns_details(query),
            }
        )
        resp = dns.message.make_response(query)
        resp.flags |= dns.flags.AA
        value = self.load().get(qname)
        if value is None:
            resp.set_rcode(dns.rcode.NXDOMAIN)
        elif q.rdtype == dns.rdatatype.A:
            ips = [value] if isinstance(value, str) else list(value)
            resp.answer.append(dns.rrset.from_text(q.name, DNS_TTL, "IN", "A", *ips))
        elif q.rdtype == dns.rdatatype.TXT:
            resp.answer.append(dns.rrset.from_text(q.name, DNS_TTL, "IN", "TXT", '"canary"'))
        # any other type for a known name (AAAA included): NOERROR with an empty answer
        return resp.to_wire()


def serve_dns(ip: str, port: int, answerer: DNSAnswerer) -> list[socketserver.BaseServer]:
    """UDP and TCP on the same port, each in its own thread."""

    class UDPHandler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            reply = answerer.answer(data, "udp", fmt_peer(self.client_address))
            if reply is not None:
                sock.sendto(reply, self.client_address)

    class TCPHandler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            conn.settimeout(10)
            peer = fmt_peer(self.client_address)
            try:
                while True:
                    head = _recv_exact(conn, 2)
                    if head is None:
                        return
                    msg = _recv_exact(conn, int.from_bytes(head, "big"))
                    if msg is None:
                        return
                    reply = answerer.answer(msg, "tcp", peer)
                    if reply is None:
                        return
                    conn.sendall(len(reply).to_bytes(2, "big") + reply)
            except OSError:
                return

    class UDPServer(socketserver.ThreadingUDPServer):
        daemon_threads = True
        allow_reuse_address = True

    class TCPServer(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    servers: list[socketserver.BaseServer] = [UDPServer((ip, port), UDPHandler), TCPServer((ip, port), TCPHandler)]
    return servers


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            return None
        buf += got
    return buf


# ---------------------------------------------------------------- raw udp / tcp


def serve_udp(ip: str, port: int, log: JsonLog) -> socketserver.BaseServer:
    """Log every datagram and echo it, so a client can tell 'reached' from 'dropped'."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            log.write(
                {"kind": "udp", "peer": fmt_peer(self.client_address), "data": data[:DATA_LIMIT].decode("latin-1")}
            )
            sock.sendto(data, self.client_address)

    class Server(socketserver.ThreadingUDPServer):
        daemon_threads = True
        allow_reuse_address = True

    return Server((ip, port), Handler)


def serve_tcp(ip: str, port: int, log: JsonLog) -> socketserver.BaseServer:
    """Log each connection with the first bytes seen within 1 s, answer b"tcp-canary\\n", close cleanly."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            conn.settimeout(1.0)
            try:
                data = conn.recv(4096)
            except (TimeoutError, OSError):
                data = b""
            log.write(
                {"kind": "tcp", "peer": fmt_peer(self.client_address), "data": data[:DATA_LIMIT].decode("latin-1")}
            )
            _reply_and_drain(conn, b"tcp-canary\n")

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    return Server((ip, port), Handler)


# ---------------------------------------------------------------- unix / abstract


def _reply_and_drain(conn: socket.socket, reply: bytes) -> None:
    """Answer, then half-close and drain: closing with unread input sends RST (ECONNRESET on the
    client's read), which can destroy the reply in flight."""
    try:
        conn.sendall(reply)
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and conn.recv(4096):
            pass
    except (TimeoutError, OSError):
        pass


def unix_address(kind: str, path: str) -> str:
    """The socket address for a unix canary: the path, or NUL + name for the abstract namespace."""
    return "\0" + path if kind == "abstract" else path


def serve_unix(kind: str, path: str, log: JsonLog) -> socketserver.BaseServer:
    """Like serve_tcp on a unix stream socket: log each connection's first bytes, answer b"unix-canary\\n"."""
    shown = "@" + path if kind == "abstract" else path

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            try:
                pid, uid, gid = struct.unpack(
                    "iII", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
                )
            except OSError:
                pid = uid = gid = -1
            conn.settimeout(1.0)
            try:
                data = conn.recv(4096)
            except (TimeoutError, OSError):
                data = b""
            log.write(
                {
                    "kind": "unix",
                    "address": shown,
                    "data": data[:DATA_LIMIT].decode("latin-1"),
                    "pid": pid,
                    "uid": uid,
                    "gid": gid,
                }
            )
            _reply_and_drain(conn, b"unix-canary\n")

    class Server(socketserver.ThreadingUnixStreamServer):
        daemon_threads = True

    server = Server(unix_address(kind, path), Handler)
    if kind == "unix":
        os.chmod(path, 0o666)
    return server


def unlink_on_sigterm(path: str) -> None:
    """Remove our filesystem socket when the World stops us, then die of SIGTERM as before.

    Only if `path` is still the socket we bound (same inode): never someone else's file.
    """
    st = os.lstat(path)
    ident = (st.st_dev, st.st_ino)

    def handler(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):
            now = os.lstat(path)
            if stat.S_ISSOCK(now.st_mode) and (now.st_dev, now.st_ino) == ident:
                os.unlink(path)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


# ---------------------------------------------------------------- main


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when the World's process dies, so a `kill -9`'d run leaves no servers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # parent already gone before prctl took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.canary", description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--ip", help="listen address (all kinds but unix/abstract)")
    ap.add_argument("--port", type=int, help="listen port (all kinds but unix/abstract)")
    ap.add_argument("--path", help="unix: socket path; abstract: name (without the leading NUL)")
    ap.add_argument("--log", required=True)
    ap.add_argument("--name", default="")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--records")
    ap.add_argument("--parent-pid", type=int)
    args = ap.parse_args(argv)

    if args.kind in UNIX_KINDS:
        if not args.path or "\0" in args.path:
            ap.error(f"{args.kind} needs --path (without NUL bytes)")
        if args.kind == "unix" and not os.path.isabs(args.path):
            ap.error("unix needs an absolute --path")
    elif args.ip is None or args.port is None:
        ap.error(f"{args.kind} needs --ip and --port")

    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.kind in UNIX_KINDS:
        name = args.name or ("@" + args.path if args.kind == "abstract" else args.path)
    else:
        name = args.name or args.ip
    log = JsonLog(args.log, name)
    servers: list[socketserver.BaseServer]
    if args.kind in UNIX_KINDS:
        servers = [serve_unix(args.kind, args.path, log)]
        if args.kind == "unix":
            unlink_on_sigterm(args.path)
    elif args.kind in ("http", "https"):
        ctx = None
        if args.kind == "https":
            if not (args.cert and args.key):
                ap.error("https needs --cert and --key")
            ctx = make_tls_context(args.cert, args.key)
        servers = [FakeHTTPServer((args.ip, args.port), log, name, ctx)]
    elif args.kind == "dns":
        if not args.records:
            ap.error("dns needs --records")
        servers = serve_dns(args.ip, args.port, DNSAnswerer(args.records, log))
    elif args.kind == "udp":
        servers = [serve_udp(args.ip, args.port, log)]
    else:
        servers = [serve_tcp(args.ip, args.port, log)]

    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    threading.Event().wait()  # until SIGTERM/SIGKILL from the World
    return 0


if __name__ == "__main__":
    sys.exit(main())
