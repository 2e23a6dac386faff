"""The plainest HTTP/1.1 request and response heads, parsed for the front door's plain-HTTP path. Pure.

The front door (netguard.daemon.plainhttp) forwards a plain-HTTP request itself only when this parser
recognises its head with certainty: HTTP/1.1, absolute-form `http://` to an LDH name with a Host field
naming the same authority (explicit proxy) or origin-form with one Host field naming an LDH name
(transparent), no Transfer-Encoding, Expect or Upgrade, at most one Content-Length.
Anything else is answered None and goes to mitmproxy untouched (it was only peeked): a lenient
second parser that disagreed with mitmproxy's would be a request-smuggling gap between the two.
A response head it cannot frame with certainty (conflicting lengths, folded fields) ends the
connection with a 502: its body's end would be a guess, and a wrong guess hands the next request
another response.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from netguard import hosts
from netguard.daemon.connecthead import FIELD, MAX_FIELDS, valid_host
from netguard.decision.limits import HEAD_MAX

Incomplete = Literal["incomplete"]
Body = Literal["none", "length", "chunked", "close", "switch"]

_LINE = re.compile(rb"([A-Z]{1,20}) http://([A-Za-z0-9.-]{1,253})(?::([1-9][0-9]{0,4}))?(/[\x21-\x7e]*) HTTP/1\.1")
_ORIGIN = re.compile(rb"([A-Z]{1,20}) (/[\x21-\x7e]*) HTTP/1\.1")
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9]{2})(?: [\t\x20-\x7e\x80-\xff]*)?")
RFIELD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*")  # obs-text: real servers send it
_NOT_PLAIN = (b"transfer-encoding", b"expect", b"upgrade")  # a chunked body, 100-continue, a protocol switch
_DIGITS = re.compile(rb"[0-9]{1,18}")


@dataclass(frozen=True)
class Request:
    """A plain request: where it goes, what it logs, what goes upstream and how long it is."""

    method: str
    host: str  # as the URL names it: what is judged (as mitmproxy judges `request.host`)
    port: int
    url: str  # as mitmproxy's `pretty_url` logs it (the audit records of both paths agree)
    size: int  # the head's bytes in the client's stream
    length: int  # the body's bytes (Content-Length; 0 without one)
    close: bool  # the client said `Connection: close`
    head: bytes  # the upstream's head: origin-form request line, the fields as sent (as mitmproxy sends them)


@dataclass(frozen=True)
class Response:
    """A response head the front door can frame: where its body ends, and whether the connection goes on."""

    size: int
    status: int
    body: Body
    length: int  # for body == "length"
    close: bool  # the connection ends after this response
    interim: bool  # 1xx: the final head follows


def field_pairs(lines: list[bytes], pattern: re.Pattern[bytes]) -> list[tuple[bytes, bytes]] | None:
    """(lower-cased name, stripped value) per field line; None for a line that is no plain field."""
    if len(lines) > MAX_FIELDS:
        return None
    out = []
    for line in lines:
        if pattern.fullmatch(line) is None:
            return None  # obs-fold, a bare CR, a space before the colon: mitmproxy's to judge
        name, _, value = line.partition(b":")
        out.append((name.lower(), value.strip(b" \t")))
    return out


def tokens(fields: list[tuple[bytes, bytes]], name: bytes) -> set[bytes]:
    return {t.strip().lower() for n, v in fields if n == name for t in v.split(b",")}


def content_length(fields: list[tuple[bytes, bytes]]) -> int | Literal[False] | None:
    """The one Content-Length (None: there is none; False: several that differ, or not a number)."""
    values = {t.strip() for n, v in fields if n == b"content-length" for t in v.split(b",")}
    if not values:
        return None
    if len(values) != 1 or _DIGITS.fullmatch(next(iter(values))) is None:
        return False
    return int(next(iter(values)))


def request(buf: bytes, port: int | None = None) -> Request | None:
    """The plain request `buf` starts with, or None (not one beyond doubt: mitmproxy decides it).

    `port`: the transparent listener's original destination port; the request is origin-form and its
    Host field names the destination, as the Gate judges it. None: the explicit proxy's absolute-form."""
    end = buf.find(b"\r\n\r\n")
    if end < 0 or end + 4 > HEAD_MAX:
        return None
    lines = buf[:end].split(b"\r\n")
    m = (_LINE if port is None else _ORIGIN).fullmatch(lines[0])
    fields = field_pairs(lines[1:], FIELD)
    if m is None or fields is None or any(n in _NOT_PLAIN for n, _ in fields):
        return None
    hosts_ = [v for n, v in fields if n == b"host"]
    named = authority(hosts_[0]) if len(hosts_) == 1 else None
    if named is None:
        return None
    if port is None:
        host, dst, path = m.group(2).decode("ascii"), int(m.group(3) or 80), m.group(4)
        if (named[0].lower(), named[1]) != (host.lower(), dst):
            return None  # a Host naming another authority would reach another site on the judged address
        head = b"%s %s HTTP/1.1\r\n%s\r\n\r\n" % (m.group(1), path, b"\r\n".join(lines[1:]))
    else:
        # The Host's name (lower-cased, as the Gate judges it) with the destination's port; the head goes as sent.
        host, dst, path, head = named[0].lower(), port, m.group(2), buf[: end + 4]
    method, length, connection = m.group(1).decode(), content_length(fields), tokens(fields, b"connection")
    if method == "CONNECT" or dst > 65535 or not valid_host(host) or length is False or b"upgrade" in connection:
        return None
    url = f"http://{named[0] if port is None else host}{'' if dst == 80 else f':{dst}'}{path.decode('ascii')}"
    return Request(method, host, dst, url, end + 4, length or 0, b"close" in connection, head)


