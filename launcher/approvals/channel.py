"""The broker's two unix socket servers: the daemon's questions, and an embedding tool's answers.

Both speak netguard.approval's messages, one JSON line each. Both sockets are created owner-only
(root, for `sandgate run`) in places the sandbox cannot see (its mount namespace hides them), so
a sandboxed process can neither ask nor answer. Whatever arrives is still decoded strictly: a
malformed line is refused, never half-believed.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from netguard.approval import MAX_LINE, Choice, Decision, ProtocolError, Request, choice, decode, encode


def listen(path: Path) -> socket.socket:
    """A unix socket only its owner (root) can connect to; an old file at the path is replaced."""
    path.unlink(missing_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        s.bind(str(path))
    finally:
        os.umask(old)
    s.listen(16)
    return s


def spawn(fn: Callable[..., None], *args: object) -> None:
    """A daemon thread: none of them may keep sandgate alive after the command's exit."""
    threading.Thread(target=fn, args=args, daemon=True).start()


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass


class DaemonChannel:
    """Where the daemon asks: each request is answered by `answer` in a thread of its own (a human
    taking their time must not hold up the next question), on the connection it came from."""

    def __init__(self, path: Path, answer: Callable[[Request], Decision]) -> None:
        self._answer = answer
        self._sock = listen(path)  # now, before the sandbox's mounts are planned: they hide it

    def start(self) -> None:
        spawn(self._accept)

    def close(self) -> None:
        _close(self._sock)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by close()
                return
            spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        lock = threading.Lock()  # answers come from several threads: one line at a time
        with conn, conn.makefile("rb") as f:
            while line := f.readline(MAX_LINE + 1):
                try:
                    msg = decode(line)
                except ProtocolError as e:
                    if e.id is not None:  # a question we cannot read is a question refused
                        self._send(conn, lock, Decision(e.id, "deny"))
                    continue
                if isinstance(msg, Request):
                    spawn(self._reply, conn, lock, msg)

    def _reply(self, conn: socket.socket, lock: threading.Lock, req: Request) -> None:
        self._send(conn, lock, self._answer(req))

    @staticmethod
    def _send(conn: socket.socket, lock: threading.Lock, msg: Decision) -> None:
        with lock:
            try:
                conn.sendall(encode(msg))
            except OSError:  # the daemon went away: its waiting connections are refused on its side
                pass


class ClientChannel:
    """`--approvals unix:PATH`: every connected tool sees every open request (also one that connects
    late); the first valid decision wins. Tools may only choose once/run/always/deny."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = listen(path)
        self._clients: list[socket.socket] = []
        self._open: set[str] = set()  # ids of requests waiting; a decision for any other id is dropped
        self._answers: dict[str, Choice] = {}
        self._cond = threading.Condition()
        self._closed = False

    def start(self) -> None:
        spawn(self._accept)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            clients, self._clients = self._clients, []
            self._cond.notify_all()
        for s in (self._sock, *clients):
            _close(s)
        self.path.unlink(missing_ok=True)

    def ask(self, req: Request, timeout: float) -> Choice | None:
        """The first tool's choice for `req`, or None: no choice within `timeout`, or closed."""
        line = encode(req)
        deadline = time.monotonic() + timeout
        sent: set[int] = set()
        with self._cond:
            self._open.add(req.id)
            try:
                while True:
                    self._send_new(line, sent)
                    if req.id in self._answers:
                        return self._answers.pop(req.id)
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        return None
                    self._cond.wait(min(left, 0.5))
            finally:
                self._open.discard(req.id)
                self._answers.pop(req.id, None)

    def _send_new(self, line: bytes, sent: set[int]) -> None:
        """Send the request to the clients that have not had it yet (called holding the condition)."""
        for c in list(self._clients):
            if id(c) not in sent:
                try:
                    c.sendall(line)
                    sent.add(id(c))
                except OSError:
                    self._clients.remove(c)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by close()
                return
            with self._cond:
                if self._closed:
                    _close(conn)
                    return
                self._clients.append(conn)
                self._cond.notify_all()
            spawn(self._read, conn)

    def _read(self, conn: socket.socket) -> None:
        try:
            with conn.makefile("rb") as f:
                while line := f.readline(MAX_LINE + 1):
                    self._take(line)
        except OSError:
            pass
        with self._cond:
            if conn in self._clients:
                self._clients.remove(conn)
            self._cond.notify_all()

    def _take(self, line: bytes) -> None:
        """Record a tool's decision; anything else (malformed, a request, "timeout", an unknown id) is refused."""
        try:
            msg = decode(line)
        except ProtocolError:
            return
        chosen = choice(msg.decision) if isinstance(msg, Decision) else None
        if chosen is None:
            return
        with self._cond:
            if msg.id in self._open and msg.id not in self._answers:
                self._answers[msg.id] = chosen
                self._cond.notify_all()
