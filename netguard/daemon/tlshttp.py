"""The front door's inspected path: TLS terminated and every HTTP/1.1 request judged without mitmproxy.

Measured (issue 25): an inspected connection cost +5.4 to +7.0 ms through mitmproxy, two thirds of it
Python in mitmproxy's layers and hooks, not crypto. A connection this path takes (`takes`: the host is
inspected and allowed by the policy itself, the run brokers no credential and has no corporate proxy,
the client offers HTTP/1.1) is served here with the Gate's own parts:
  - TLS towards the sandbox with the run's leaf, towards the upstream verified against the same trust
    store and name: the very contexts mitmproxy's path uses (netguard.decision.tlsinspect.Material);
  - each request parsed strictly (netguard.daemon.innerhead), checked for fronting
    (netguard.decision.fronting) and judged by the host's `http:` rules (netguard.decision.inspected);
    a refused one gets the Gate's 403 and its request record, and never reaches the upstream;
  - the upstream connection made for the first allowed request (mitmproxy's "lazy" strategy), or, for a
    CONNECT decided already, begun beside the client's handshake (the name is judged; each request still
    waits for its own judgement); kept for the next request; the exchange forwarded by
    netguard.daemon.httpexchange; one request record each.
Nothing here can be handed to mitmproxy later (the TLS is ours): a head it will not read is answered
400/431/501 and the connection ends (fail closed).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from OpenSSL import SSL

from netguard import hosts, rules
from netguard.audit import Limit
from netguard.daemon import connecthead, dial, httpexchange, innerhead, peek, tlshello
from netguard.daemon.chunks import Chunked
from netguard.daemon.httpexchange import Unframed
from netguard.daemon.pipes import SockPipe
from netguard.daemon.tlspipe import TlsError, TlsPipe
from netguard.decision import answers, fronting, inspected, limits, tlsinspect
from netguard.decision.binding import Binding
from netguard.decision.decide import Conn, Decided, Decider
from netguard.decision.tlsinspect import Material

HTTP1, _H2 = b"http/1.1", b"h2"
DRAIN_MAX = 1 << 20  # a refused request's body read and dropped to keep the connection (stream_large_bodies)
_SOURCE = "upstream"


def takes(b: Binding, material: Material, host: str, port: int, hello: tlshello.Hello | None = None) -> bool:
    """This path's case: inspected, allowed by the policy itself, nothing brokered or proxied, and HTTP/1.1.

    HTTP/1.1 is what mitmproxy's path would give the client too: it offers no h2, or this upstream answered
    HTTP/1.1 before (TlsInspect remembers; mitmproxy then serves HTTP/1.1 to a client offering both).
    `hello` None (an explicit CONNECT, decided before the client's hello): the upstream must be known."""
    try:
        name = str(rules.normalise(host))
    except hosts.HostError:
        return False
    if b.secrets or b.ca is None or b.inspection(name, port) is None or b.via(name) is not None:
        return False  # a credential: leak checks, brokering, scrubbing stay mitmproxy's
    known = material.upstream_alpn.get((name, port)) == HTTP1
    if hello is not None and (not hello.sni or not tlshello.offers_http1(hello)):
        return False  # h2 only (gRPC): mitmproxy's, which speaks h2 to the client
    if not known and (hello is None or _H2 in (hello.alpn or ())):
        return False
    return b.allows_by_itself(host, port)


async def tunnel(
    conn: socket.socket, st: Conn, head: connecthead.Head, material: Material, decider: Decider, idle: float,
    bridge: Callable[[socket.socket, socket.socket], bool],
) -> None:  # fmt: skip
    """A CONNECT to an inspected host (its head peeked, `takes` said yes): its 200, then, once the ClientHello
    shows HTTP/1.1, decided and the upstream begun beside the client's handshake; the TLS terminated here.
    (A name vetoed or unresolved since the policy said yes gets the Gate's 403 inside the tunnel.)

    Only the ClientHello says whether the client speaks HTTP/1.1, and it comes after the 200: a client
    offering only h2 (gRPC) is bridged to mitmproxy (`bridge`: its handler on one end of a socketpair, as if
    it were this client), which gets the same CONNECT, decides it (its only decision record) and speaks h2."""
    if len(conn.recv(head.size)) != head.size:  # the head only: it was all there (peeked)
        raise ConnectionError("the peeked request head could not be read")
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(conn, f"{head.version} 200 Connection established\r\n\r\n".encode())
    hello = await _hello(conn, st.binding)
    if hello is None:
        return
    if tlshello.offers_http1(hello):
        # Decided now, not before the 200: a tunnel bridged to mitmproxy below is decided (and recorded) there.
        d = await decider.authorize(st, "connect", head.host, head.port)
        inspected_ = Inspected(conn, st, head.host, head.port, material, decider, d)
        if d.allowed:
            inspected_.prepare()  # the upstream's handshake beside the client's
        await inspected_.serve(idle)
        return
    ours, theirs = socket.socketpair()
    with ours:
        ours.setblocking(False)
        theirs.setblocking(False)
        if not bridge(theirs, conn):  # past its sandbox's share of the daemon's fds: refused, recorded
            theirs.close()
            return
        authority = f"{head.host}:{head.port}".encode()
        await loop.sock_sendall(ours, b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority))
        reply, up = b"", SockPipe(ours)
        while b"\r\n\r\n" not in reply and len(reply) < limits.HEAD_MAX:
            data = await asyncio.wait_for(up.recv(limits.HEAD_MAX), limits.DEADLINE)
            if not data:
                return
            reply += data
        head_end = reply.find(b"\r\n\r\n") + 4
        if not reply.startswith(b"HTTP/1.1 200") or head_end < 4:
            return  # mitmproxy refused it (vetoed since): the client has our 200 already, so it is closed
        await httpexchange.both_ways(SockPipe(conn), up, reply[head_end:], httpexchange.Moved(), idle)


