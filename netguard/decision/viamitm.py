"""mitmproxy's own flows through the run's corporate proxy: inspected TLS, plain HTTP and its raw TCP relays.

mitmproxy tunnels a connection through an upstream HTTP proxy when its `via` is set: its
HttpUpstreamProxy layer opens a connection to the proxy and sends CONNECT there. The Gate sets
`via` on an allowed request's server connection (`spec`, in requestheaders) and puts the same
layer under a raw relay (`tunnelled`, in next_layer). Then, three checks that only the proxy sees
what the Gate allowed, at the address it checked:
  server_connect   fires for the connection to the *proxy*; `inner` names the connection it carries,
                   which the Gate decides as it decides any other (a denial: the proxy is never
                   dialled), and `opened` checks that it goes to this run's own proxy
  CONNECT          `connect_upstream` (mitmproxy's http_connect_upstream hook) rewrites the target to
                   the checked address (mitmproxy would send the name) and adds Proxy-Authorization
  refusal          a proxy's non-2xx answer (or its unreachable port) is one `request` record in
                   the sandbox's log, as for the front door's tunnels (netguard.daemon.viaproxy);
                   the client gets mitmproxy's 502 (plain and inspected HTTP) or a close (relays)
Plain HTTP goes through the proxy as a CONNECT tunnel to port 80 too (mitmproxy sends absolute-form
requests only in its upstream mode): the pin holds for it as well.

One wrapper around each of two methods of HttpUpstreamProxy (the tunnel's creation, its handshake
answer): `install` fails loudly if they are gone (a mitmproxy upgrade), as netguard.decision.headlimit.
"""

from __future__ import annotations

import weakref
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from mitmproxy import connection, http
from mitmproxy.net.server_spec import ServerSpec
from mitmproxy.proxy import commands, layer
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import _upstream_proxy

from netguard import upstreamproxy
from netguard.audit import Kind, request_record
from netguard.decision.binding import Binding
from netguard.decision.decide import Decided
from netguard.upstreamproxy import Proxy

UNREACHABLE = "0.0.0.0:0"  # the CONNECT target if a tunnel was never judged: any proxy refuses it (fail closed)


@dataclass
class _Tunnel:
    """A connection to the corporate proxy that the Gate allowed: for whom, to where, through which proxy."""

    binding: Binding
    decided: Decided
    proxy: Proxy
    kind: Kind
    target: str = UNREACHABLE


_inner: weakref.WeakKeyDictionary[connection.Server, connection.Server] = weakref.WeakKeyDictionary()
_judged: weakref.WeakKeyDictionary[connection.Server, _Tunnel] = weakref.WeakKeyDictionary()
_installed: list[bool] = []


def install() -> None:
    """Remember each tunnel's inner connection and record each refused handshake. Once per process."""
    if _installed:
        return
    cls = _upstream_proxy.HttpUpstreamProxy
    init, handshake_error = cls.__init__, cls.on_handshake_error
    if not hasattr(cls, "start_handshake") or not hasattr(cls, "make"):
        raise RuntimeError("mitmproxy's upstream proxy layer changed: sandgate cannot tunnel through it")

    def remembered(self: Any, ctx: Context, tunnel_conn: connection.Server, send_connect: bool) -> None:
        init(self, ctx, tunnel_conn, send_connect)
        _inner[tunnel_conn] = ctx.server

    def recorded(self: Any, err: str) -> Generator[commands.Command, Any, None]:
        failed(self.tunnel_connection, err)  # a refusal (407...), garbage, or the proxy closing first
        yield from handshake_error(self, err)

    cls.__init__ = remembered  # type: ignore[method-assign]
    cls.on_handshake_error = recorded  # type: ignore[method-assign]
    _installed.append(True)


def spec(proxy: Proxy | None) -> ServerSpec | None:
    """mitmproxy's `via` for `proxy` (None: direct)."""
    return ("http", (proxy.host, proxy.port)) if proxy is not None else None


def route(flow: http.HTTPFlow, proxy: Proxy | None) -> None:
    """An allowed request's upstream goes through `proxy` (None: direct): mitmproxy reads `via` when it
    opens or reuses a server connection for it (a reused one must have the same `via`)."""
    want, srv = spec(proxy), flow.server_conn
    if srv.via == want:
        return
    if srv.state is connection.ConnectionState.CLOSED:
        srv.via = want
    else:  # an open connection cannot change its route: this request gets a fresh one
        flow.server_conn = connection.Server(address=srv.address, via=want)


def tunnelled(ctx: Context, relay: layer.Layer, proxy: Proxy) -> layer.Layer:
    """`relay` under mitmproxy's tunnel to `proxy`: its OpenConnection becomes CONNECT through the proxy."""
    ctx.server.via = spec(proxy)
    stack = _upstream_proxy.HttpUpstreamProxy.make(ctx, send_connect=True)
    top = stack[0]
    stack[-1].child_layer = relay  # type: ignore[attr-defined]  # a TunnelLayer's child
    return top


def inner(server: connection.Server) -> connection.Server | None:
    """The connection `server` (a connection to a corporate proxy) carries; None if it is no tunnel."""
    return _inner.get(server)


def opened(b: Binding, d: Decided, kind: Kind, server: connection.Server) -> str | None:
    """The Gate allowed `d` through the tunnel `server`: None if `server` goes to this run's own proxy for
    `d.host` (remembered for the CONNECT), else why it is refused (fail closed: never someone else's)."""
    proxies = [p for p in (b.via(d.host), b.via(d.host, plain_http=True)) if p is not None]
    proxy = next((p for p in proxies if (p.host, p.port) == server.address), None)
    if proxy is None or d.verdict.ip is None:
        return "sandgate: this connection may not go through that proxy"
    by_name = b.upstream_proxy is not None and b.upstream_proxy.by_name
    _judged[server] = _Tunnel(b, d, proxy, kind, upstreamproxy.target(d.verdict.ip, d.host, d.port, by_name))
    return None


def connect_upstream(flow: http.HTTPFlow) -> None:
    """The CONNECT mitmproxy is about to send to the proxy: to the checked address, with the credentials."""
    t = _judged.get(flow.server_conn)
    target = t.target if t is not None else UNREACHABLE
    host, _, port = target.rpartition(":")
    flow.request.host, flow.request.port = host.strip("[]"), int(port)
    flow.request.authority = target
    if "host" in flow.request.headers:
        flow.request.headers["host"] = target
    auth = t.proxy.authorization() if t is not None else None
    if auth is not None:
        flow.request.headers["proxy-authorization"] = auth


def failed(server: connection.Server, why: str) -> None:
    """The proxy refused (or could not be reached for) a judged tunnel: one record in its sandbox's log."""
    t = _judged.pop(server, None)
    if t is None:
        return
    d, b = t.decided, t.binding
    why = why.rpartition(" refused HTTP CONNECT request: ")[2]  # mitmproxy's words: the status is what counts
    reason = "failed: " + upstreamproxy.refusal(t.proxy, t.target, why)
    b.audit.write(
        request_record(b.task, d.id, t.kind, "allow", d.host, d.port, "CONNECT", t.target, status=None,
                       rule=d.verdict.decision.rule, reason=reason)
    )  # fmt: skip
