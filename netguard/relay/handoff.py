"""Taking a decided, uninspected flow's two sockets out of mitmproxy for the kernel relay (netguard.relay.splice).

mitmproxy 12 keeps one ConnectionHandler per client connection (Proxyserver.connections, by client
id); its `transports` map each Connection to an asyncio StreamReader/StreamWriter. We never fork or
patch it: reading is paused on both transports (one synchronous step between two of its events),
mitmproxy relays what its readers already hold and its writers send it all, and only then is each
socket (dup()ed) spliced: every byte is relayed once and in order. Then mitmproxy's transports are
given up (aborted: only its fds close, the sockets live on in our dups), so a spliced flow costs
this process two fds, or none once a relay worker takes it (netguard.relay.relay). mitmproxy's
handler stays alive but idle, holding no fd: both its connections are half-closed to it and it
waits. A sandbox's drop and the daemon's exit reach the flow through `cut_slots` (nothing of theirs
reaches a transport that is gone). When the relay ends (by itself, cut, or its worker's death), the
Relay layer writes the close record and mitmproxy's waiting tasks are cancelled: it tears down as
after any close.

Anything unexpected (a side already half-closed, another transport type, asyncio internals that
changed) leaves the flow with mitmproxy: slower, never wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from netguard.relay import splice
from netguard.relay.relay import Relay

if TYPE_CHECKING:  # mitmproxy's types only: the front door uses this module before mitmproxy is imported
    from mitmproxy.connection import Connection


class Relayed(Protocol):
    """Where a spliced flow's bytes move (netguard.relay.relay.Relay; a splice.Pair or relaypool.Moved alike)."""

    @property
    def up(self) -> int: ...
    @property
    def down(self) -> int: ...

    def cut(self, why: str | None = None) -> None: ...


class Cuttable(Protocol):
    """A relayed flow a drop must end: a Handoff, or a flow the front door relays (netguard.daemon.frontdoor)."""

    def cut(self, why: str) -> None: ...


_LIVE: dict[int, set[Cuttable]] = {}  # by slot (the listen port of the client's proxy mode): what a drop cuts