async def _hello(conn: socket.socket, b: Binding) -> tlshello.Hello | None:
    """The tunnel's ClientHello, whole and peeked, within the deadline and HEAD_MAX (netguard.decision.headlimit's
    bound for mitmproxy's TLS layer, with the same refusal); None: refused, malformed, or the client left."""
    data, late = await peek.until(conn, lambda buf: tlshello.whole(buf) or len(buf) >= limits.HEAD_MAX, limits.DEADLINE)
    hello = tlshello.hello_or_none(data)
    if hello is None and b.refusals is not None:
        if len(data) >= limits.HEAD_MAX:
            b.refusals.refuse("head", "tls", f"ClientHello larger than {limits.HEAD_MAX} bytes")
        elif late:
            b.refusals.refuse("deadline", "tls", f"no whole ClientHello within {limits.DEADLINE:g} s")
    return hello


class Inspected:
    """One client connection whose TLS the front door terminates, for `name`:`port` (its CONNECT or SNI).

    `d`: the CONNECT's decision. None (transparent): decided at the first request, as mitmproxy's lazy
    path does, so a connection that sends no request leaves no decision record either."""

    def __init__(
        self, conn: socket.socket, st: Conn, name: str, port: int, material: Material, decider: Decider,
        d: Decided | None = None,
    ) -> None:  # fmt: skip
        self.conn, self.st, self.b, self.kind, self.material = conn, st, st.binding, st.kind, material
        self.name, self.port, self.decider, self.d = str(rules.normalise(name)), port, decider, d
        self._up: TlsPipe | None = None
        self._pending: asyncio.Future[TlsPipe] | None = None  # an upstream begun early (prepare)

    async def serve(self, idle: float) -> None:
        """Requests until the connection ends; every socket but the client's is closed on the way out."""
        try:
            client = await self._accept()
            if client is None:
                return
            while True:
                head = await self._head(client, idle)
                if head is None or not await self._one(client, head, idle):
                    return
        except (OSError, TlsError, TimeoutError, ValueError):
            return  # either side went away or stalled, or a refused chunked body was malformed: the end
        finally:
            self._drop()

    async def _accept(self) -> TlsPipe | None:
        """The sandbox's TLS, with a leaf for the judged name (never a name the client offers)."""
        leaf = self.material.issuer.leaf(self.name)
        conn = SSL.Connection(self.material.client(leaf))
        # mitmproxy's ALPN callback (in the context): http/1.1 only, as an HTTP/1.1 upstream would answer
        conn.set_app_data({"client_alpn": HTTP1, "server_alpn": None, "http2": False})
        conn.set_accept_state()
        client = TlsPipe(self.conn, conn)
        await asyncio.wait_for(client.handshake(), limits.DEADLINE)
        return client

    async def _head(self, client: TlsPipe, idle: float) -> innerhead.Inner | None:
        """The next whole request head, what was read past it given back (None: the client closed, or sent
        one this path refuses). Bounded as mitmproxy's heads are (netguard.decision.headlimit): HEAD_MAX
        bytes, whole within the deadline once begun; a refusal is said in the sandbox's log."""
        buf, loop = b"", asyncio.get_running_loop()
        end = loop.time() + idle
        while True:
            try:
                data = await asyncio.wait_for(client.recv(httpexchange.READ), end - loop.time())
            except TimeoutError:
                if not buf:
                    return None  # idle between requests: closed, as mitmproxy's tcp_timeout does
                await client.send(answers.TIMEOUT)
                self._refused("deadline", f"no whole request head within {limits.DEADLINE:g} s")
                return None
            if not data:
                return None
            if not buf:
                end = loop.time() + limits.DEADLINE  # the head's clock starts with its first byte
            buf += data
            got = innerhead.parse(buf)
            if isinstance(got, innerhead.Inner):
                client.unread(buf[got.size :])
                return got
            if isinstance(got, innerhead.Bad):
                too_large = got.status == 431
                await client.send(answers.TOO_LARGE if too_large else answers.bad_request(got.status, got.why))
                if too_large:
                    self._refused("head", got.why)
                await peek.linger(self.conn)  # a client still sending must read the answer, not a reset
                return None

    def _refused(self, limit: Limit, why: str) -> None:
        if self.b.refusals is not None:
            self.b.refusals.refuse(limit, "http", why)

    async def _one(self, client: TlsPipe, req: innerhead.Inner, idle: float) -> bool:
        """Judge one request, then forward it or refuse it; whether the connection may carry another."""
        await asyncio.sleep(0)  # a loop turn per request: refused ones pipelined back to back would hold the loop
        if self.d is None or not self.d.allowed:  # a refused tunnel's decision answers its first request
            d = self.d or await self.decider.authorize(self.st, self.kind, self.name, self.port)
            self.d = None
            if not d.allowed:  # vetoed or unresolved since the policy said yes: the Gate's 403, the connection goes on
                await client.send(answers.forbidden(d.host, d.port, d.verdict.decision, close=False))
                return await self._skip(client, req)
            self.d = d
        insp = self.b.inspection(self.name, self.port)
        assert insp is not None  # `takes` made sure, and a binding's rules do not change under a connection
        j = inspected.judge(insp, (), self.name, req.method, req.target, req.fields, True)
        assert j is not None  # an inspected host is always judged
        front = fronting.by_host(req.host, self.name, req.host_port, self.port)
        if front is None and req.authority is not None:
            front = fronting.by_target(req.authority, self.name, self.port)
        if front is not None and j.allowed:
            j = inspected.Judged(False, insp.origin, front)
        path = inspected.logged_path(req.target, insp.log_query, ())
        logged = inspected.Logged(self.kind, self.name, self.port, req.method, path, j)
        if not j.allowed:
            text = inspected.refusal_text(req.method, path, self.name, j)
            await client.send(answers.refused_request(text, req.version))
            self._record(logged, 403, 0, 0, 0)
            return await self._skip(client, req)
        return await self._forward(client, req, logged, idle)

    async def _skip(self, client: TlsPipe, req: innerhead.Inner) -> bool:
        """After a refusal: the refused body read and dropped (up to DRAIN_MAX, as mitmproxy holds one before its
        403), so the connection can go on; else it ends with a lingering close (the 403 must not be reset away)."""
        left = -1 if req.body == "chunked" else req.body
        chunks = Chunked() if left < 0 else None
        if left and not req.expect and (chunks is not None or left <= DRAIN_MAX):  # 100-continue: no body comes
            budget = DRAIN_MAX
            while left and budget > 0:
                await asyncio.sleep(0)  # a loop turn per piece, as in httpexchange
                data = await asyncio.wait_for(client.recv(min(budget, httpexchange.READ if left < 0 else left)), 5)
                if not data:
                    return False
                end = chunks.feed(data) if chunks is not None else None
                if end is not None:
                    client.unread(data[end:])
                left = 0 if end is not None else -1 if chunks is not None else left - len(data)
                budget -= len(data)
        if left == 0 and not req.close:
            return True
        await peek.linger(self.conn)
        return False

    async def _forward(self, client: TlsPipe, req: innerhead.Inner, logged: inspected.Logged, idle: float) -> bool:
        moved, t0 = httpexchange.Moved(), time.monotonic()
        ok, failed = False, None
        try:
            up = await self._upstream()
            sent = httpexchange.Sent(req.head, req.body, req.method, req.close, switch=req.upgrade)
            ok = await httpexchange.exchange(client, up, sent, moved, idle)
        except TlsError as e:
            failed = tlsinspect.upstream_failure(self.name, self.port, str(e))
            await client.send(answers.bad_gateway(failed.removeprefix("sandgate: "), _SOURCE))
        except Unframed as e:
            failed = str(e)
            if moved.status is None:
                await client.send(answers.bad_gateway(failed, _SOURCE))
        except (OSError, TimeoutError) as e:
            failed = str(e) or type(e).__name__
            raise
        finally:
            ms = int((time.monotonic() - t0) * 1000)
            if failed is not None:
                logged.judged = inspected.Judged(True, logged.judged.rule, f"failed: {failed}")
            self._record(logged, None if failed is not None else moved.status, moved.up, moved.down, ms)
        if not moved.reusable:
            self._drop()
        return ok

    def prepare(self) -> None:
        """Start the upstream's connect and TLS handshake now, beside the client's handshake and first request
        (a CONNECT decided already): the name is judged, so only its requests wait for their judgement."""
        self._pending = asyncio.ensure_future(self._connect())

    async def _upstream(self) -> TlsPipe:
        """The kept upstream TLS connection if it is still idle and open; else a new, verified one."""
        if self._up is not None and not self._up.idle_open():
            self._drop()
        if self._up is None:
            task, self._pending = self._pending, None
            early = await task if task is not None else None
            if early is not None and not early.idle_open():  # begun at the CONNECT, closed by the upstream since
                early.sock.close()
                early = None
            self._up = early or await self._connect()
        return self._up

    async def _connect(self) -> TlsPipe:
        assert self.d is not None  # decided before the first request went on
        sock = await dial.connect(self.d)
        if sock is None:
            raise TlsError(f"cannot connect to {self.d.verdict.ip}:{self.port}")
        conn = SSL.Connection(self.material.server)
        tlsinspect.verify_name(conn, self.name)
        conn.set_alpn_protos([HTTP1])
        conn.set_connect_state()
        up = TlsPipe(sock, conn)
        try:
            await asyncio.wait_for(up.handshake(), limits.DEADLINE)
        except BaseException:
            sock.close()
            raise
        self.material.remember_alpn((self.name, self.port), HTTP1)  # what mitmproxy's path learns of it too
        return up

    def _drop(self) -> None:
        if self._up is not None:
            self._up.sock.close()
            self._up = None
        if self._pending is not None:  # never used: cancelled, or closed once made
            self._pending.cancel()
            self._pending.add_done_callback(_close_made)
            self._pending = None

    def _record(self, logged: inspected.Logged, status: int | None, up: int, down: int, ms: int) -> None:
        assert self.d is not None  # a refused request counts among the run's capped denials
        self.b.write_decision(logged.record(self.b.task, self.d.id, status, up, down, ms))


def _close_made(task: asyncio.Future[TlsPipe]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().sock.close()
