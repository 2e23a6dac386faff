"""mitmproxy's asyncio streams of one connection, and our own fds of their sockets: the one place
that reads mitmproxy's and asyncio's internals for a takeover (handoff: whole flows; bodyrelay: one
response body).

Why one place: both takeovers are only safe while mitmproxy's view of a connection is exactly
what these checks require (an open TCP stream, nothing half-closed, StreamReader internals as in
CPython 3.12); a second copy of the checks could drift from the first.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from mitmproxy.connection import Connection, ConnectionState


def streams(handler: Any, conn: Connection) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """`conn`'s reader and writer in mitmproxy's ConnectionHandler, or None if it must stay with mitmproxy."""
    io = getattr(handler, "transports", {}).get(conn)
    r, w = getattr(io, "reader", None), getattr(io, "writer", None)
    if not isinstance(r, asyncio.StreamReader) or not isinstance(w, asyncio.StreamWriter):
        return None  # UDP, or a mitmproxy_rs stream: no socket to take
    if conn.state is not ConnectionState.OPEN or w.transport.is_closing():
        return None  # half-closed already: mitmproxy finishes what it started
    if r.exception() is not None or getattr(r, "_eof", True) or not isinstance(getattr(r, "_paused", None), bool):
        return None
    if not isinstance(getattr(r, "_buffer", None), bytearray) or not hasattr(r, "_waiter"):
        return None  # asyncio's StreamReader internals changed: stay with mitmproxy
    return r, w


def dup_sockets(*writers: asyncio.StreamWriter) -> tuple[int, int] | None:
    """Our own fd for each socket (mitmproxy's transport keeps and later closes its own); None at EMFILE."""
    fds: list[int] = []
    try:
        for w in writers:
            fds.append(os.dup(w.get_extra_info("socket").fileno()))
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0], fds[1]
