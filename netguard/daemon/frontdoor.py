"""The front door: a listener's accept loop that relays the two common cases without mitmproxy.

Measured (issue 15): a new connection through mitmproxy costs ~2-3 ms in its per-connection
handler, layer setup and hook turns before the first byte moves; our decision is ~5 % of it. So the
plainest flows never enter mitmproxy:
  transparent  the socket's first bytes are *peeked* (never read) until a whole TLS ClientHello is
               there; an SNI that the policy allows by itself, not inspected, is decided here
  explicit     the request head is peeked until it is one plain `CONNECT host:port HTTP/1.x`;
               allowed, not inspected: only then is the head (and only the head: what follows is
               the tunnel's) read, the upstream connect started and the `200` sent at the same time;
               a plain `GET http://...` the same way: netguard.daemon.plainhttp forwards it
All are decided by the same code as the Gate (netguard.decision.decide: same verdict, pin, record) and
reached by a sandbox's drop (tunnels through handoff's registry). Everything else (inspection, a policy
that does not allow the name by itself) is handed to mitmproxy as the socket it would have accepted:
nothing was consumed, and the first head or hello its layers read is already whole.

The shared daemon's limits start here (netguard.decision.limits): a connection past its sandbox's share
is closed at accept; one that has not sent a whole ClientHello or request head within the deadline,
or whose head outgrows HEAD_MAX, is refused before mitmproxy (which would buffer it without bound)
sees a byte. Each refusal is recorded in that sandbox's log.

Fail closed: an exception here closes the client's connection and is logged; undecided bytes are
never relayed.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from mitmproxy import platform

from netguard import hosts, rules
from netguard.audit import Kind, Limit
from netguard.daemon import connecthead, dial, firstbytes, peek, plainhead, plainhttp, tlshello, viaproxy
from netguard.daemon.doorflow import Flow
from netguard.daemon.fdlimit import Budget
from netguard.decision import answers, limits
from netguard.decision.binding import Binding
from netguard.decision.decide import Conn, Decided, Decider, norm_key
from netguard.relay import splice

if TYPE_CHECKING:  # loaded with mitmproxy (netguard.daemon.mitmload): never imported by a cold daemon's door
    from netguard.decision.tlsinspect import Material

Mode = Literal["regular", "transparent"]
Handover = Literal["mitmproxy"]  # nothing read, nothing decided: mitmproxy takes the connection
_HANDOVER: Handover = "mitmproxy"
Fallback = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

PEEK_WAIT = 1.0  # seconds for the SNI of a cidr-allowed flow; a slower one is judged by its address
REFUSED_PAUSE = 0.1  # seconds a listener stops accepting after its sandbox's share refused a connection
ACCEPT_BURST = 64
FAST = True  # False: every connection goes to mitmproxy (what the tests compare the front door with)


def _stderr(line: str) -> None:
    print(f"sandgate: front door: {line}", file=sys.stderr, flush=True)


class FrontDoor:
    """Accepts on one listener of one slot; the plain cases are relayed here, the rest go to `fallback`."""

    def __init__(
        self,
        sock: socket.socket,
        slot: int,
        mode: Mode,
        bindings: dict[int, Binding],
        decider: Decider,
        fallback: Fallback,
        *,
        idle: float,
        budget: Budget | None = None,
        share: limits.Share | None = None,
        refusals: limits.Refusals | None = None,
        log: Callable[[str], None] = _stderr,
        tls: Callable[[Binding], Material | None] | None = None,
    ) -> None:
        self.sock, self.slot, self.mode = sock, slot, mode
        self._bindings, self._decider, self._fallback = bindings, decider, fallback
        self._idle, self._budget, self._log = idle, budget, log
        self._tls = tls  # a sandbox's TLS material once mitmproxy is loaded: the inspected path (tlshttp)
        self._share, self._refusals = share or limits.Share(), refusals
        self._kind: Kind = "connect" if mode == "regular" else "tcp"  # what a refusal here is recorded as
        self.deciding: set[asyncio.Task[None]] = set()  # not yet relayed nor handed over: cancelled by close()
        self.relayed: set[asyncio.Future[None]] = set()  # spliced here: cut through handoff.cut_slots
        self._loop = asyncio.get_running_loop()
        self._open = False

    def start(self, backlog: int = 4096) -> None:
        self.sock.setblocking(False)
        self.sock.listen(backlog)
        self._loop.add_reader(self.sock.fileno(), self._accept)
        self._open = True

    def close(self) -> None:
        """Stop accepting (the listener closes) and end every connection still being decided."""
        if self._open:
            self._loop.remove_reader(self.sock.fileno())
            self._open = False
        self.sock.close()
        for task in list(self.deciding):
            task.cancel()

    def _accept(self) -> None:
        refused = False
        for _ in range(ACCEPT_BURST):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # EMFILE and friends: pause instead of spinning on a readable listener
                self._log(f"accept failed: {e}; pausing for a second")
                self._pause(1.0)
                return
            why = self._budget.admit(self._share) if self._budget is not None else None
            if why is not None:  # this sandbox's share is used up (or the daemon's fds soon): never EMFILE
                conn.close()
                self._refused("connections", self._kind, why)
                refused = True
                continue
            conn.setblocking(False)
            dial.nodelay(conn)  # the client's side of the relay (mitmproxy sets it on what it takes)
            task = self._loop.create_task(self._serve(conn))
            self.deciding.add(task)
            task.add_done_callback(self.deciding.discard)
        if refused:  # a flood of connections past the share costs the daemon one burst per pause
            self._pause(REFUSED_PAUSE)

    def _pause(self, seconds: float) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self._loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        if self._open:
            self._loop.add_reader(self.sock.fileno(), self._accept)

    def _give(self) -> None:
        if self._budget is not None:
            self._budget.release(self._share)

    def _refused(self, limit: Limit, kind: Kind, why: str) -> None:
        if self._refusals is not None:
            self._refusals.refuse(limit, kind, why)

    async def _serve(self, conn: socket.socket) -> None:
        """One connection: relayed here, handed to mitmproxy, or closed (refused, failed, or an error: fail closed)."""
        flow: Flow | Handover | None = None
        try:
            b = self._bindings.get(self.slot)
            if b is not None:  # else a listener without a policy: refused (fail closed)
                flow = await (self._explicit(conn, b) if self.mode == "regular" else self._transparent(conn, b))
        except Exception as e:
            self._log(f"closed a connection after an error: {type(e).__name__}: {e}")
            flow = None
        finally:
            if flow is None:
                conn.close()
                self._give()  # a relayed flow gives it back when its relay ends, a handed one when mitmproxy is done
        task = asyncio.current_task()
        if isinstance(flow, Flow):
            self.deciding.discard(task)  # from now on a drop cuts it through handoff
            self.relayed.add(flow.over)
            flow.over.add_done_callback(self.relayed.discard)
        elif flow == _HANDOVER:
            self.deciding.discard(task)  # from now on the fallback's owner cuts it
            self._hand_over(conn)

    def _hand_over(self, conn: socket.socket, as_if: tuple[Any, Any] | None = None) -> None:
        """mitmproxy's handler on `conn` as asyncio.start_server would have started it: no loop turn more
        (the handler's task starts as the transport connects; nothing was read from the socket).

        `as_if`: `conn` is one end of a socketpair bridging a client's tunnel (tlshttp.tunnel, through `_bridge`):
        mitmproxy sees that client's own (peer, local) addresses."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                if as_if is not None:  # asyncio keeps a transport's addresses in _extra, read by get_extra_info
                    writer.transport._extra.update(peername=as_if[0], sockname=as_if[1])  # type: ignore[attr-defined]
                await self._fallback(reader, writer)
            finally:
                self._give()

        def failed(t: asyncio.Task[Any]) -> None:
            if t.cancelled() or t.exception() is not None:
                conn.close()
                self._give()

        proto = asyncio.StreamReaderProtocol(asyncio.StreamReader(), handle)
        t = self._loop.create_task(self._loop.connect_accepted_socket(lambda: proto, sock=conn))
        t.add_done_callback(failed)

    def _bridge(self, theirs: socket.socket, client: socket.socket) -> bool:
        """mitmproxy's handler on `theirs` for `client`'s tunnel, as one more connection of its sandbox's share:
        the socketpair and mitmproxy's upstream are two more fds (fdlimit.PER_CONNECTION), never uncounted."""
        try:
            addresses = (client.getpeername(), client.getsockname())
        except OSError:
            return False  # the client has gone: nothing to bridge
        why = self._budget.admit(self._share) if self._budget is not None else None
        if why is not None:
            self._refused("connections", self._kind, why)
            return False
        self._hand_over(theirs, as_if=addresses)  # its unit is given back when mitmproxy is done with it
        return True

    # ---- the two listeners ----------------------------------------------------------------------

    async def _transparent(self, conn: socket.socket, b: Binding) -> Flow | Handover | None:
        """mitmproxy's choice (layers.choose) for the cases it relays untouched; anything else is its own."""
        try:
            dst = platform.original_addr(conn)  # type: ignore[misc]  # None only off Linux
        except Exception:
            return _HANDOVER  # mitmproxy logs it and closes, as before
        dst_ip, dst_port = str(dst[0]), int(dst[1])
        first: bytes | None = None
        if _plain(b, dst_ip, dst_port):  # cidr-allowed: judged by its address, whatever it sends, if anything
            if not peek.now(conn):
                return await self._relay(conn, b, "tcp", dst_ip, dst_port) if _FAST() else _HANDOVER
            seen = (await peek.until(conn, tlshello.whole, PEEK_WAIT))[0]
            hello = tlshello.hello_or_none(seen)  # an SNI, if any, is judged instead; plain HTTP by its Host (below)
            if hello is None and firstbytes.looks_like_http(seen) and (first := await self._first(conn)) is None:
                return None
        else:
            first = await self._first(conn)  # judged by its SNI or Host: nothing goes on before it is whole
            if first is None:
                return None
            hello = tlshello.hello_or_none(first)
        if not _FAST():
            return _HANDOVER  # no kernel relay on this OS: mitmproxy relays everything
        if hello is None:  # not TLS: plain HTTP is judged by its Host header; else incomplete or malformed
            req = _takes(b, first, dst_port) if first is not None else None
            return await self._plain_http(conn, b, req, dst_port) if req is not None else _HANDOVER
        # The name is what is judged (a client sending SNI allowed.test to a blocked IP reaches allowed.test);
        # without SNI, the original address, as mitmproxy does.
        host = hello.sni or dst_ip
        if _plain(b, host, dst_port):
            return await self._relay(conn, b, "tls", host, dst_port)
        material = self._inspects(b, host, dst_port, hello)
        if material is None:
            return _HANDOVER
        st = Conn(b, _peer(conn), "tls")
        await _tlshttp().Inspected(conn, st, host, dst_port, material, self._decider).serve(self._idle)
        return None

    async def _relay(self, conn: socket.socket, b: Binding, kind: Kind, host: str, port: int) -> Flow | None:
        """Decide (the Gate's code, its record), connect to the pinned address, splice; None: refused or failed."""
        d = await self._decider.authorize(Conn(b, _peer(conn), kind), kind, host, port)
        if not d.allowed:
            return None  # refused: recorded, closed (mitmproxy closes it too)
        if (proxy := b.via(d.host)) is not None:  # the run's corporate proxy, asked for the checked address
            up, _ = await viaproxy.dial_via(b, d, proxy, kind)
        else:
            up = await dial.connect(d)
        if up is None:
            return None
        flow = Flow(b, d, kind, self.slot, self._give)
        flow.start(conn, up, self._idle)
        return flow

    async def _first(self, conn: socket.socket) -> bytes | None:
        """The connection's first unit (ClientHello, request head), whole and left in the socket; None when it
        did not come within the deadline or outgrew HEAD_MAX: refused (431 to an HTTP request), recorded."""
        seen: list[firstbytes.State] = ["more"]  # the predicate's verdict on the last peek: judged once per wake

        def whole(buf: bytes) -> bool:
            seen[0] = firstbytes.state(buf)
            return seen[0] != "more"

        data, late = await peek.until(conn, whole, limits.DEADLINE)
        st = seen[0] if data else "more"
        if st == "ready":
            return data
        if st == "more":  # the client went away first (nothing to record), or the deadline came
            if late:
                why = f"no whole request head or ClientHello within {limits.DEADLINE:g} s"
                self._refused("deadline", self._kind, why)
            return None
        http = firstbytes.looks_like_http(data) and not firstbytes.is_connect(data)
        self._refused("head", "http" if http else self._kind, f"request head larger than {limits.HEAD_MAX} bytes")
        if http:
            await self._loop.sock_sendall(conn, answers.TOO_LARGE)
            await peek.linger(conn)
        return None

    async def _plain_http(
        self, conn: socket.socket, b: Binding, req: plainhead.Request, port: int | None
    ) -> Handover | None:
        """Plain HTTP/1.1 requests forwarded in turn (netguard.daemon.plainhttp); mitmproxy's from the first it won't take."""
        client = plainhttp.Client(conn, b, self._decider, _peer(conn))
        return _HANDOVER if await client.serve(req, self._first, partial(_takes, b, port=port), self._idle) else None

    async def _explicit(self, conn: socket.socket, b: Binding) -> Flow | Handover | None:
        data = await self._first(conn)
        if data is None:
            return None
        head = connecthead.parse(data)
        if not isinstance(head, connecthead.Head) and (req := _takes(b, data, None)):
            return await self._plain_http(conn, b, req, None)
        if not _FAST() or not isinstance(head, connecthead.Head):
            return _HANDOVER
        if not _plain(b, head.host, head.port):  # the common CONNECT is judged once; only the rest may be inspected
            if (material := self._inspects(b, head.host, head.port)) is None:
                return _HANDOVER
            st = Conn(b, _peer(conn), "connect")
            await _tlshttp().tunnel(conn, st, head, material, self._decider, self._idle, self._bridge)
            return None
        if len(conn.recv(head.size)) != head.size:  # the head only: it was all there (peeked)
            raise ConnectionError("the peeked request head could not be read")
        st = Conn(b, _peer(conn), "connect")
        d = await self._decider.authorize(st, "connect", head.host, head.port)
        if not d.allowed:  # allowed by the rules, then vetoed (rebinding) or unresolved: mitmproxy's 403
            await self._loop.sock_sendall(conn, answers.forbidden(d.host, d.port, d.verdict.decision))
            return None
        if (proxy := b.via(d.host)) is not None:  # the tunnel first: a refusal is the client's 502, not a 200
            up, why = await viaproxy.dial_via(b, d, proxy, "connect")
            if up is None:
                await self._loop.sock_sendall(conn, answers.bad_gateway(why or "no tunnel"))
                return None
            return await self._established(conn, b, d, up, head.version)
        up = dial.start(d)  # the SYN leaves before the 200: the handshake overlaps the client's turn
        if up is None:
            return None
        return await self._established(conn, b, d, up, head.version, dial.connected)

    def _inspects(self, b: Binding, host: str, port: int, hello: tlshello.Hello | None = None) -> Material | None:
        """The run's TLS material when the inspected path takes `host:port` (tlshttp.takes), else None."""
        material = self._tls(b) if _FAST() and self._tls is not None else None
        return material if material is not None and _tlshttp().takes(b, material, host, port, hello) else None

    async def _established(
        self,
        conn: socket.socket,
        b: Binding,
        d: Decided,
        up: socket.socket,
        version: str,
        pending: Callable[[socket.socket], Awaitable[bool]] | None = None,
    ) -> Flow | None:
        """A CONNECT's 200, then the relay. `pending`: the upstream's connect is still under way, awaited
        after the 200 (None: the tunnel is open already, e.g. through the corporate proxy)."""
        try:
            await self._loop.sock_sendall(conn, f"{version} 200 Connection established\r\n\r\n".encode())
            if pending is not None and not await pending(up):
                return None
        except BaseException:
            up.close()
            raise
        flow = Flow(b, d, "connect", self.slot, self._give)
        flow.start(conn, up, self._idle)
        return flow


def _plain(b: Binding, host: str, port: int) -> bool:
    """The fast path's case: the policy allows `host:port` by itself (no question, no learn), not inspected.

    Pure: nothing is recorded, so mitmproxy can still decide anything else from the start."""
    try:
        name = str(rules.normalise(host))
    except hosts.HostError:
        return False
    if b.inspection(name, port) is not None:  # inspected or a credential's host: mitmproxy terminates TLS
        return False
    return b.allows_by_itself(host, port)


def _takes(b: Binding, head: bytes, port: int | None) -> plainhead.Request | None:
    """The plain-HTTP path's case: a plain head (plainhead.request), `_plain`, no credential to scan for and no
    corporate proxy to go through."""
    req = plainhead.request(head, port) if _FAST() else None
    if req is None or b.secrets or not _plain(b, req.host, req.port) or b.via(norm_key(req.host, 0)[0], True):
        return None
    return req


def _tlshttp() -> Any:
    """netguard.daemon.tlshttp, imported once mitmproxy's TLS material exists (it needs pyOpenSSL's)."""
    from netguard.daemon import tlshttp

    return tlshttp


def _peer(conn: socket.socket) -> tuple[str, int] | None:
    try:
        p = conn.getpeername()
    except OSError:
        return None
    return (str(p[0]), int(p[1]))


def _FAST() -> bool:  # reads the module switch at call time (tests flip FAST)
    return FAST and splice.AVAILABLE
