"""The front door's plain-HTTP path: an explicit proxy's plainest requests forwarded without mitmproxy.

Measured (issue 25): a plain-HTTP request through mitmproxy cost +1.7-2.4 ms per new connection, most
of it mitmproxy's per-connection setup and hook turns. A request whose head netguard.daemon.plainhead
recognises beyond doubt, to a host the policy allows by itself (not inspected, no credential bound,
no corporate proxy), is forwarded here instead:
  - decided by the Gate's code (netguard.decision.decide: the same decision record, pin and veto);
  - its head sent upstream as mitmproxy sends it (origin-form, the fields as the client sent them),
    its Content-Length body copied beside the response (a server may answer before reading it);
  - the response forwarded byte for byte as it arrives, framed by plainhead.response (a length, chunks
    counted by netguard.daemon.chunks, or the close; a large length moved by a counted splice), and
    one close record written per request;
  - kept alive: the next request is peeked and judged in turn. One this path does not take (another
    kind, a host that needs mitmproxy) goes to mitmproxy with the connection, its head still unread.
An upstream connection is reused only for the same checked address, and never after a response whose
end was not certain. Fail closed: an unframeable response is a 502 and the end of the connection.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

from netguard.audit import close_record
from netguard.daemon import dial, httpexchange, peek, plainhead
from netguard.daemon.httpexchange import Unframed
from netguard.daemon.pipes import SockPipe
from netguard.decision import answers
from netguard.decision.binding import Binding
from netguard.decision.decide import Conn, Decided, Decider

_SOURCE = "upstream"  # the 502's X-Sandgate: the origin failed, not a corporate proxy
First = Callable[[socket.socket], Awaitable[bytes | None]]  # the front door's deadline-bound head peek
Take = Callable[[bytes], plainhead.Request | None]  # the next head, if this path takes it (parsed, policy)


class Client:
    """One client connection on the plain-HTTP path: its requests in turn, one upstream connection kept."""

    def __init__(self, conn: socket.socket, b: Binding, decider: Decider, peer: tuple[str, int] | None) -> None:
        self.conn, self.b, self.decider = conn, b, decider
        self.st = Conn(b, peer, "http")
        self.loop = asyncio.get_running_loop()
        self._client = SockPipe(conn)
        self._up: socket.socket | None = None
        self._key: tuple[str, int, str | None] | None = None

    async def serve(self, req: plainhead.Request, first: First, take: Take, idle: float) -> bool:
        """Requests until the connection ends (False) or one is mitmproxy's (True: hand the connection over)."""
        try:
            while True:
                if not await self._one(req, idle):
                    return False
                if not (await peek.until(self.conn, bool, idle))[0]:
                    return False  # idle past the relay's limit, or the client closed
                data = await first(self.conn)
                if data is None:
                    return False
                nxt = take(data)
                if nxt is None:
                    return True  # unread: mitmproxy gets it as its first request
                req = nxt
        except OSError:
            return False  # either side went away: nothing to tell anyone
        finally:
            self._drop()

    async def _one(self, req: plainhead.Request, idle: float) -> bool:
        """One request and its response; whether the connection may carry another."""
        if len(self.conn.recv(req.size)) != req.size:  # the head only: it was all there (peeked)
            raise ConnectionError("the peeked request head could not be read")
        d = await self.decider.authorize(self.st, "http", req.host, req.port, method=req.method, url=req.url)
        if not d.allowed:  # allowed by the rules, then vetoed (rebinding) or unresolved: mitmproxy's 403
            await self.loop.sock_sendall(self.conn, answers.forbidden(d.host, d.port, d.verdict.decision))
            return False
        moved, t0 = httpexchange.Moved(), time.monotonic()
        try:
            up = await self._upstream(d)
            if up is None:
                await self.loop.sock_sendall(
                    self.conn, answers.bad_gateway(f"cannot connect to {d.host}:{d.port}", _SOURCE)
                )
                return False
            ok = await self._exchange(up, req, moved, idle)
        except Unframed as e:
            if moved.down == 0:
                await self.loop.sock_sendall(self.conn, answers.bad_gateway(str(e), _SOURCE))
            return False
        finally:
            ms = int((time.monotonic() - t0) * 1000)
            self.b.audit.write(
                close_record(self.b.task, d.id, "http", d.host, d.port, d.verdict.ip, moved.up, moved.down, ms)
            )
        if not moved.reusable:
            self._drop()
        return ok

    async def _upstream(self, d: Decided) -> socket.socket | None:
        """The kept connection if it leads to this checked address and is still open; else a new one."""
        key = (d.host, d.port, d.verdict.ip)
        if self._up is not None and (key != self._key or not SockPipe(self._up).idle_open()):
            self._drop()
        if self._up is None:
            self._up, self._key = await dial.connect(d), key
        return self._up

    def _drop(self) -> None:
        if self._up is not None:
            self._up.close()
            self._up = None

    async def _exchange(
        self, up: socket.socket, req: plainhead.Request, moved: httpexchange.Moved, idle: float
    ) -> bool:
        sent = httpexchange.Sent(req.head, req.length, req.method, req.close)
        return await httpexchange.exchange(self._client, SockPipe(up), sent, moved, idle)