def authority(value: bytes) -> tuple[str, int] | None:
    """A Host field's (name as sent, port): taken apart by the project's one splitter (netguard.hosts)."""
    name, port = hosts.split_host_port(value.decode("ascii"))  # FIELD admits visible ASCII only
    if not name or (port is not None and (not port.isdigit() or len(port) > 5)):
        return None
    return name, int(port) if port is not None else 80


def response(buf: bytes, method: str, switch: bool = False) -> Response | Incomplete | None:
    """The response head `buf` starts with (RFC 9112 section 6.3's framing), "incomplete", or None: unframeable.

    `switch`: the request asked to upgrade and was allowed to; its 101 ends HTTP on the connection."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return "incomplete" if len(buf) < HEAD_MAX else None
    lines = buf[:end].split(b"\r\n")
    m = _STATUS.fullmatch(lines[0])
    fields = field_pairs(lines[1:], RFIELD)
    if m is None or fields is None:
        return None
    status, size = int(m.group(2)), end + 4
    close = m.group(1) == b"0" or b"close" in tokens(fields, b"connection")
    if status == 101:
        return Response(size, status, "switch", 0, True, False) if switch else None  # else nobody asked
    if status < 200:
        return Response(size, status, "none", 0, False, True)
    if method == "HEAD" or status in (204, 304):
        return Response(size, status, "none", 0, close, False)
    length = content_length(fields)
    coding = tokens(fields, b"transfer-encoding")
    if coding:
        if length is not None:
            return None  # both: the classic smuggling shape; mitmproxy refuses it too
        last = [v for n, v in fields if n == b"transfer-encoding"][-1].split(b",")[-1].strip().lower()
        return Response(size, status, "chunked", 0, close, False) if last == b"chunked" else _until_close(size, status)
    if length is False:
        return None
    if length is None:
        return _until_close(size, status)
    return Response(size, status, "length", length, close, False)


def _until_close(size: int, status: int) -> Response:
    return Response(size, status, "close", 0, True, False)
