"""Has a connection sent what decides it? Pure: the front door's test before anyone reads a byte.

A connection is decided by its first unit: a TLS ClientHello (its SNI) or an HTTP request head (its
CONNECT authority or Host). The front door only peeks (the bytes wait in the kernel's socket buffer,
not in the daemon's memory) until that unit is whole, and refuses one that outgrows HEAD_MAX: mitmproxy
would buffer a head without limit (measured: 600 MB of header lines grew the daemon by 2.3 GB).
Anything that is neither TLS nor HTTP is "ready" at once: mitmproxy judges it by its address.
"""

from __future__ import annotations

from typing import Literal

from netguard.daemon.tlshello import client_hello, starts_like_record
from netguard.decision.limits import HEAD_MAX

State = Literal["more", "ready", "too-large"]

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def state(buf: bytes, limit: int = HEAD_MAX) -> State:
    """ "ready" once `buf` holds a whole ClientHello or request head (or is neither), "more" while it could
    still become one, "too-large" when it has not within `limit` bytes."""
    if not buf:
        return "more"
    if buf[0] == 0x16:  # a TLS handshake record, or its first bytes
        if len(buf) < 3:
            return "more"
        if starts_like_record(buf):
            return _hello_state(buf, limit)
        return "ready"
    if looks_like_http(buf):
        if b"\r\n\r\n" in buf or b"\n\n" in buf:  # mitmproxy's head reader takes a bare LF too
            return "ready"
        return "too-large" if len(buf) >= limit else "more"
    return "ready"


def looks_like_http(buf: bytes) -> bool:
    """A request line so far: a method token, then a space (or nothing yet after the token)."""
    method, space, _ = buf[:32].partition(b" ")
    if not method or not all(c in _TOKEN for c in method):
        return False
    return bool(space) or len(buf) < 32


def is_connect(buf: bytes) -> bool:
    return buf[:8].upper() == b"CONNECT "


def _hello_state(buf: bytes, limit: int) -> State:
    try:
        hello = client_hello(buf)
    except ValueError:
        return "ready"  # malformed: mitmproxy refuses it as before
    if hello is not None:
        return "ready"
    return "too-large" if len(buf) >= limit else "more"
