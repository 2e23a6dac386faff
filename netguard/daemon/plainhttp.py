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
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from netguard.audit import close_record
from netguard.daemon import dial, peek, plainhead
from netguard.daemon.chunks import Chunked
from netguard.decision import answers
from netguard.decision.binding import Binding
from netguard.decision.decide import Conn, Decided, Decider
from netguard.relay import countedsplice, splice

READ = 64 * 1024
CHUNKED_READ = 16 * 1024  # a chunked body is parsed in Python: tiny chunks cost ~1 us each, so a hostile
# upstream's 1-byte chunks hold the loop at most ~5 ms per read, not ~80 ms (measured)
SPLICE_MIN = 256 * 1024  # bytes of a known-length body left: from here a counted splice is cheaper than copies
_SOURCE = "upstream"  # the 502's X-Sandgate: the origin failed, not a corporate proxy
First = Callable[[socket.socket], Awaitable[bytes | None]]  # the front door's deadline-bound head peek
Take = Callable[[bytes], plainhead.Request | None]  # the next head, if this path takes it (parsed, policy)


class Unframed(Exception):
    """The upstream's answer cannot be framed: the client gets a 502 if nothing was sent yet."""


@dataclass
class _Moved:
    up: int = 0
    down: int = 0
    reusable: bool = True  # the upstream connection ended exactly where the response did

    def add_down(self, n: int) -> None:
        self.down += n


class Client:
    """One client connection on the plain-HTTP path: its requests in turn, one upstream connection kept."""

    def __init__(self, conn: socket.socket, b: Binding, decider: Decider, peer: tuple[str, int] | None) -> None:
        self.conn, self.b, self.decider = conn, b, decider
        self.st = Conn(b, peer, "http")
        self.loop = asyncio.get_running_loop()
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
        moved, t0 = _Moved(), time.monotonic()
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
        if self._up is not None and (key != self._key or not _idle_open(self._up)):
            self._drop()
        if self._up is None:
            self._up, self._key = await dial.connect(d), key
        return self._up

    def _drop(self) -> None:
        if self._up is not None:
            self._up.close()
            self._up = None

    async def _exchange(self, up: socket.socket, req: plainhead.Request, moved: _Moved, idle: float) -> bool:
        await self.loop.sock_sendall(up, req.head)
        body = self.loop.create_task(self._copy_body(up, req.length, moved)) if req.length else None
        if body is not None:
            body.add_done_callback(partial(_abandoned, up))
        try:
            resp, rest = await self._heads(up, req, idle)
            moved.reusable = await self._body(up, resp, rest, moved, idle)
            if body is not None and (not body.done() or body.exception() is not None):
                moved.reusable = False  # answered before the whole body was read: the rest of it is not a request
                return False
            return moved.reusable and not resp.close and not req.close
        finally:
            if body is not None:  # ended, and its failure (the client went away) read: never left unretrieved
                body.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await body

    async def _copy_body(self, up: socket.socket, length: int, moved: _Moved) -> None:
        left = length
        while left:
            await asyncio.sleep(0)  # a loop turn per piece, as in _recv
            data = await self.loop.sock_recv(self.conn, min(left, READ))
            if not data:
                raise ConnectionError("the client closed inside its request body")
            await self.loop.sock_sendall(up, data)
            left -= len(data)
            moved.up += len(data)

    async def _recv(self, up: socket.socket, idle: float, size: int = READ) -> bytes:
        """The upstream's next bytes. A loop turn first: sock_recv and sock_sendall do not yield while both
        sockets are ready, and one fast download would otherwise hold the daemon's loop from every sandbox."""
        await asyncio.sleep(0)
        return await asyncio.wait_for(self.loop.sock_recv(up, size), idle)

    async def _heads(self, up: socket.socket, req: plainhead.Request, idle: float) -> tuple[plainhead.Response, bytes]:
        """Interim (1xx) heads forwarded, then the final head; returned with the body bytes read after it."""
        buf = b""
        while True:
            resp = plainhead.response(buf, req.method)
            if resp == "incomplete":
                data = await self._recv(up, idle)
                if not data:
                    raise Unframed(f"the upstream closed before a whole response head ({len(buf)} bytes)")
                buf += data
                continue
            if resp is None:
                raise Unframed("the upstream's response head cannot be framed")
            await self.loop.sock_sendall(self.conn, buf[: resp.size])
            buf = buf[resp.size :]
            if not resp.interim:
                return resp, buf

    async def _body(self, up: socket.socket, resp: plainhead.Response, rest: bytes, moved: _Moved, idle: float) -> bool:
        """The body forwarded as it comes; True when the upstream connection ended exactly with it."""
        if resp.body == "none":
            return not rest
        chunks = Chunked() if resp.body == "chunked" else None
        left = resp.length if resp.body == "length" else -1  # -1: until the close
        data = rest
        while True:
            if chunks is not None:
                end = _feed(chunks, data)
                piece, done = data[:end], end is not None
                moved.down = chunks.data  # the payload, as mitmproxy counts a chunked body
            else:
                piece = data if left < 0 else data[:left]
                left, done = (left, False) if left < 0 else (left - len(piece), left == len(piece))
                moved.down += len(piece)
            if piece:
                await self.loop.sock_sendall(self.conn, piece)
            if done:
                return len(piece) == len(data)  # bytes past the end: not a keep-alive partner to trust
            if left > SPLICE_MIN and splice.AVAILABLE:  # a large known length: the kernel moves it, not Python
                why = await countedsplice.copy(up, self.conn, left, idle, moved.add_down)
                if why is not None:
                    raise OSError(why)
                return True
            data = await self._recv(up, idle, CHUNKED_READ if chunks is not None else READ)
            if not data:
                if resp.body == "close":
                    return False
                raise OSError("the upstream closed inside the body")


def _abandoned(up: socket.socket, body: asyncio.Task[None]) -> None:
    """The client left inside its request body: the upstream waits for the rest and will not answer, so its
    socket is shut and the wait for its answer ends now, not at the idle limit (the connection's share with it)."""
    if not body.cancelled() and body.exception() is not None:
        with contextlib.suppress(OSError):
            up.shutdown(socket.SHUT_RDWR)


def _feed(chunks: Chunked, data: bytes) -> int | None:
    try:
        return chunks.feed(data)
    except ValueError as e:
        raise OSError(str(e)) from None  # mid-body: the client's connection ends, as after an upstream reset


def _idle_open(up: socket.socket) -> bool:
    """A kept upstream connection that has neither closed nor sent anything unasked for."""
    try:
        up.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"": closed; bytes: an answer nobody asked for
        return False
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
