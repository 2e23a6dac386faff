"""A bound on what mitmproxy buffers before it decides: every request head, not only the first, and a ClientHello.

The front door checks a connection's first head before mitmproxy sees a byte (netguard.daemon.firstbytes).
Later heads on a kept-alive connection, the heads inside an inspected TLS connection and what a client
pipelines while its previous response is pending are read by mitmproxy itself, whose HTTP/1 server
appends every byte to its buffer and parses a head only once it is whole ("FIXME: protect against header
size DoS" in mitmproxy 12's _http1.py): one connection streaming header lines grew the shared daemon
from 0.39 to 2.7 GB in 10 s (issue 22). So after each read the layer's buffer is measured: past
HEAD_MAX while it waits for a head (PIPELINE_MAX while a response is pending), the client gets a 431
and the connection closes, as mitmproxy closes one whose head does not parse, and the sandbox's log
says so (`refused`).

The same for a ClientHello that mitmproxy reads itself (inside an allowed CONNECT to an inspected
host): past HEAD_MAX the handshake fails and the connection closes.

One wrapper around each of two methods of mitmproxy's layers: `install` fails loudly if they are gone
(a mitmproxy upgrade); tests/unit/test_frontdoor.py drives the real layers through a real proxy.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Generator
from typing import Any

from mitmproxy import connection
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import tls
from mitmproxy.proxy.layers.http import _http1

from netguard.audit import Kind, Limit
from netguard.decision import limits
from netguard.decision.answers import TIMEOUT, TOO_LARGE
from netguard.decision.limits import HEAD_MAX

PIPELINE_MAX = 1 << 20  # what a client may send ahead while its previous response is pending


Refused = Callable[[connection.Client, Limit, Kind, str], None]
_installed: list[Refused] = []
#: When the head each HTTP/1 server layer is reading began (weak: a layer's end is its entry's end).
_head_started: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def install(refused: Refused) -> None:
    """Bound mitmproxy's HTTP/1 server buffer and its ClientHello buffer in this process; `refused(client,
    limit, kind, why)` records each refusal.

    Once per process (the daemon's Gate, `sandgate proxy`); a second call only replaces the recorder."""
    if _installed:
        _installed[0] = refused
        return
    _bound_heads()
    _bound_hellos()
    _installed.append(refused)


def _bound_hellos() -> None:
    """A ClientHello inside an allowed CONNECT to an inspected host is read by mitmproxy, which keeps
    appending (a handshake message may claim 16 MiB) and re-parses the whole buffer at every read."""
    layer = tls.ClientTLSLayer
    original = layer.receive_handshake_data
    if not hasattr(layer, "client_hello_parsed"):
        raise RuntimeError("mitmproxy's TLS layer changed: sandgate cannot bound a ClientHello")

    def bounded(self: Any, data: bytes) -> Generator[commands.Command, Any, tuple[bool, str | None]]:
        if not self.client_hello_parsed and len(self.recv_buffer) + len(data) > HEAD_MAX:
            self.recv_buffer = bytearray()
            why = f"ClientHello larger than {HEAD_MAX} bytes"
            _installed[0](self.context.client, "head", "tls", why)
            return False, f"sandgate: {why}"  # mitmproxy ends the handshake: the connection closes
        return (yield from original(self, data))

    layer.receive_handshake_data = bounded  # type: ignore[method-assign]


def _bound_heads() -> None:
    server = _http1.Http1Server
    original = server._handle_event
    if not (hasattr(server, "read_headers") and hasattr(server, "wait") and hasattr(server, "done")):
        raise RuntimeError("mitmproxy's HTTP/1 server layer changed: sandgate cannot bound request heads")

    def bounded(self: Any, event: events.Event) -> Generator[commands.Command, Any, None]:
        yield from original(self, event)
        if not isinstance(event, events.DataReceived):
            return
        refusal = _refusal(self)
        if refusal is None:
            return
        limit, why, answer = refusal
        self.buf = type(self.buf)()  # the bytes are not wanted: free them now
        self.state = self.done
        yield commands.SendData(self.conn, answer)
        yield commands.CloseConnection(self.conn)
        _installed[0](self.context.client, limit, "http", why)

    server._handle_event = bounded  # type: ignore[method-assign]


def _refusal(layer: Any) -> tuple[Limit, str, bytes] | None:
    """Why this HTTP/1 server layer must stop now, or None: its buffer while it waits for a head (or
    for its response), and how long the head it is reading has taken (a trickle of a byte every few
    seconds kept kept-alive connections, and the daemon's memory, for ever)."""
    if layer.state != layer.read_headers:
        _head_started.pop(layer, None)  # the head was whole: the next one's clock starts with its first byte
        if layer.state == layer.wait and len(layer.buf) > PIPELINE_MAX:
            return "head", f"more than {PIPELINE_MAX} bytes sent ahead of a pending response", TOO_LARGE
        return None  # a body is read as it comes (streamed, or held up to stream_large_bodies)
    if len(layer.buf) > HEAD_MAX:
        return "head", f"request head larger than {HEAD_MAX} bytes", TOO_LARGE
    now = time.monotonic()
    since = _head_started.setdefault(layer, now)
    if not layer.buf:  # read whole: the next head starts with its first byte
        _head_started.pop(layer, None)
    elif now - since > limits.DEADLINE:
        return "deadline", f"no whole request head within {limits.DEADLINE:g} s", TIMEOUT
    return None
