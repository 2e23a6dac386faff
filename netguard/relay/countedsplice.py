"""Exactly N bytes of a body moved from one socket to another by the kernel: splice(2) through a pooled pipe.

Used where a body's length is known and nothing in it needs reading: a plain-HTTP response body that
leaves mitmproxy (netguard.relay.bodyrelay) and a large Content-Length body on the front door's
plain-HTTP path (netguard.daemon.plainhttp). Not one byte past the count is read: what follows on a
kept-alive connection is the next response's.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable

from netguard.relay import splice
from netguard.relay.bodycopy import BodyCopy, OnDone

_BURST = 8  # pipes moved per wakeup at most: one download must not starve other connections


async def copy(
    src: socket.socket, dst: socket.socket, limit: int, idle: float, counted: Callable[[int], None]
) -> str | None:
    """Move `limit` bytes src -> dst (their fds are duplicated, the sockets stay the caller's); None, or why it
    stopped early. `counted` gets the bytes moved, once, however it ends: cancelled too (the copy then
    stops and gives its pipe back, never reused half full)."""
    done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def ended(_moved: int, why: str | None) -> None:
        if not done.done():
            done.set_result(why)

    a = os.dup(src.fileno())
    try:
        b = os.dup(dst.fileno())
    except OSError:
        os.close(a)
        raise
    c = CountedSplice(a, b, limit, ended, idle)
    c.start()
    try:
        return await done
    finally:
        c.finish("cancelled")  # a no-op once it ended by itself
        counted(c.moved)


class CountedSplice(BodyCopy):
    """Exactly `limit` bytes from `src` to `dst` through one pooled pipe; closes both fds when done."""

    def __init__(self, src: int, dst: int, limit: int, on_done: OnDone, idle: float) -> None:
        super().__init__(src, limit, on_done, idle)
        self.dst, self.held = dst, 0
        self.pipe: splice.Pipe | None = None

    def _readable(self) -> None:
        for _ in range(_BURST):
            if self.pipe is None:
                try:
                    self.pipe = splice.POOL.take()
                except OSError:
                    self._loop.remove_reader(self.src)  # all pipes lent: try again shortly
                    self._loop.call_later(0.05, self._loop.add_reader, self.src, self._readable)
                    return
            want = min(self.pipe.size - self.held, self.left - self.held)
            try:
                n = os.splice(self.src, self.pipe.w, want, flags=splice.FLAGS)
            except BlockingIOError:
                return
            except OSError as e:
                self.finish(f"upstream read failed: {os.strerror(e.errno or 0)}")
                return
            if n == 0:
                self.finish("upstream closed before the end of the body")
                return
            self.held += n
            self._last = time.monotonic()
            if not self._flush() or n < want:
                return

    def _flush(self) -> bool:
        """Move the pipe's bytes to `dst`; False while `dst` is full (then only its writability wakes us)."""
        assert self.pipe is not None
        while self.held:
            try:
                m = os.splice(self.pipe.r, self.dst, self.held, flags=splice.FLAGS)
            except BlockingIOError:
                self._loop.remove_reader(self.src)  # backpressure: no read until the client took the pipe
                self._loop.add_writer(self.dst, self._writable)
                return False
            except OSError as e:
                self.finish(f"send failed: {os.strerror(e.errno or 0)}")
                return False
            self.held -= m
            self.moved += m
            self.left -= m
        if self.left == 0:
            self.finish(None)
            return False
        return True

    def _writable(self) -> None:
        self._loop.remove_writer(self.dst)
        if self._flush():
            self._loop.add_reader(self.src, self._readable)

    def _release(self) -> None:
        self._loop.remove_writer(self.dst)
        if self.pipe is not None:
            splice.POOL.give(self.pipe, empty=self.held == 0)  # a cut body's bytes never reach another connection
            self.pipe = None
        os.close(self.dst)
