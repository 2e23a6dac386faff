"""A fake HTTPS/1.1 origin for the unit tests of inspected TLS: keep-alive, heads and bodies written apart.

The TLS variant of tests/support/httpfake.py, with what an inspected path must also carry: request
bodies (a length or chunks, decoded), `Expect: 100-continue` (answered `100 Continue` before the body
is read, as real servers do), and a WebSocket upgrade (`/ws...` with `Upgrade: websocket`: a 101, then
every frame echoed). Its certificate comes from its own throwaway CA (`ca_pem`): a proxy verifies it
only when given that CA as an extra root. Each request is recorded as its head plus its decoded body.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import ssl
import tempfile
from pathlib import Path

from selftest.certs import CA

from .httpfake import HttpOrigin

BODY = b"hello, world\n"
NAMES = ("insp.test", "other.test")  # other.test: a name a fronting request asks for, on the same server
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

#: path -> (head, body pieces, then close): what the origin answers
ANSWERS: dict[str, tuple[bytes, tuple[bytes, ...], bool]] = {
    "/len": (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY), (BODY,), False),
    "/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        (b"5\r\nhello\r\n", b"8\r\n, world\n\r\n", b"0\r\n\r\n"),
        False,
    ),
    "/close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", (b"until ", b"the end"), True),
    "/empty": (b"HTTP/1.1 204 No Content\r\n\r\n", (), False),
    # a 304 names the length of the body it does not send: a proxy waiting for those bytes hangs
    "/same": (b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 13\r\n\r\n', (), False),
    "/missing": (b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\n", (b"nope",), False),
}


class HttpsOrigin(HttpOrigin):
    """An HTTPS/1.1 server on 127.0.0.1 for NAMES; `got` holds each request (head + decoded body) in order.
    httpfake.HttpOrigin's listener and bookkeeping; its own TLS and request loop (`_serve`)."""

    def __init__(self, wait: float = 5.0) -> None:
        self.ca = CA("sandgate test origin CA")
        self.ca_pem = self.ca.cert_pem.decode()
        self.trusted = _context(self.ca)
        self.untrusted = _context(CA("sandgate test impostor CA"))  # the same names from a CA nobody trusts
        self.ctx = self.trusted
        super().__init__(wait)  # starts serving: everything _serve reads is set above

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(self.wait)
        try:
            c = self.ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()  # a client that did not trust us (the verify-failure test): no request was read
            return
        with self._lock:
            self.conns += 1
        with c, contextlib.suppress(OSError, ValueError):
            _Conn(c, self).serve()


def _context(ca: CA) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="sandgate-origin-") as d:
        ctx.load_cert_chain(*ca.issue(*NAMES).write(Path(d) / "leaf.pem", Path(d) / "leaf.key"))
    return ctx


class _Conn:
    """One TLS connection of the origin: requests in turn until a side closes."""

    def __init__(self, c: ssl.SSLSocket, origin: HttpsOrigin) -> None:
        self.c, self.origin, self.buf = c, origin, b""

    def _more(self) -> None:
        data = self.c.recv(65536)
        if not data:
            raise ValueError("closed")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def serve(self) -> None:
        while True:
            while b"\r\n\r\n" not in self.buf:
                self._more()
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            low = head.lower()
            if b"\r\nexpect: 100-continue" in low:
                self.c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self._chunks() if b"\r\ntransfer-encoding: chunked" in low else self._take(_length(low))
            with self.origin._lock:
                self.origin.got.append(head + b"\r\n\r\n" + body)
            if not self._answer(head, body):
                return

    def _chunks(self) -> bytes:
        body = b""
        while size := int(self._line().split(b";")[0], 16):
            body += self._take(size)
            self._take(2)
        while self._line():  # trailer fields, then the empty line
            pass
        return body

    def _answer(self, head: bytes, body: bytes) -> bool:
        """Write the answer; False when the connection ends with it."""
        method, target = head.split(b"\r\n", 1)[0].split(b" ")[:2]
        path = target.decode().split("?")[0]
        key = _field(head, b"sec-websocket-key")
        if path.startswith("/ws") and key is not None:
            accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
            self.c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           b"Sec-WebSocket-Accept: %s\r\n\r\n" % accept)  # fmt: skip
            self._echo_frames()
            return False
        pieces: tuple[bytes, ...]
        if path.startswith("/id/") or path == "/echo":  # an answer only this request can get
            data = target if path.startswith("/id/") else body
            rhead, pieces, close = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data), (data,), False
        else:
            rhead, pieces, close = ANSWERS.get(path, ANSWERS["/missing"])
        self.c.sendall(rhead)
        if method != b"HEAD":
            for piece in pieces:
                self.c.sendall(piece)
        if close or b"\r\nconnection: close" in head.lower():
            self._close()
            return False
        return True

    def _echo_frames(self) -> None:
        """Each (masked) frame from the client, echoed unmasked with `echo:` before its payload."""
        while True:
            b0, b1 = self._take(2)
            mask = self._take(4) if b1 & 0x80 else b"\0\0\0\0"
            payload = bytes(x ^ mask[i % 4] for i, x in enumerate(self._take(b1 & 0x7F)))
            if b0 & 0x0F == 8:  # close
                self.c.sendall(frame(b"", opcode=8, masked=False))
                return
            self.c.sendall(frame(b"echo:" + payload, masked=False))

    def _close(self) -> None:
        """close_notify (without waiting for the peer's), then the TCP close: what real servers send."""
        self.c.setblocking(False)
        with contextlib.suppress(ssl.SSLError, OSError):
            self.c.unwrap()
        self.c.setblocking(True)
        with contextlib.suppress(OSError):
            self.c.shutdown(socket.SHUT_WR)


def frame(payload: bytes, opcode: int = 1, masked: bool = True) -> bytes:
    """One final WebSocket frame (payload under 126 bytes); masked as a client's must be."""
    assert len(payload) < 126
    if not masked:
        return bytes([0x80 | opcode, len(payload)]) + payload
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(x ^ mask[i % 4] for i, x in enumerate(payload))


def unframe(data: bytes) -> list[bytes]:
    """The payloads of the unmasked frames (under 126 bytes each) in `data`."""
    out = []
    while len(data) >= 2 and len(data) >= 2 + (data[1] & 0x7F):
        n = data[1] & 0x7F
        out.append(data[2 : 2 + n])
        data = data[2 + n :]
    return out


def _field(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        n, _, v = line.partition(b":")
        if n.strip().lower() == name:
            return v.strip()
    return None


def _length(low_head: bytes) -> int:
    v = _field(low_head, b"content-length")
    return int(v) if v is not None else 0
