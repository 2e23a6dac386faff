"""A fake HTTP/1.1 origin for the unit tests: raw bytes in, scripted answers out, keep-alive like a real one.

Each request (head, then a Content-Length body) is recorded as the bytes the server got. The answer is
chosen by the request path, and written as a real server writes it: the head, then the body in a
separate write. A connection stays open for the next request unless a side said `close` or the answer
is delimited by the close.
"""

from __future__ import annotations

import socket
import threading

from .tcpfake import serve_in_threads

BODY = b"hello, world\n"
BIG = bytes(range(256)) * 2048  # 512 KiB: past the front door's small-body path

#: path -> (head, body chunks, then close): what the origin answers
ANSWERS: dict[str, tuple[bytes, tuple[bytes, ...], bool]] = {
    "/len": (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY), (BODY,), False),
    "/big": (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG), (BIG[:1000], BIG[1000:]), False),
    "/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        (b"5\r\nhello\r\n", b"7;ext=1\r\n, world\r\n", b"0\r\nX-Trailer: t\r\n\r\n"),
        False,
    ),
    "/close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", (b"until ", b"the end"), True),
    "/empty": (b"HTTP/1.1 204 No Content\r\n\r\n", (), False),
    "/early": (b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n", (), False),
    "/missing": (b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\n", (b"nope",), False),
    "/bad": (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", (b"abcd",), True),
}


class HttpOrigin:
    """An HTTP/1.1 server on 127.0.0.1 answering ANSWERS by path; `got` holds each request's bytes in order."""

    def __init__(self, wait: float = 5.0) -> None:
        self.wait = wait  # seconds a connection waits for bytes (a body that never comes)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.got: list[bytes] = []
        self.conns = 0
        self._lock = threading.Lock()
        serve_in_threads(self.sock, self._serve)

    def close(self) -> None:
        self.sock.close()

    def _serve(self, c: socket.socket) -> None:
        with self._lock:
            self.conns += 1
        c.settimeout(self.wait)
        buf = b""
        with c:
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = c.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    n = _length(head)
                    while len(buf) < n:
                        data = c.recv(65536)
                        if not data:
                            return
                        buf += data
                    body, buf = buf[:n], buf[n:]
                    with self._lock:
                        self.got.append(head + b"\r\n\r\n" + body)
                    if not self._answer(c, head):
                        return
            except OSError:
                return

    def _answer(self, c: socket.socket, head: bytes) -> bool:
        """Write the answer; False when the connection ends with it."""
        line = head.split(b"\r\n", 1)[0].split(b" ")
        method, path = line[0], line[1].decode()
        if path.startswith("http://"):
            path = "/" + path.split("/", 3)[3]
        rhead, chunks, close = ANSWERS.get(path.split("?")[0], ANSWERS["/missing"])
        if path.startswith("/early"):
            c.sendall(rhead)
            rhead, chunks, close = ANSWERS["/len"]
        c.sendall(rhead)
        if method != b"HEAD":
            for chunk in chunks:
                c.sendall(chunk)
        if close or b"connection: close" in head.lower():
            c.shutdown(socket.SHUT_WR)
            return False
        return True


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0
