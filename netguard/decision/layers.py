"""What each listener speaks: sandgate's own protocol detection, and the byte relay that follows a decision.

mitmproxy's default next-layer addon is never loaded: a connection is plain HTTP (parsed, so the
Host header can be judged), relayed untouched, or, only for a destination whose allow entry asks
for inspection (Binding.inspection), TLS terminated by the proxy (netguard.decision.tlsinspect) and
parsed as HTTP. Any other TLS is relayed: its ClientHello is only read for the SNI.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from mitmproxy.connection import ConnectionState
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import commands, events, layer, layers
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import modes
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.layers.tls import HTTP_ALPNS, ClientTLSLayer, ServerTLSLayer, parse_client_hello
from mitmproxy.proxy.mode_specs import RegularMode

from netguard import hosts, rules
from netguard.audit import Kind
from netguard.relay import handoff

Inspects = Callable[[str, int], rules.Inspection | None]  # Binding.inspection


class Relay(layers.TCPLayer):
    """Relays bytes untouched and counts them.

    mitmproxy's flow-backed TCP layer runs an addon hook per chunk, which decouples reading
    from writing: a fast server then fills the proxy's memory (measured: ~0.6x the download
    size). The hookless relay keeps mitmproxy's read-after-drain backpressure; we only count.
    Once the upstream is connected, the sockets leave mitmproxy (netguard.relay.handoff) and
    the kernel moves the bytes (netguard.relay.splice), here or in a relay worker; the close
    record is written when that relay ends (`_finish`).
    """

    def __init__(
        self, ctx: Context, on_close: Callable[[Relay], None], handlers: Mapping[Any, Any] | None = None
    ) -> None:
        super().__init__(ctx, ignore=True)
        self.up = self.down = 0
        self.t0 = time.monotonic()
        self._on_close: Callable[[Relay], None] | None = on_close
        self._handlers = handlers
        self.handoff: handoff.Handoff | None = None

    def start(self, event: events.Event) -> layer.CommandGenerator[None]:
        yield from super().start(event)
        handler = handoff.handler_of(self._handlers, self.context.client) if self._handlers else None
        if handler is not None and self._handle_event == self.relay_messages:
            # Later, not now: the client's bytes mitmproxy queued during the connect are relayed first.
            asyncio.get_running_loop().call_soon(self._take, handler)

    _handle_event = start

    def _take(self, handler: Any) -> None:
        if self._handle_event != self.relay_messages or self.handoff is not None:
            return  # closed meanwhile
        slot = self.context.client.proxy_mode.listen_port() or 0  # what a sandbox's drop cuts (handoff.cut_slots)
        h = handoff.Handoff(handler, self.context.client, self.context.server, slot, self._finish)
        if h.take(float(self.context.options.tcp_timeout)):
            self.handoff = h

    def relay_messages(self, event: events.Event) -> layer.CommandGenerator[None]:
        h = self.handoff
        if h is not None and (h.spliced or not isinstance(event, events.DataReceived)):
            yield from self._handed_off(event)
            return
        if isinstance(event, events.DataReceived):
            if event.connection is self.context.client:
                self.up += len(event.data)
            else:
                self.down += len(event.data)
        yield from super().relay_messages(event)
        self._closed()

    def _handed_off(self, event: events.Event) -> layer.CommandGenerator[None]:
        """Before the splice starts (mitmproxy still relays the bytes it had read) a close cuts both sides.
        Once spliced, mitmproxy holds no socket: a close is its own transports given up, and the relay goes on."""
        h = self.handoff
        assert h is not None
        if h.spliced and isinstance(event, events.ConnectionClosed):
            return  # the end comes from the relay (_finish)
        h.cut("closed by the proxy" if isinstance(event, events.ConnectionClosed) else "unexpected data")
        self._finish()
        for conn in (self.context.server, self.context.client):
            if conn.state is not ConnectionState.CLOSED:
                yield commands.CloseConnection(conn)

    def _finish(self) -> None:
        """The relay ended (by itself, cut, or its worker died): its counts, then the close record."""
        h = self.handoff
        assert h is not None
        if self._handle_event == self.done:
            return  # the relay's end already counted and recorded it
        self.up, self.down = self.up + h.up, self.down + h.down
        self._handle_event = self.done  # type: ignore[method-assign]  # mitmproxy: the layer's state is its handler
        self._closed()

    def _closed(self) -> None:
        if self._handle_event == self.done and self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(self)


class Refuse(layer.Layer):
    """Closes the client connection: inspection was asked for and the bytes are not HTTP (never relay blindly)."""

    def __init__(self, ctx: Context, why: str) -> None:
        super().__init__(ctx)
        self.why = why

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            self.context.client.error = f"sandgate: {self.why}"
            yield commands.CloseConnection(self.context.client)


def _looks_like_http(data: bytes) -> bool:
    return data[:3].isalpha() and b" " in data.split(b"\n", 1)[0]


def _intercept(ctx: Context, name: str) -> ServerTLSLayer:
    """mitmproxy's TLS stack (as its next_layer addon builds it) for `name`: the leaf's and the upstream's name.

    connection_strategy "lazy": the outer server layer never connects by itself; HttpLayer opens
    the upstream per request (after the Gate judged it), with `name` as SNI.
    """
    ctx.server.sni = name
    server_tls = ServerTLSLayer(ctx)
    server_tls.child_layer = ClientTLSLayer(ctx)
    return server_tls


def _decrypted(nextlayer: layer.NextLayer, data: bytes) -> bool:
    """The plaintext of an intercepted connection: HTTP (by ALPN or its first line), else refused."""
    ctx = nextlayer.context
    if ctx.client.alpn in HTTP_ALPNS or (data and _looks_like_http(data)):
        nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.transparent)
        return True
    if data:
        nextlayer.layer = Refuse(ctx, "inspected destination: the decrypted bytes are not HTTP")
        return True
    return False  # wait for the first plaintext bytes


def _hello_sni(data: bytes) -> str | bool | None:
    """The ClientHello's SNI; None when it has none or cannot be parsed; False when it is still incomplete."""
    try:
        hello = parse_client_hello(data)
    except ValueError:
        return None
    if hello is None:
        return False
    return hello.sni or None


