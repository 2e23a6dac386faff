"""One HTTP/1.1 request and its response, forwarded by the front door between two pipes (netguard.daemon.pipes).

Shared by the plain-HTTP path (netguard.daemon.plainhttp) and the inspected path (netguard.daemon.tlshttp):
  - the request's head goes upstream, its body (a Content-Length, or chunks counted by
    netguard.daemon.chunks) is copied beside the response: a server may answer before reading it;
  - the response is forwarded byte for byte as it arrives, framed by plainhead.response (a length,
    chunks, or the close; a large length between two plain sockets moved by a counted splice);
  - a 101 to a request whose upgrade was judged allowed becomes a two-way copy until either side ends.
Fail closed: an unframeable response raises Unframed (the caller answers 502 if nothing was sent yet);
an upstream connection is reusable only when it ended exactly where the response did.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Literal

from netguard.daemon import plainhead
from netguard.daemon.chunks import Chunked
from netguard.daemon.pipes import Pipe
from netguard.relay import countedsplice, splice

READ = 64 * 1024
CHUNKED_READ = 16 * 1024  # a chunked body is parsed in Python: tiny chunks cost ~1 us each, so a hostile
# upstream's 1-byte chunks hold the loop at most ~5 ms per read, not ~80 ms (measured)
SPLICE_MIN = 256 * 1024  # bytes of a known-length body left: from here a counted splice is cheaper than copies
ReqBody = int | Literal["chunked"]  # a request body's framing: its length (0: none), or chunks


class Unframed(Exception):
    """The upstream's answer cannot be framed: the client gets a 502 if nothing was sent yet."""


@dataclass
class Moved:
    """What one exchange moved each way, how it ended, and the final status (None: no final head came)."""

    up: int = 0
    down: int = 0
    reusable: bool = True  # the upstream connection ended exactly where the response did
    status: int | None = None

    def add_down(self, n: int) -> None:
        self.down += n


@dataclass(frozen=True)
class Sent:
    """A request as it goes upstream: its head, how its body is framed, and what its response may be."""

    head: bytes
    body: ReqBody
    method: str
    close: bool  # the client asked to close after this one
    switch: bool = False  # its upgrade was judged allowed: a 101 starts a two-way copy


async def exchange(client: Pipe, up: Pipe, req: Sent, moved: Moved, idle: float) -> bool:
    """Forward `req` and its response; whether the client connection may carry another request."""
    await up.send(req.head)
    body = asyncio.get_running_loop().create_task(_copy_body(client, up, req.body, moved)) if req.body else None
    if body is not None:
        body.add_done_callback(partial(_abandoned, up))
    try:
        resp, rest = await _heads(client, up, req, idle, moved)
        if resp.body == "switch":
            await both_ways(client, up, rest, moved, idle)
            moved.reusable = False
            return False
        moved.reusable = await _body(client, up, resp, rest, moved, idle)
        if body is not None and (not body.done() or body.exception() is not None):
            moved.reusable = False  # answered before the whole body was read: the rest of it is not a request
            return False
        return moved.reusable and not resp.close and not req.close
    finally:
        if body is not None:  # ended, and its failure (the client went away) read: never left unretrieved
            body.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await body


async def _copy_body(client: Pipe, up: Pipe, framing: ReqBody, moved: Moved) -> None:
    chunks = Chunked(trailers=False) if framing == "chunked" else None
    left = -1 if framing == "chunked" else framing
    while left:
        await asyncio.sleep(0)  # a loop turn per piece, as in _recv
        data = await client.recv(CHUNKED_READ if chunks is not None else min(left, client.chunk))
        if not data:
            raise ConnectionError("the client closed inside its request body")
        if chunks is not None:
            end = _feed(chunks, data)
            if end is not None and end != len(data):
                raise ConnectionError("bytes after a chunked request body before its answer")  # pipelining: refused
            left = 0 if end is not None else -1
        else:
            left -= len(data)
        await up.send(data)
        moved.up += len(data) if chunks is None else 0
    if chunks is not None:
        moved.up = chunks.data  # the payload, as mitmproxy counts a chunked body


def _abandoned(up: Pipe, body: asyncio.Task[None]) -> None:
    """The client left inside its request body: the upstream waits for the rest and will not answer, so its
    socket is shut and the wait for its answer ends now, not at the idle limit (the connection's share with it)."""
    if not body.cancelled() and body.exception() is not None:
        up.abort()


async def _recv(up: Pipe, idle: float, size: int = READ) -> bytes:
    """The upstream's next bytes. A loop turn first: sock_recv and sock_sendall do not yield while both
    sockets are ready, and one fast download would otherwise hold the daemon's loop from every sandbox."""
    await asyncio.sleep(0)
    return await asyncio.wait_for(up.recv(size), idle)


async def _heads(client: Pipe, up: Pipe, req: Sent, idle: float, moved: Moved) -> tuple[plainhead.Response, bytes]:
    """Interim (1xx) heads forwarded, then the final head; returned with the body bytes read after it."""
    buf = b""
    while True:
        resp = plainhead.response(buf, req.method, req.switch)
        if resp == "incomplete":
            data = await _recv(up, idle)
            if not data:
                raise Unframed(f"the upstream closed before a whole response head ({len(buf)} bytes)")
            buf += data
            continue
        if resp is None:
            raise Unframed("the upstream's response head cannot be framed")
        await client.send(buf[: resp.size])
        buf = buf[resp.size :]
        if not resp.interim:
            moved.status = resp.status
            return resp, buf


async def _body(client: Pipe, up: Pipe, resp: plainhead.Response, rest: bytes, moved: Moved, idle: float) -> bool:
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
            await client.send(piece)
        if done:
            return len(piece) == len(data)  # bytes past the end: not a keep-alive partner to trust
        if left > SPLICE_MIN and splice.AVAILABLE and up.raw is not None and client.raw is not None:
            # a large known length between plain sockets: the kernel moves it, not Python
            why = await countedsplice.copy(up.raw, client.raw, left, idle, moved.add_down)
            if why is not None:
                raise OSError(why)
            return True
        data = await _recv(up, idle, CHUNKED_READ if chunks is not None else up.chunk)
        if not data:
            if resp.body == "close":
                return False
            raise OSError("the upstream closed inside the body")


async def both_ways(client: Pipe, up: Pipe, rest: bytes, moved: Moved, idle: float) -> None:
    """Both directions copied as they are until either side ends (`rest`: the upstream's bytes read already).
    After an allowed 101 (no rule reads what follows), and for a tunnel bridged to mitmproxy (tlshttp)."""
    if rest:
        await client.send(rest)
        moved.down += len(rest)

    async def pump(src: Pipe, dst: Pipe, downward: bool) -> None:
        while data := await _recv(src, idle):
            await dst.send(data)
            if downward:
                moved.down += len(data)
            else:
                moved.up += len(data)

    tasks = [asyncio.ensure_future(pump(up, client, True)), asyncio.ensure_future(pump(client, up, False))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, TimeoutError):
                await t


def _feed(chunks: Chunked, data: bytes) -> int | None:
    try:
        return chunks.feed(data)
    except ValueError as e:
        raise OSError(str(e)) from None  # mid-body: the connection ends, as after an upstream reset