class Handoff:
    """One flow moved out of mitmproxy: its early bytes, then a relay; `over` once both sockets are closed.

    `on_end` runs once the relay ended after mitmproxy gave its transports up (else mitmproxy
    itself reports the close, as before any splice)."""

    def __init__(
        self,
        handler: Any,
        client: Connection,
        server: Connection,
        slot: int = 0,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.up = self.down = 0  # bytes the relay moved (mitmproxy counted what it relayed before)
        self.spliced = False  # until then mitmproxy still relays what it had read
        self.relay: Relayed | None = None
        self.over = False
        self.error: str | None = None
        self._handler = handler
        self._client, self._server = client, server
        self._slot, self._on_end = slot, on_end
        self._fds: tuple[int, int] | None = None
        self._idle = 0.0
        self._readers: list[asyncio.StreamReader] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._task: asyncio.Task[None] | None = None
        self._disarmed: contextlib.AbstractContextManager[None] | None = None

    def take(self, idle: float) -> bool:
        """The synchronous step; False (nothing changed) if this flow must stay with mitmproxy."""
        if not splice.AVAILABLE:
            return False  # no splice(2) on this OS: mitmproxy relays the flow
        from netguard.relay import streams  # mitmproxy's internals: the front door imports this module without them

        c, s = streams.streams(self._handler, self._client), streams.streams(self._handler, self._server)
        if c is None or s is None:
            return False
        self._fds = streams.dup_sockets(c[1], s[1])
        if self._fds is None:
            return False  # out of fds (EMFILE): mitmproxy's relay needs none extra
        self._idle = idle
        self._readers, self._writers = [c[0], s[0]], [c[1], s[1]]
        for r, w in zip(self._readers, self._writers, strict=True):
            cast(asyncio.Transport, w.transport).pause_reading()  # no byte enters a StreamReader from now on
            # A reader paused by its own flow control resumes the transport on its next wait: bytes would
            # then reach mitmproxy behind the splice's back (out of order). The pause is ours now.
            r._paused = False  # type: ignore[attr-defined]
        track(self._slot, self)
        if self._quiet():
            self._start()  # the usual case: nothing in flight inside mitmproxy, no loop round to wait
        else:
            self._task = asyncio.get_running_loop().create_task(self._splice())
        return True

    def _quiet(self) -> bool:
        """Nothing left for mitmproxy to relay: its readers are empty, its writers have sent everything, and
        both its reading tasks wait in read(). A task that has read a chunk and not yet written it (waiting
        for mitmproxy's event lock) holds bytes no buffer shows: giving its transport up then would lose them."""
        if any(w.transport.get_write_buffer_size() for w in self._writers):
            return False
        if any(r._buffer for r in self._readers):  # type: ignore[attr-defined]  # checked in _streams
            return False
        return all(r._waiter is not None and not r._waiter.done() for r in self._readers)  # type: ignore[attr-defined]

    async def _splice(self) -> None:
        """Splice once mitmproxy relayed what its readers hold and its writers sent it: order is kept."""
        rounds = 0
        try:
            while True:
                for w in self._writers:
                    w.transport.set_write_buffer_limits(0)  # drain() now waits for an empty buffer
                    await w.drain()
                if any(w.transport.is_closing() for w in self._writers):
                    raise ConnectionError("closed while draining")
                if self._quiet():
                    break
                rounds += 1
                if rounds > 2000:  # seconds, not a loop round: mitmproxy is stuck, the flow cannot be moved whole
                    raise ConnectionError("mitmproxy never went quiet")
                await asyncio.sleep(0 if rounds < 100 else 0.002)  # its reading task is due: it relays the rest
        except (OSError, ConnectionError) as e:
            self.cut(f"handoff failed: {e}")
            return
        if not self.over:
            self._start()

    def _start(self) -> None:
        assert self._fds is not None
        watchdog = getattr(self._handler, "timeout_watchdog", None)
        if watchdog is not None:  # the relay keeps its own idle timeout (tcp_timeout)
            self._disarmed = watchdog.disarm()
            self._disarmed.__enter__()
        (a, b), self._fds = self._fds, None
        self.spliced = True
        self.relay = Relay(a, b, self._idle, self._ended)  # here first, in a worker once big
        for w in self._writers:
            w.transport.abort()  # mitmproxy's own fds close; the sockets live on in the relay's

    def cut(self, why: str) -> None:
        """End it now (a drop, the daemon's exit, mitmproxy closing a side before the splice started)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.relay is not None:
            self.relay.cut(why)
        elif not self.over:
            for fd in self._fds or ():
                os.close(fd)
            self._fds = None
            self._ended(why)

    def _ended(self, why: str | None) -> None:
        if self.over:
            return
        self.over = True
        self.error = why
        untrack(self._slot, self)
        if self.relay is not None:
            self.up, self.down = self.relay.up, self.relay.down
        if self._disarmed is not None:
            self._disarmed.__exit__(None, None, None)
        if not self.spliced:
            for w in self._writers:
                w.transport.abort()  # mitmproxy still holds them: its readers see the end, it tears down
            return
        if self._on_end is not None:
            self._on_end()  # the close record, while the Gate still knows the client
        for conn in (self._client, self._server):
            io = getattr(self._handler, "transports", {}).get(conn)
            task = getattr(io, "handler", None)
            if isinstance(task, asyncio.Task):
                task.cancel("spliced flow ended")  # it waits on a half-closed connection: now it ends


def cut_slots(slots: Iterable[int], why: str) -> None:
    """Cut every spliced flow of these slots (a sandbox's drop): their sockets are in no mitmproxy transport."""
    for slot in slots:
        for h in list(_LIVE.get(slot, ())):
            h.cut(why)


def track(slot: int, flow: Cuttable) -> None:
    """`flow` is cut with its slot's sandbox (cut_slots)."""
    _LIVE.setdefault(slot, set()).add(flow)


def untrack(slot: int, flow: Cuttable) -> None:
    _LIVE.get(slot, set()).discard(flow)
    if not _LIVE.get(slot, True):
        del _LIVE[slot]


def handler_of(handlers: Mapping[Any, Any], client: Connection) -> Any:
    """mitmproxy's ConnectionHandler of `client` (Proxyserver.connections), or None."""
    return handlers.get(client.id)
