"""Is this buffer exactly one plain `CONNECT host:port HTTP/1.x` request head? Pure: the front door's parser.

The front door (netguard.daemon.frontdoor) takes only the plainest CONNECT out of mitmproxy. Anything
this parser does not recognise with certainty, it answers with None, and the connection goes to
mitmproxy untouched: a lenient parser here would be a second HTTP parser that disagrees with the one
that judges everything else (request smuggling between the two is the threat).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MAX_HEAD = 8192  # a CONNECT head is a few hundred bytes; past this mitmproxy's own limits apply
MAX_FIELDS = 64

_LINE = re.compile(rb"CONNECT ([A-Za-z0-9.-]{1,253}):([1-9][0-9]{0,4}) HTTP/1\.([01])")
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
FIELD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\x20-\x7e\t]*")  # a token, a colon, visible ASCII
_BODY = (b"content-length", b"transfer-encoding")  # a CONNECT with a body is not plain: mitmproxy decides it


@dataclass(frozen=True)
class Head:
    """A plain CONNECT: the authority as mitmproxy would read it, and the head's length in bytes."""

    host: str
    port: int
    version: Literal["HTTP/1.0", "HTTP/1.1"]
    size: int


Incomplete = Literal["incomplete"]


def parse(buf: bytes) -> Head | Incomplete | None:
    """`buf` is everything the client has sent so far. A Head when it starts with one complete plain CONNECT
    head (the bytes after it are the tunnel's, as mitmproxy relays them); "incomplete" while it could still
    become one; else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return "incomplete" if len(buf) < MAX_HEAD and _could_be(buf) else None
    size = end + 4
    if size > MAX_HEAD:
        return None
    lines = buf[:end].split(b"\r\n")
    m = _LINE.fullmatch(lines[0])
    if m is None or len(lines) - 1 > MAX_FIELDS:
        return None
    for line in lines[1:]:
        if FIELD.fullmatch(line) is None or line.split(b":", 1)[0].lower() in _BODY:
            return None
    host = m.group(1).decode("ascii")  # as mitmproxy reads it (its idna decode keeps ASCII as sent)
    port = int(m.group(2))
    if port > 65535 or not valid_host(host):
        return None
    return Head(host, port, "HTTP/1.1" if m.group(3) == b"1" else "HTTP/1.0", size)


def _could_be(buf: bytes) -> bool:
    """No bare CR or LF and a prefix of CONNECT: worth waiting for more bytes."""
    first = buf.split(b"\r\n", 1)[0]
    return b"CONNECT "[: len(first)] == first[:8] and b"\n" not in buf.replace(b"\r\n", b"")


def valid_host(host: str) -> bool:
    """LDH labels (or a dotted IPv4 address, whose labels are digits): no empty label, no trailing dot."""
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.lower().split("."))
