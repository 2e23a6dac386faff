"""The kernel relay: two connected sockets joined with splice(2) through a pipe, on the event loop.

Once a flow is decided and not inspected, its bytes need no Python object at all: each direction
moves socket -> pipe -> socket inside the kernel, a pipe's worth at a time, and reads again only
after the other side took everything (backpressure: at most one pipe per direction is in flight,
so a fast server cannot fill the proxy's memory). Pipes are pooled: a direction holds one only
while bytes wait in it, so an idle or flowing connection costs its two sockets and no pipe.

Semantics kept from mitmproxy's TCP relay: the end of one direction (EOF, or a read error such as
a reset) is passed on as a half-close (shutdown SHUT_WR) of the other socket; a write that fails
(the receiver is gone) ends the pair; `idle` seconds without a byte either way end it (tcp_timeout).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time
from collections.abc import Callable

PIPE_SIZE = 256 * 1024  # in flight per blocked direction; mitmproxy buffered ~128 KiB per direction
#: splice(2) is Linux's: elsewhere (the Windows proxy) no flow is taken out of mitmproxy, which relays every byte.
AVAILABLE = hasattr(os, "splice")
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK if AVAILABLE else 0
_POOL_MAX = 64  # idle pipes kept for reuse (each is two fds)
PIPES_MAX = 128  # pipes in existence at once: their fds are in fdlimit.RESERVE, never taken from accept()
_BURST = 8  # pipes moved per wakeup at most: one busy connection must not starve the others


class Pipe:
    __slots__ = ("r", "size", "w")

    def __init__(self) -> None:
        import fcntl  # here: this module is imported where there is no fcntl (the Windows proxy), never run there

        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.size = fcntl.fcntl(self.w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # above fs.pipe-max-size for this user: the default (64 KiB) still works
            self.size = fcntl.fcntl(self.w, fcntl.F_GETPIPE_SZ)

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


class Pipes:
    """Empty pipes to lend; one per event loop is enough (a pipe is only held while bytes wait in it)."""

    def __init__(self) -> None:
        self._free: list[Pipe] = []
        self.made = 0

    def take(self) -> Pipe:
        """An empty pipe; OSError when PIPES_MAX are lent (the caller waits and tries again)."""
        if self._free:
            return self._free.pop()
        if self.made >= PIPES_MAX:
            raise OSError(errno.EMFILE, "all splice pipes are in use")
        pipe = Pipe()
        self.made += 1
        return pipe

    def give(self, pipe: Pipe, empty: bool) -> None:
        if empty and len(self._free) < _POOL_MAX:
            self._free.append(pipe)
        else:
            pipe.close()  # bytes of a cut connection must never reach another connection
            self.made -= 1


POOL = Pipes()


class _Way:
    """One direction: `src` -> pipe -> `dst`."""

    __slots__ = ("done", "dst", "eof", "held", "n", "pipe", "src", "waiting")

    def __init__(self, src: int, dst: int) -> None:
        self.src, self.dst = src, dst
        self.n = 0  # bytes delivered to dst
        self.pipe: Pipe | None = None
        self.held = 0  # bytes in the pipe, not yet taken by dst
        self.eof = False
        self.done = False
        self.waiting = False  # registered for dst writable instead of src readable


class Pair:
    """Relays between fds `a` and `b` (both non-blocking, owned by the Pair from now on) until both
    directions ended, or `cut()`; then closes them and calls `on_done` once, with an error text or None.

    `up` counts bytes a -> b, `down` bytes b -> a: delivered, not just read.
    """

    def __init__(self, a: int, b: int, on_done: Callable[[str | None], None], idle: float, pipes: Pipes = POOL) -> None:
        self._loop = asyncio.get_running_loop()
        self._ways = (_Way(a, b), _Way(b, a))
        self._on_done: Callable[[str | None], None] | None = on_done
        self._pipes = pipes
        self._idle = idle
        self._last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._mover: tuple[int, Callable[[], None]] | None = None
        self.closed = False

    @property
    def up(self) -> int:
        return self._ways[0].n

    @property
    def down(self) -> int:
        return self._ways[1].n

    def start(self) -> None:
        for way in self._ways:
            self._loop.add_reader(way.src, self._readable, way)
        if self._idle > 0:
            self._timer = self._loop.call_later(self._idle, self._check_idle)

    def cut(self, why: str | None = None) -> None:
        """End the pair now (drop of a sandbox, timeout, daemon exit): both sockets are closed."""
        self._finish(why)

    def on_bytes(self, after: int, call: Callable[[], None]) -> None:
        """`call()` once, at the first moment `quiet` past `after` bytes delivered (netguard.relay.relay moves it)."""
        self._mover = (after, call)

    def quiet(self) -> bool:
        """Nothing read and not yet delivered, and both directions still open: the sockets hold the rest."""
        return not self.closed and not any(w.held or w.eof or w.waiting or w.done for w in self._ways)

    def release(self) -> tuple[int, int]:
        """Stop relaying and give back both sockets, open (only when `quiet`: no byte is lost or doubled);
        `on_done` is never called."""
        assert self.quiet()
        self._on_done = self._mover = None
        self._stop()
        return self._ways[0].src, self._ways[1].src

    # ---- moving bytes ------------------------------------------------------------------------

    def _readable(self, way: _Way) -> None:
        for _ in range(_BURST):  # a full pipe means more is waiting: go on without another epoll round
            if way.pipe is None:
                try:
                    way.pipe = self._pipes.take()
                except OSError:  # out of fds (EMFILE): pause this direction briefly instead of failing it
                    self._loop.remove_reader(way.src)
                    self._loop.call_later(0.05, self._retry, way)
                    return
            size = way.pipe.size
            try:
                n = os.splice(way.src, way.pipe.w, size - way.held, flags=FLAGS)
            except BlockingIOError:
                if not way.held:
                    self._pipes.give(way.pipe, empty=True)  # an idle direction holds no pipe
                    way.pipe = None
                return
            except OSError:
                n = 0  # a reset or other read error ends this direction, as mitmproxy's relay did
            if n == 0:
                self._loop.remove_reader(way.src)
                way.eof = True
            else:
                way.held += n
                self._last = time.monotonic()
            self._flush(way)
            if n < size or way.waiting or way.eof or self.closed:
                return

    def _retry(self, way: _Way) -> None:
        if not self.closed:
            self._loop.add_reader(way.src, self._readable, way)

    def _flush(self, way: _Way) -> None:
        assert way.pipe is not None
        while way.held:
            try:
                m = os.splice(way.pipe.r, way.dst, way.held, flags=FLAGS)
            except BlockingIOError:
                if not way.waiting:  # backpressure: read no more until dst took what is in the pipe
                    way.waiting = True
                    if not way.eof:
                        self._loop.remove_reader(way.src)
                    self._loop.add_writer(way.dst, self._flush, way)
                return
            except OSError as e:
                self._finish(f"send failed: {os.strerror(e.errno or errno.EIO)}")  # the receiver is gone
                return
            way.held -= m
            way.n += m
        self._pipes.give(way.pipe, empty=True)
        way.pipe = None
        if way.waiting:
            way.waiting = False
            self._loop.remove_writer(way.dst)
            if not way.eof:
                self._loop.add_reader(way.src, self._readable, way)
        if way.eof:
            self._end(way)
        elif self._mover is not None and self.up + self.down >= self._mover[0] and self.quiet():
            call, self._mover = self._mover[1], None
            call()

    def _end(self, way: _Way) -> None:
        way.done = True
        try:
            _shutdown_wr(way.dst)  # the half-close travels on; the other direction may go on
        except OSError:
            pass  # already gone: the other direction will notice
        if all(w.done for w in self._ways):
            self._finish(None)

    def _check_idle(self) -> None:
        left = self._last + self._idle - time.monotonic()
        if left <= 0:
            self._finish("idle timeout")
        else:
            self._timer = self._loop.call_later(left, self._check_idle)

    def _stop(self) -> None:
        """No more callbacks, timer or pipes; the sockets are left to the caller (closed, or released)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for way in self._ways:
            self._loop.remove_reader(way.src)
            self._loop.remove_writer(way.dst)
            if way.pipe is not None:
                self._pipes.give(way.pipe, empty=way.held == 0)  # a pipe still holding bytes is never lent again
                way.pipe = None

    def _finish(self, why: str | None) -> None:
        if self.closed:
            return
        self._stop()
        for way in self._ways:
            os.close(way.src)
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(why)


def _shutdown_wr(fd: int) -> None:
    """shutdown(fd, SHUT_WR) on a raw fd, without a socket object that would close it."""
    s = socket.socket(fileno=fd)
    try:
        s.shutdown(socket.SHUT_WR)
    finally:
        s.detach()
