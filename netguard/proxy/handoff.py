"""Taking a decided, uninspected flow's two sockets out of mitmproxy for the kernel relay (netguard.proxy.splice).

mitmproxy 12 keeps one ConnectionHandler per client connection (Proxyserver.connections, by client
id); its `transports` map each Connection to an asyncio StreamReader/StreamWriter. We never fork or
patch it: reading is paused on both transports (one synchronous step between two of its events),
mitmproxy relays what its readers already hold and its writers send it all, and only then is each
socket (dup()ed) spliced: every byte is relayed once and in order. mitmproxy's handler stays
alive but idle (its reads wait forever on paused transports), so everything that closes a
connection through mitmproxy (a sandbox's drop, the daemon's exit) still reaches it:
netguard.proxy.layers.Relay sees the ConnectionClosed and cuts the pair. When the pair ends by
itself, the transports are aborted and mitmproxy tears down as after any close.

Anything unexpected (a side already half-closed, another transport type, asyncio internals that
changed) leaves the flow with mitmproxy: slower, never wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from typing import Any, cast

from mitmproxy.connection import Connection, ConnectionState

from netguard.proxy import splice


def _streams(handler: Any, conn: Connection) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    io = getattr(handler, "transports", {}).get(conn)
    r, w = getattr(io, "reader", None), getattr(io, "writer", None)
    if not isinstance(r, asyncio.StreamReader) or not isinstance(w, asyncio.StreamWriter):
        return None  # UDP, or a mitmproxy_rs stream: no socket to take
    if conn.state is not ConnectionState.OPEN or w.transport.is_closing():
        return None  # half-closed already: mitmproxy finishes what it started
    if r.exception() is not None or getattr(r, "_eof", True) or not isinstance(getattr(r, "_paused", None), bool):
        return None
    if not isinstance(getattr(r, "_buffer", None), bytearray):
        return None  # asyncio's StreamReader internals changed: stay with mitmproxy
    return r, w


class Handoff:
    """One flow moved out of mitmproxy: its early bytes, then a splice.Pair; `over` once both sockets are closed."""

    def __init__(self, handler: Any, client: Connection, server: Connection) -> None:
        self.up = self.down = 0  # bytes the pair moved (mitmproxy counted what it relayed before)
        self.spliced = False  # until then mitmproxy still relays what it had read
        self.pair: splice.Pair | None = None
        self.over = False
        self.error: str | None = None
        self._handler = handler
        self._client, self._server = client, server
        self._readers: list[asyncio.StreamReader] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._task: asyncio.Task[None] | None = None
        self._disarmed: contextlib.AbstractContextManager[None] | None = None

    def take(self, idle: float) -> bool:
        """The synchronous step; False (nothing changed) if this flow must stay with mitmproxy."""
        c, s = _streams(self._handler, self._client), _streams(self._handler, self._server)
        if c is None or s is None:
            return False
        fds = _dups(c[1], s[1])
        if fds is None:
            return False  # out of fds (EMFILE): mitmproxy's relay needs none extra
        self._readers, self._writers = [c[0], s[0]], [c[1], s[1]]
        for r, w in zip(self._readers, self._writers, strict=True):
            cast(asyncio.Transport, w.transport).pause_reading()  # no byte enters a StreamReader from now on
            # A reader paused by its own flow control resumes the transport on its next wait: bytes would
            # then reach mitmproxy behind the splice's back (out of order). The pause is ours now.
            r._paused = False  # type: ignore[attr-defined]
        self.pair = splice.Pair(fds[0], fds[1], self._ended, idle)
        if self._quiet():
            self._start()  # the usual case: nothing in flight inside mitmproxy, no loop round to wait
        else:
            self._task = asyncio.get_running_loop().create_task(self._splice())
        return True

    def _quiet(self) -> bool:
        """Nothing left for mitmproxy to relay: its readers are empty, its writers have sent everything."""
        if any(w.transport.get_write_buffer_size() for w in self._writers):
            return False
        return not any(r._buffer for r in self._readers)  # type: ignore[attr-defined]  # checked in _streams

    async def _splice(self) -> None:
        """Splice once mitmproxy relayed what its readers hold and its writers sent it: order is kept."""
        assert self.pair is not None
        try:
            while True:
                for w in self._writers:
                    w.transport.set_write_buffer_limits(0)  # drain() now waits for an empty buffer
                    await w.drain()
                if any(w.transport.is_closing() for w in self._writers):
                    raise ConnectionError("closed while draining")
                if self._quiet():
                    break
                await asyncio.sleep(0)  # mitmproxy's reading task is due: it relays the rest itself
        except (OSError, ConnectionError) as e:
            self.pair.cut(f"handoff failed: {e}")
            return
        if not self.pair.closed:
            self._start()

    def _start(self) -> None:
        assert self.pair is not None
        watchdog = getattr(self._handler, "timeout_watchdog", None)
        if watchdog is not None:  # the pair keeps its own idle timeout (tcp_timeout)
            self._disarmed = watchdog.disarm()
            self._disarmed.__enter__()
        self.spliced = True
        self.pair.start()

    def cut(self, why: str) -> None:
        """End it now: mitmproxy closed one side (drop, daemon exit), so both go."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.pair is not None:
            self.pair.cut(why)

    def _ended(self, why: str | None) -> None:
        if self.over:
            return
        self.over = True
        self.error = why
        if self.pair is not None:
            self.up, self.down = self.pair.up, self.pair.down
        if self._disarmed is not None:
            self._disarmed.__exit__(None, None, None)
        for w in self._writers:
            w.transport.abort()  # mitmproxy's readers see the end: its handler tears down as after any close


def _dups(*writers: asyncio.StreamWriter) -> tuple[int, int] | None:
    """Our own fd for each socket (mitmproxy's transport keeps and later closes its own)."""
    fds: list[int] = []
    try:
        for w in writers:
            fds.append(os.dup(w.get_extra_info("socket").fileno()))
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0], fds[1]


def handler_of(handlers: Mapping[Any, Any], client: Connection) -> Any:
    """mitmproxy's ConnectionHandler of `client` (Proxyserver.connections), or None."""
    return handlers.get(client.id)
