"""The raw canaries: UDP (echo), TCP and unix/abstract stream sockets (log the first bytes, answer)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import stat
import struct
import time
from typing import Any

from selftest.canary.log import DATA_LIMIT, JsonLog, fmt_peer


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
