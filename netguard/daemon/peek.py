"""A socket's first bytes, read with MSG_PEEK: they stay in the kernel's buffer until someone reads them.

The front door decides on a ClientHello or a request head without consuming it, so mitmproxy (or the
kernel relay) still gets the connection whole; and while it waits, the bytes cost the daemon nothing.
"""

from __future__ import annotations

import asyncio
import select
import socket
import sys
import threading
from collections.abc import Callable

from netguard.decision.limits import HEAD_MAX

PEEK_MAX = HEAD_MAX  # a ClientHello with post-quantum key shares is ~2 KiB, a request head a few hundred bytes


def now(conn: socket.socket) -> bytes:
    """What the client has sent so far, left in the socket (b"" if nothing yet)."""
    try:
        return _peek_bytes(conn)
    except (BlockingIOError, InterruptedError):
        return b""


_BUF = threading.local()  # one peek buffer per thread (each event loop has its own thread)


def _peek_bytes(conn: socket.socket) -> bytes:
    """recv(MSG_PEEK) through one reused buffer: a fresh PEEK_MAX bytes per call costs each of thousands of
    connections arriving at once 32 KiB of heap (measured: ~300 MiB more RSS at 10,000)."""
    buf: bytearray | None = getattr(_BUF, "buf", None)
    if buf is None:
        buf = _BUF.buf = bytearray(PEEK_MAX)
    n = conn.recv_into(buf, PEEK_MAX, socket.MSG_PEEK)
    return bytes(memoryview(buf)[:n])


async def until(conn: socket.socket, done: Callable[[bytes], bool], wait: float) -> tuple[bytes, bool]:
    """The client's first bytes, left in the socket, and whether `wait` seconds ran out first: until
    `done`, EOF (the client closed or half-closed: nothing more can come), PEEK_MAX or the time.

    SO_RCVLOWAT makes the next wakeup wait for more than what was seen (a peek leaves the socket
    readable: polling it would spin); it is reset before anyone else reads the socket. A wakeup with
    nothing new is EOF after some bytes (readable at EOF whatever the low-water mark)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    seen, before = b"", -1
    try:
        while True:
            try:
                seen = _peek_bytes(conn)
                if not seen or done(seen) or len(seen) >= PEEK_MAX or (len(seen) == before and _hung_up(conn)):
                    return seen, False
                if len(seen) == before:  # the low-water mark is capped at half the buffer: do not spin
                    await asyncio.sleep(0.05)
                before = len(seen)
                _low_water(conn, len(seen) + 1)
            except (BlockingIOError, InterruptedError):
                pass
            if not await _readable(loop, conn.fileno(), deadline):
                return seen, True
    finally:
        if seen:
            _low_water(conn, 1)


def _low_water(conn: socket.socket, size: int) -> None:
    """SO_RCVLOWAT, where there is one: Windows' TCP/IP provider fails it with WSAEINVAL
    (learn.microsoft.com/windows/win32/winsock/sol-socket-socket-options), which would close every
    connection; there the 50 ms pause in `until` is what stops a peeked socket from spinning (win-py P6)."""
    if sys.platform != "win32":
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)


def _hung_up(conn: socket.socket) -> bool:
    """The client shut its sending side (or the connection failed): no more bytes can come. Windows has
    no select.poll nor POLLRDHUP: never known there, so a half-closed partial head waits for the deadline."""
    if sys.platform == "win32":
        return False
    p = select.poll()
    p.register(conn.fileno(), select.POLLRDHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))


async def _readable(loop: asyncio.AbstractEventLoop, fd: int, deadline: float) -> bool:
    fut: asyncio.Future[bool] = loop.create_future()

    def wake(ok: bool) -> None:
        if not fut.done():
            fut.set_result(ok)

    loop.add_reader(fd, wake, True)
    timer = loop.call_at(deadline, wake, False)
    try:
        return await fut
    finally:
        timer.cancel()
        loop.remove_reader(fd)


LINGER = 1.0  # seconds, and LINGER_MAX bytes: what a refused client may still send before the close
LINGER_MAX = 1 << 20


async def linger(conn: socket.socket) -> None:
    """Close after an answer the client must read (a 431) although it is still sending: closing with its
    bytes unread would reset the connection and may discard the answer before the client reads it
    (nginx's lingering close). What arrives is read and dropped, within LINGER_MAX bytes and LINGER s."""
    loop = asyncio.get_running_loop()
    try:
        conn.shutdown(socket.SHUT_WR)
        deadline, left = loop.time() + LINGER, LINGER_MAX
        while left > 0 and await _readable(loop, conn.fileno(), deadline):
            data = conn.recv(min(left, 65536))
            if not data:
                return
            left -= len(data)
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        pass
