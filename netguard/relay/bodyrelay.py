"""A large plain-HTTP response body moved upstream -> client by the kernel, outside mitmproxy's HTTP/1 layers.

mitmproxy passes every chunk of a plain-HTTP body through its layer stack (parse, events, stream
callback, SendData): about 10x slower than the socket. For one response whose size is known
(Content-Length above THRESHOLD) from a host nobody inspects and no credential is bound to, the
Gate hands that body's bytes to a counted splice(2): exactly the remaining Content-Length bytes,
server -> pipe -> client, and not one more. What stays with mitmproxy, so nothing goes unjudged:
  - the client -> upstream direction: every request is still parsed and judged (a pipelined second
    request waits in mitmproxy's buffer and, as the connection ends after this body, is never sent);
  - the headers and the body bytes mitmproxy had already read: it sends them first (we wait until
    its reader is empty and its writer drained), so the client gets every byte once and in order;
  - the end: the response says `Connection: close`; once the count is reached the upstream
    transport is aborted, mitmproxy reports the flow ended (the Gate writes its one close record,
    with the spliced bytes counted) and closes the client connection as after any upstream end.
Anything unexpected (another transport type, a side closing meanwhile, asyncio internals that
changed, out of fds) leaves the body with mitmproxy: slower, never wrong.

An inspected HTTP/1 response (TLS on both sides) takes the same path with the same checks, but its
bytes must be decrypted and encrypted again: tlsbody.TlsCopy does that with mitmproxy's own TLS
sessions instead of the splice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from typing import Any, cast

from mitmproxy import ctx, http
from OpenSSL import SSL

from netguard.relay import splice, streams, tlsbody
from netguard.relay.bodycopy import Counter
from netguard.relay.countedsplice import CountedSplice

#: An inspected connection's two TLS sessions, (upstream, client): the objects mitmproxy's TLS layers use.
Sessions = tuple[SSL.Connection, SSL.Connection]

THRESHOLD = 256 * 1024  # smaller bodies are cheaper through mitmproxy than a takeover


def length(flow: http.HTTPFlow) -> int | None:
    """The body length of a response that may leave mitmproxy, or None (then mitmproxy keeps it).

    Only plain HTTP/1 with a known, large Content-Length after a request without a body: a
    streamed request body or a chunked/close-delimited response has no byte count to stop at."""
    req, resp = flow.request, flow.response
    plain = req.scheme == "http" and not flow.client_conn.tls and not flow.server_conn.tls
    if resp is None or not (plain or tlsbody.eligible(flow)):
        return None
    if not (req.http_version.startswith("HTTP/1") and resp.http_version.startswith("HTTP/1")):
        return None
    if req.method == "HEAD" or resp.status_code < 200 or resp.status_code in (204, 304):
        return None
    if "transfer-encoding" in req.headers or req.headers.get("content-length", "0") != "0":
        return None
    values = resp.headers.get_all("content-length")
    if "transfer-encoding" in resp.headers or len(values) != 1 or not values[0].isdigit():
        return None
    n = int(values[0])
    return n if n > (tlsbody.THRESHOLD if flow.server_conn.tls else THRESHOLD) else None


class BodyRelay:
    """One response body: mitmproxy's queued bytes first, then a counted splice; `counter` counts every byte."""

    def __init__(self, handler: Any, total: int, counter: Counter, tls: Sessions | None) -> None:
        self._handler, self._total, self._counter, self._tls = handler, total, counter, tls
        self._server: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._client: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._copy: CountedSplice | tlsbody.TlsCopy | None = None
        self._disarmed: contextlib.AbstractContextManager[None] | None = None
        self.over = False
        self.moved = 0  # bytes the splice delivered (mitmproxy relayed the rest)
        self.complete = False  # every byte of the body reached the client (then the upstream's abort is no failure)

    @classmethod
    def take(
        cls, handlers: Mapping[Any, Any], flow: http.HTTPFlow, counter: Counter, tls: Sessions | None = None
    ) -> BodyRelay | None:
        """At `responseheaders`: stop reading the upstream and take the body over; None if it must stay.

        `counter` is the body's stream callback: what mitmproxy relayed so far, and where the rest is added.
        `tls`: an inspected connection's (upstream, client) SSL sessions, mitmproxy's own."""
        total = length(flow) if splice.AVAILABLE or tls else None  # no splice(2) on this OS: mitmproxy relays it
        if (tls is None) == tlsbody.eligible(flow):
            total = None  # an inspected body needs its sessions; a plain one never gets any
        handler = handlers.get(flow.client_conn.id) if total is not None else None
        if total is None or handler is None or flow.response is None:
            return None
        server, client = streams.streams(handler, flow.server_conn), streams.streams(handler, flow.client_conn)
        if server is None or client is None:
            return None
        relay = cls(handler, total, counter, tls)
        relay._server, relay._client = server, client[1]
        cast(asyncio.Transport, server[1].transport).pause_reading()  # no upstream byte enters mitmproxy now
        server[0]._paused = False  # type: ignore[attr-defined]  # its own flow control must not resume it
        flow.response.headers["connection"] = "close"  # no later request on this connection goes unjudged
        relay._task = asyncio.get_running_loop().create_task(relay._run())
        return relay

    async def _run(self) -> None:
        """Wait until mitmproxy sent the headers and every body byte it had read; then splice the rest.

        The hook that made us returns before this task first runs, and mitmproxy then sends the headers
        and the bytes it queued during the hook in the same step: one more loop round is only a margin."""
        assert self._server is not None and self._client is not None
        reader, writer = self._server[0], self._client
        try:
            await asyncio.sleep(0)
            while True:
                writer.transport.set_write_buffer_limits(0)  # drain() now waits for an empty buffer
                await writer.drain()
                if writer.transport.is_closing() or self._server[1].transport.is_closing():
                    return  # a side ended meanwhile: mitmproxy reports it
                if not reader._buffer and not writer.transport.get_write_buffer_size():  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0)  # mitmproxy's reading task is due: it relays what it holds itself
        except (OSError, ConnectionError):
            return
        left = self._total - self._counter.n
        if left <= 0 or self.over:
            return  # mitmproxy had the whole body already: it ends the response itself
        fds = streams.dup_sockets(writer, self._server[1])
        if fds is None:
            cast(asyncio.Transport, self._server[1].transport).resume_reading()  # out of fds: mitmproxy relays the rest
            return
        watchdog = getattr(self._handler, "timeout_watchdog", None)
        if watchdog is not None:  # the copy keeps its own idle timeout
            self._disarmed = watchdog.disarm()
            self._disarmed.__enter__()
        idle = float(ctx.options.tcp_timeout) if "tcp_timeout" in ctx.options else 600.0
        if self._tls is not None:
            os.close(fds[0])  # the client is written through its transport, in order with mitmproxy's writes
            self._copy = tlsbody.TlsCopy(fds[1], self._tls, (writer, self._server[1]), left, self._ended, idle)
        else:
            self._copy = CountedSplice(fds[1], fds[0], left, self._ended, idle)
        self._copy.start()

    def cut(self) -> None:
        """mitmproxy ended the flow (client gone, sandbox dropped, daemon exit): stop copying now."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._copy is not None:
            self._copy.finish("cut")
        self.over = True

    def _ended(self, moved: int, why: str | None) -> None:
        self.over = True
        self.moved = moved
        self.complete = why is None
        self._counter.n += moved
        if self._disarmed is not None:
            self._disarmed.__exit__(None, None, None)
            self._disarmed = None
        if self._server is not None:
            self._server[1].transport.abort()  # mitmproxy sees the upstream end: the flow ends, the client closes
