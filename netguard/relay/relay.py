"""Where a decided flow's bytes move: in this process first, in a relay worker once the flow is big.

Measured (issue 15, bench/datapath.py): handing a new connection's sockets to a worker at once added
~0.4 ms to every HTTPS connection (the SCM_RIGHTS hop and the worker's wakeups on the handshake's
round trips), against ~0.6 ms for the whole of the rest of our path. Yet workers are what lets
10,000 flows fit under this box's fd limit, and give a download another core. So a flow starts as
an in-process splice.Pair and is moved to a worker when it has carried MOVE_AFTER bytes, at a
moment when nothing of it is in flight in our pipes (splice.Pair.release): every byte is relayed
once and in order, and the close record counts both legs. Past IN_PROCESS_MAX in-process flows
(a burst of connections) a new one goes to a worker at once, as before.
"""

from __future__ import annotations

from collections.abc import Callable

from netguard.relay import relaypool, splice

MOVE_AFTER = 1 << 20  # bytes both ways: a package download moves, a handshake and an API call do not
IN_PROCESS_MAX = 512  # in-process flows (1,024 fds, under the daemon's fdlimit.RESERVE headroom of a 20,000 limit)

OnDone = Callable[[str | None], None]


class Relay:
    """One flow's kernel relay, wherever it is now; `up`/`down` count both legs, `on_done` runs once."""

    live = 0  # in-process flows of this process (class-wide: one daemon, one count)

    def __init__(self, a: int, b: int, idle: float, on_done: OnDone) -> None:
        self._idle = idle
        self._on_done: OnDone | None = on_done
        self._before = (0, 0)  # (up, down) relayed in this process before the move
        self._pair: splice.Pair | None = None
        self._moved: relaypool.Moved | None = None
        pool = relaypool.pool()
        pool.soon()  # workers boot (if none yet) while this flow and the next go by here
        if MOVE_AFTER <= 0 or Relay.live >= IN_PROCESS_MAX:
            self._moved = pool.place(a, b, idle, self._ended)
        if self._moved is None:
            self._here(a, b, movable=True)

    @property
    def up(self) -> int:
        return self._before[0] + self._now("up")

    @property
    def down(self) -> int:
        return self._before[1] + self._now("down")

    @property
    def in_worker(self) -> bool:
        return self._moved is not None

    def cut(self, why: str | None = None) -> None:
        if self._moved is not None:
            self._moved.cut(why)
        elif self._pair is not None:
            self._pair.cut(why)

    def _now(self, way: str) -> int:
        now = self._moved or self._pair
        return 0 if now is None else int(getattr(now, way))

    def _here(self, a: int, b: int, *, movable: bool) -> None:
        pair = splice.Pair(a, b, self._ended_here, self._idle)
        if movable:
            pair.on_bytes(MOVE_AFTER, self._move)
        self._pair = pair
        Relay.live += 1
        pair.start()

    def _move(self) -> None:
        """Called by the pair at a quiet moment past MOVE_AFTER: its sockets go to a worker, if one can take them."""
        pair = self._pair
        if pair is None:
            return
        if not relaypool.pool().ready():  # none booted yet, or all full: ask again after as many bytes
            pair.on_bytes(pair.up + pair.down + MOVE_AFTER, self._move)
            return
        a, b = pair.release()
        Relay.live -= 1
        self._pair, self._before = None, (pair.up, pair.down)
        self._moved = relaypool.pool().place(a, b, self._idle, self._ended)
        if self._moved is None:  # refused after all (its channel closed meanwhile): relayed here to the end
            self._here(a, b, movable=False)

    def _ended_here(self, why: str | None) -> None:
        Relay.live -= 1
        self._ended(why)

    def _ended(self, why: str | None) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(why)
