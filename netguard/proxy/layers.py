"""What each listener speaks: sandgate's own protocol detection, and the byte relay that follows a decision.

mitmproxy's default next-layer addon (which can intercept TLS) is never loaded: a connection is
either plain HTTP (parsed, so the Host header can be judged), or relayed untouched. TLS is never
intercepted: the ClientHello is only read for its SNI.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import events, layer, layers
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import modes
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.mode_specs import RegularMode

from netguard import rules
from netguard.audit import Kind


class Relay(layers.TCPLayer):
    """Relays bytes untouched and counts them.

    mitmproxy's flow-backed TCP layer runs an addon hook per chunk, which decouples reading
    from writing: a fast server then fills the proxy's memory (measured: ~0.6x the download
    size). The hookless relay keeps mitmproxy's read-after-drain backpressure; we only count.
    """

    def __init__(self, ctx: Context, on_close: Callable[[Relay], None]) -> None:
        super().__init__(ctx, ignore=True)
        self.up = self.down = 0
        self.t0 = time.monotonic()
        self._on_close: Callable[[Relay], None] | None = on_close

    def relay_messages(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.DataReceived):
            if event.connection is self.context.client:
                self.up += len(event.data)
            else:
                self.down += len(event.data)
        yield from super().relay_messages(event)
        if self._handle_event == self.done and self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(self)


class Counter:
    """Stream callback for HTTP bodies: counts bytes without keeping them (stream_large_bodies)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, data: bytes) -> bytes:
        self.n += len(data)
        return data


def choose(nextlayer: layer.NextLayer, rs: rules.Ruleset, relay: Callable[[Context], Relay]) -> Kind | None:
    """Set `nextlayer.layer` for a connection; the kind it turned out to be, None if not (yet) known.

    Leaving the layer unset makes mitmproxy call again with more of the client's bytes.
    """
    ctx = nextlayer.context
    if len(ctx.layers) == 1 and isinstance(ctx.layers[0], modes.HttpProxy):
        nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.regular)
        return None
    if isinstance(ctx.client.proxy_mode, RegularMode):
        # Inside a CONNECT tunnel that was already allowed: relay bytes, never parse or intercept.
        nextlayer.layer = relay(ctx)
        return None
    # Transparent: the original destination (an IP) is only a fallback for raw TCP.
    assert ctx.server.address is not None
    dst_ip, dst_port = ctx.server.address[0], ctx.server.address[1]
    data: bytes = nextlayer.data_client()  # type: ignore[no-untyped-call]  # mitmproxy: unannotated
    if not data:
        if rules.decide(rs, dst_ip, dst_port).allowed:
            nextlayer.layer = relay(ctx)  # a cidr-allowed address: server-speaks-first protocols must not wait
            return "tcp"
        return None  # wait for the first bytes (SNI or Host header)
    if starts_like_tls_record(data):
        try:
            hello = parse_client_hello(data)
        except ValueError:
            hello = None
        else:
            if hello is None:
                return None  # ClientHello split over several segments
        if hello is not None and hello.sni:
            # Re-target to the *name*: a client sending SNI allowed.test to a blocked IP reaches allowed.test.
            ctx.server.address = (hello.sni, dst_port)
        nextlayer.layer = relay(ctx)
        return "tls"
    if data[:3].isalpha() and b" " in data.split(b"\n", 1)[0]:
        nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.transparent)
        return "http"
    nextlayer.layer = relay(ctx)
    return "tcp"
