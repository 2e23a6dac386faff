"""One side of an HTTP exchange the front door forwards itself: a plain socket, or TLS it terminated.

The exchange (netguard.daemon.httpexchange) reads and writes both sides through this one shape, so
plain HTTP (netguard.daemon.plainhttp) and inspected HTTPS (netguard.daemon.tlshttp) share one framing
and one copy loop. `raw` is the socket when bytes cross it as they are: only then may a counted splice
move a body in the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol


class Pipe(Protocol):
    raw: socket.socket | None
    chunk: int  # bytes per read of a body: one loop turn each

    async def recv(self, n: int) -> bytes: ...

    async def send(self, data: bytes) -> None: ...

    def abort(self) -> None:
        """Shut the socket both ways now: a peer waiting on it stops waiting (the other side went away)."""

    def idle_open(self) -> bool:
        """A kept upstream connection that has neither closed nor sent anything unasked for: fit for the next request."""


class SockPipe:
    """A plain non-blocking socket (the caller owns and closes it)."""

    def __init__(self, sock: socket.socket) -> None:
        self.raw: socket.socket | None = sock
        self.chunk = 64 * 1024
        self._sock = sock
        self._loop = asyncio.get_running_loop()

    async def recv(self, n: int) -> bytes:
        return await self._loop.sock_recv(self._sock, n)

    async def send(self, data: bytes) -> None:
        await self._loop.sock_sendall(self._sock, data)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def idle_open(self) -> bool:
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"": closed; bytes: an answer nobody asked for
            return False
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
