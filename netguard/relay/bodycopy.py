"""What both body takeovers share (bodyrelay's splice, tlsbody's decrypt/encrypt loop): reading from our
own fd of the upstream socket, one idle clock, and one end that runs exactly once.

Why one place: the end is where fds are closed and the Gate is told how many bytes moved; two copies
could drift (a timer left running on a closed fd, a second `on_done` counting bytes twice).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

#: Told once, at the end: the bytes this copy delivered, and None or why it stopped early.
OnDone = Callable[[int, str | None], None]


class Counter:
    """Stream callback for HTTP bodies: counts bytes without keeping them (stream_large_bodies)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, data: bytes) -> bytes:
        self.n += len(data)
        return data


class BodyCopy:
    """Base of a body copy from `src` (closed at the end); subclasses define `_readable` and `_release`."""

    def __init__(self, src: int, limit: int, on_done: OnDone, idle: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.src, self.left, self.moved = src, limit, 0
        self._on_done: OnDone | None = on_done
        self._idle, self._last = idle, time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop.add_reader(self.src, self._readable)
        self._timer = self._loop.call_later(self._idle, self._check_idle)

    def _readable(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """What the subclass holds besides `src` (a pipe, another fd), given back at the end."""

    def _check_idle(self) -> None:
        """One clock for an upstream that sends nothing and a client that reads nothing (no reads then)."""
        left = self._last + self._idle - time.monotonic()
        if left <= 0:
            self.finish("idle timeout")
        elif self._on_done is not None:
            self._timer = self._loop.call_later(left, self._check_idle)

    def finish(self, why: str | None) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._loop.remove_reader(self.src)
        self._release()
        os.close(self.src)
        on_done(self.moved, why)
