"""Drive mitmproxy's hooks without sockets: a client of a given mode, a TLS ClientHello, the NextLayer of a
transparent listener. Shared by the Gate's unit tests (test_gate) and the inspection tests (test_tlsinspect).
"""

from __future__ import annotations

import ssl

import pytest
from mitmproxy import connection
from mitmproxy.proxy import layer
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.events import DataReceived
from mitmproxy.proxy.layers import modes
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow


def client(mode: str) -> connection.Client:
    c = tflow.tclient_conn()
    c.proxy_mode = ProxyMode.parse(mode)
    return c


def client_hello(sni: str) -> bytes:
    tls = ssl.create_default_context()
    obj = tls.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def next_layer(
    tctx: taddons.context, c: connection.Client, dst: tuple[str, int], data: bytes
) -> tuple[layer.NextLayer, Context]:
    """The NextLayer mitmproxy hands over once the client sent `data` to `dst` (a transparent listener)."""
    ctx = Context(c, tctx.options)
    ctx.server.address = dst
    ctx.layers = [modes.TransparentProxy(ctx)]
    nl = layer.NextLayer(ctx)
    if data:
        nl.events.append(DataReceived(c, data))
    return nl, ctx
