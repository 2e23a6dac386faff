"""mitmproxy, loaded beside a daemon that already serves: the front door needs none of it (issue 25).

A cold daemon used to import mitmproxy (~0.4 s) before it answered its first launcher, although the
front door decides the common flows (an allowed CONNECT, an allowed SNI) with sandgate's own code
(netguard.daemon.frontdoor, decide, tlshello, answers). Now the daemon serves first and imports
mitmproxy on a thread; a connection that needs it (inspection, plain HTTP, a question, anything the
front door hands over) waits for it, queued in its socket, as the first connection of a cold daemon
waited before. The load starts half a second after "ready", or at once when a connection needs it:
a cold start's first run is built and served with the CPU to itself. Nothing is decided differently while it loads: the front door's flows are the ones
it decides at any time, and mitmproxy's are decided by mitmproxy.

Fail closed: if mitmproxy cannot be loaded, every connection handed to it is closed and the daemon
says why in its log and stops (a launcher then reports the dead daemon, as for any crash).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from netguard.decision.binding import Binding
from netguard.decision.decide import Decider
from sgbase import dataclasscache

if TYPE_CHECKING:
    from mitmproxy.addons.proxyserver import Proxyserver
    from mitmproxy.master import Master

    from netguard.decision.gate import Gate
    from netguard.decision.tlsinspect import Material, TlsInspect

#: mitmproxy's default `tcp_timeout`, set on it explicitly: a relayed flow and a mitmproxy flow idle out alike.
IDLE = 600.0
#: Seconds between the import thread's turns at the interpreter while it loads (CPython's default is 5 ms):
#: the serving loop's accepts and relays wait at most this long for the thread to yield.
SWITCH = 0.0005
#: Seconds after "ready" before the load starts by itself: a cold start's first run (its bind, its first
#: connections) has the CPU to itself meanwhile; a connection that needs mitmproxy starts it at once.
DEFER = 0.5
MODULE = "netguard.daemon.master"  # what is imported on the thread (make_master, and all of mitmproxy it needs)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Mitm:
    """The daemon's one mitmproxy master, Proxyserver and Gate, once loaded."""

    def __init__(
        self, bindings: dict[int, Binding], decider: Decider, stop: Callable[[str], None], loaded: Callable[[], None]
    ) -> None:
        self._bindings, self.decider, self._stop, self._on_loaded = bindings, decider, stop, loaded
        self._loaded = asyncio.Event()
        self.failed: str | None = None
        self.master: Master | None = None
        self.proxyserver: Proxyserver | None = None
        self.gate: Gate | None = None
        self.tls: TlsInspect | None = None
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, after: float = DEFER) -> None:
        """Load in `after` seconds, or as soon as a connection needs mitmproxy (`handler`), if that comes first."""
        self._timer = asyncio.get_running_loop().call_later(after, self.kick)

    def kick(self) -> None:
        """Start loading now (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH)
        try:
            master = await asyncio.to_thread(importlib.import_module, MODULE)
            sys.setswitchinterval(switch)
            self.master, self.proxyserver, self.gate = master.make_master(self._bindings, [])
            self.master.options.update(tcp_timeout=int(IDLE))
            self.gate.decider = self.decider  # one decider for both paths: one resolver, one set of local addresses
            self.tls = self.master.addons.get("tlsinspect")
            await self.master.running()
            self._on_loaded()
            dataclasscache.save()  # every record class the daemon makes exists now: the next start reads them
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            self._stop(f"cannot load mitmproxy: {self.failed}")
        finally:
            sys.setswitchinterval(switch)
            self._loaded.set()

    def material(self, b: Binding) -> Material | None:
        """Sandbox `b`'s TLS material for the front door's inspected path (netguard.daemon.tlshttp); None until
        mitmproxy is loaded (until then its connections wait for mitmproxy)."""
        return self.tls.material(b) if self.tls is not None and self.failed is None else None

    def state(self) -> str:
        """For `status`: "loading", "ready" or "failed"."""
        if not self._loaded.is_set():
            return "loading"
        return "ready" if self.failed is None else "failed"

    async def ready(self) -> bool:
        """Wait until mitmproxy is loaded: True, or False if it could not be (then nothing may use it)."""
        await self._loaded.wait()
        return self.failed is None

    def handler(self, mode: str, slot: int) -> Handler:
        """mitmproxy's stream handler for one listener of one slot, made once mitmproxy is there.

        The slot is only the Gate's key (the listen port of the mode spec): nothing is bound to it."""
        made: list[Handler] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.kick()  # this connection needs mitmproxy now
            if not await self.ready():
                writer.transport.abort()  # fail closed: no mitmproxy, no decision, no byte relayed
                return
            if not made:
                from mitmproxy.proxy.mode_servers import ServerInstance

                assert self.proxyserver is not None  # ready() said it was loaded
                instance: ServerInstance[Any] = ServerInstance.make(f"{mode}@127.0.0.1:{slot}", self.proxyserver)
                made.append(instance.handle_stream)
            await made[0](reader, writer)

        return handle

    async def done(self) -> None:
        """Stop mitmproxy (after its import finished, if it was still loading)."""
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task])
        if self.master is not None and self.failed is None:
            await self.master.done()
