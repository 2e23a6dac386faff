"""A request head read inside TLS the front door terminated (netguard.daemon.tlshttp). Pure.

Unlike plainhead's requests, nothing here can go to mitmproxy afterwards (the TLS is ours), so every
head gets an answer: a request, "incomplete", or a refusal (400/431/501) that ends the connection.
Strict where smuggling lives: one Host for HTTP/1.1, at most one Content-Length value, a
Transfer-Encoding only as exactly `chunked` and never beside a Content-Length, no obs-fold, no bare
CR or LF. The head goes upstream as the client sent it (mitmproxy does the same), an absolute-form
target rewritten to origin-form after the caller checked its authority is the TLS name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from netguard.daemon import plainhead
from netguard.daemon.connecthead import valid_host
from netguard.daemon.httpexchange import ReqBody
from netguard.decision.limits import HEAD_MAX

_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) ([\x21-\x7e]{1,8192}) HTTP/1\.([01])")
_ABSOLUTE = re.compile(rb"[Hh][Tt][Tt][Pp][Ss]?://([^/?#]+)(.*)")
ENC, ESC = "utf-8", "surrogateescape"  # as netguard.decision.flowview reads mitmproxy's fields


@dataclass(frozen=True)
class Inner:
    """One request inside the tunnel: what the rules judge, what the log names, what goes upstream."""

    version: str  # HTTP/1.1 or HTTP/1.0: what a refusal answers in
    method: str  # as sent: the rules judge `post` as not POST, as mitmproxy's path does
    target: str  # origin-form (path and query), as the rules and the log read it
    authority: str | None  # an absolute-form target's authority: must name the TLS origin (the caller checks)
    host: str  # the name the Host field gives: must be the TLS name (the caller checks)
    host_port: int | None  # the port it names, if it names one: must be the connection's (the caller checks)
    fields: list[tuple[str, str]]  # every field as text, in order: method overrides, upgrades
    size: int
    body: ReqBody
    close: bool
    expect: bool  # Expect: 100-continue: the body comes only after a 100
    upgrade: bool  # asks to switch protocols (judged by the rules; only an allowed one may get its 101)
    head: bytes


@dataclass(frozen=True)
class Bad:
    """A head this path refuses: the status it answers, and why (the connection then ends)."""

    status: int
    why: str


def parse(buf: bytes) -> Inner | Bad | Literal["incomplete"]:
    """The request `buf` starts with."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return "incomplete" if len(buf) < HEAD_MAX else Bad(431, f"request head larger than {HEAD_MAX} bytes")
    if end + 4 > HEAD_MAX:
        return Bad(431, f"request head larger than {HEAD_MAX} bytes")
    lines = buf[:end].split(b"\r\n")
    m = _LINE.fullmatch(lines[0])
    raw = plainhead.field_pairs(lines[1:], plainhead.RFIELD)
    if m is None or raw is None:
        return Bad(400, "malformed request line or header field")
    method, target, minor = m.group(1), m.group(2), m.group(3)
    if method.upper() == b"CONNECT":
        return Bad(400, "CONNECT inside a TLS tunnel")
    origin, authority = _target(method, target)
    if origin is None:
        return Bad(400, "request target is neither origin-form nor absolute-form")
    hosts = [v for n, v in raw if n == b"host"]
    if len(hosts) != 1:  # HTTP/1.0 too: without one a shared server picks its default site, unjudged
        return Bad(400, "a request needs exactly one Host field")
    named = plainhead.authority(hosts[0]) if hosts[0].isascii() else None
    if named is None or not valid_host(
        named[0].lower().removesuffix(".")
    ):  # `api.test.` is api.test  # empty or not host[:port]: nothing to check against the TLS name (fronting)
        return Bad(400, "the Host field names no host")
    body = _body(raw)
    if isinstance(body, Bad):
        return body
    if body == "chunked" and minor == b"0":  # RFC 9112 6.1: faulty framing; an HTTP/1.0 server reads no body
        return Bad(400, "Transfer-Encoding in an HTTP/1.0 request")
    connection = plainhead.tokens(raw, b"connection")
    close = b"close" in connection or (minor == b"0" and b"keep-alive" not in connection)
    line = b"%s %s HTTP/1.%s" % (method, origin, minor)
    head = b"\r\n".join([line, *lines[1:]]) + b"\r\n\r\n"
    texts = [(n.decode(ENC, ESC), v.decode(ENC, ESC)) for n, v in (ln.partition(b":")[::2] for ln in lines[1:])]
    fields = [(n, v.strip(" \t")) for n, v in texts]
    upgrade = any(n == b"upgrade" for n, _ in raw)  # what the rules judge; a 101 to anything else is refused
    expect = any(n == b"expect" for n, _ in raw)
    return Inner(
        f"HTTP/1.{minor.decode()}", method.decode(ENC, ESC), origin.decode(ENC, ESC), authority, named[0], named[1] if b":" in hosts[0] else None,
        fields, end + 4, body, close, expect, upgrade, head,
    )  # fmt: skip


def _target(method: bytes, target: bytes) -> tuple[bytes | None, str | None]:
    """(origin-form target, the absolute-form's authority or None); (None, None) when it is neither."""
    if target.startswith(b"/") or (target == b"*" and method == b"OPTIONS"):
        return target, None
    m = _ABSOLUTE.fullmatch(target)
    if m is None:
        return None, None
    rest = m.group(2)
    origin = rest if rest.startswith(b"/") else b"/" + rest if rest.startswith(b"?") or not rest else None
    return origin, m.group(1).decode("ascii") if origin is not None else None


def _body(raw: list[tuple[bytes, bytes]]) -> ReqBody | Bad:
    """How the request body is framed (RFC 9112 section 6): chunks, a length, or none."""
    length = plainhead.content_length(raw)
    codings = [t.strip().lower() for n, v in raw if n == b"transfer-encoding" for t in v.split(b",")]
    if codings:
        if length is not None:
            return Bad(400, "both Transfer-Encoding and Content-Length")  # the classic smuggling shape
        if codings != [b"chunked"]:
            return Bad(501, "a Transfer-Encoding other than chunked")
        return "chunked"
    if length is False:
        return Bad(400, "Content-Length is not one number")
    return length or 0