def _name(host: str) -> str:
    try:
        return str(rules.normalise(host))
    except hosts.HostError:
        return host


def _tunnel(nextlayer: layer.NextLayer, relay: Callable[[Context], Relay], inspection: Inspects) -> None:
    """Inside an allowed CONNECT tunnel: relay, unless its host:port is inspected."""
    ctx = nextlayer.context
    assert ctx.server.address is not None
    host, port = ctx.server.address[0], ctx.server.address[1]
    if inspection(_name(host), port) is None:  # normalised: a credential's host is matched exactly
        nextlayer.layer = relay(ctx)  # never parse or intercept
        return
    data: bytes = nextlayer.data_client()  # type: ignore[no-untyped-call]  # mitmproxy: unannotated
    if not data:
        return
    if starts_like_tls_record(data):
        # The CONNECT host is what was judged: the client's SNI never names the leaf or the upstream.
        nextlayer.layer = _intercept(ctx, _name(host))
    elif _looks_like_http(data):
        nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.transparent)  # request rules still apply
    else:
        nextlayer.layer = Refuse(ctx, f"inspected destination {host}:{port}: the bytes are neither TLS nor HTTP")


def choose(
    nextlayer: layer.NextLayer, rs: rules.Ruleset, relay: Callable[[Context], Relay], inspection: Inspects
) -> Kind | None:
    """Set `nextlayer.layer` for a connection; the kind it turned out to be, None if not (yet) known.

    Leaving the layer unset makes mitmproxy call again with more of the client's bytes.
    """
    ctx = nextlayer.context
    if ctx.layers and isinstance(ctx.layers[-1], ClientTLSLayer):
        _decrypted(nextlayer, nextlayer.data_client())  # type: ignore[no-untyped-call]  # mitmproxy: unannotated
        return None
    if len(ctx.layers) == 1 and isinstance(ctx.layers[0], modes.HttpProxy):
        nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.regular)
        return None
    if isinstance(ctx.client.proxy_mode, RegularMode):
        _tunnel(nextlayer, relay, inspection)
        return None
    # Transparent: the original destination (an IP) is only a fallback for raw TCP.
    assert ctx.server.address is not None
    dst_ip, dst_port = ctx.server.address[0], ctx.server.address[1]
    data: bytes = nextlayer.data_client()  # type: ignore[no-untyped-call]  # mitmproxy: unannotated
    if not data:
        if rules.decide(rs, dst_ip, dst_port).allowed and inspection(dst_ip, dst_port) is None:
            nextlayer.layer = relay(ctx)  # a cidr-allowed address: server-speaks-first protocols must not wait
            return "tcp"
        return None  # wait for the first bytes (SNI or Host header)
    if starts_like_tls_record(data):
        sni = _hello_sni(data)
        if sni is False:
            return None  # ClientHello split over several segments
        if isinstance(sni, str):
            # Re-target to the *name*: a client sending SNI allowed.test to a blocked IP reaches allowed.test.
            ctx.server.address = (sni, dst_port)
            if inspection(_name(sni), dst_port) is not None:
                nextlayer.layer = _intercept(ctx, _name(sni))
                return "tls"
        nextlayer.layer = relay(ctx)  # no SNI or not inspected: the bytes pass untouched
        return "tls"
    if _looks_like_http(data):
        nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.transparent)
        return "http"
    if inspection(dst_ip, dst_port) is not None:
        nextlayer.layer = Refuse(ctx, f"inspected destination {dst_ip}:{dst_port}: the bytes are not HTTP")
        return "tcp"
    nextlayer.layer = relay(ctx)
    return "tcp"
