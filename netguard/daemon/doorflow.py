"""One connection the front door relays after deciding it: the kernel relay, then its close record.

The front door (netguard.daemon.frontdoor) hands both sockets to the kernel relay (netguard.relay.relay)
and tracks the flow in handoff's registry, so a sandbox's drop cuts it; when the relay ends, the
flow's close record is written and its connection budget given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable

from netguard.audit import Kind, close_record
from netguard.decision.binding import Binding
from netguard.decision.decide import Decided
from netguard.relay import handoff
from netguard.relay.relay import Relay


class Flow:
    """One connection the front door relays: its decision, and the close record once the relay ends."""

    def __init__(self, b: Binding, d: Decided, kind: Kind, slot: int, done: Callable[[], None]) -> None:
        self.b, self.d, self.kind, self.slot = b, d, kind, slot
        self.t0 = time.monotonic()
        self.relay: handoff.Relayed | None = None
        self.over: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done = done

    def start(self, a: socket.socket, up: socket.socket, idle: float) -> None:
        """Both sockets go to the kernel relay (here, then a worker's once big: netguard.relay.relay)."""
        fa, fb = a.detach(), up.detach()
        try:
            relay = Relay(fa, fb, idle, self.ended)
        except BaseException:
            for fd in (fa, fb):
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        self.relay = relay
        handoff.track(self.slot, self)

    def cut(self, why: str) -> None:
        if self.relay is not None:
            self.relay.cut(why)

    def ended(self, why: str | None) -> None:
        if self.over.done():
            return
        handoff.untrack(self.slot, self)
        assert self.relay is not None
        d, ms = self.d, int((time.monotonic() - self.t0) * 1000)
        try:
            self.b.audit.write(
                close_record(
                    self.b.task, d.id, self.kind, d.host, d.port, d.verdict.ip, self.relay.up, self.relay.down, ms
                )
            )
        finally:
            self.over.set_result(None)
            self._done()
