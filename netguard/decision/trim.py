"""Hand the heap that closed connections freed back to the system, a moment after they close.

An inspected or plain-HTTP connection costs the daemon buffers, TLS state and mitmproxy's layers;
glibc keeps what they freed in its arenas, so after a burst of 1,000 inspected connections the
shared daemon held ~460 MB it no longer used (issue 25), for the life of every other sandbox. One
malloc_trim(0) a short DELAY after connections close returns it; a burst of closes is one trim, not
one per connection (a trim walks the whole heap: milliseconds on a large one).
"""

from __future__ import annotations

import asyncio
import ctypes

DELAY = 2.0  # seconds after a close; later closes within it share the trim


def trim() -> None:
    """malloc_trim(0): return free heap pages to the system (glibc only; elsewhere nothing to do)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


class Trimmer:
    """`closed()` at each connection's end; one trim follows DELAY seconds after the first of a burst."""

    def __init__(self, delay: float = DELAY) -> None:
        self.delay = delay
        self.trims = 0
        self._pending: asyncio.TimerHandle | None = None

    def closed(self) -> None:
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self.delay, self._run)

    def _run(self) -> None:
        self._pending = None
        self.trims += 1
        trim()
