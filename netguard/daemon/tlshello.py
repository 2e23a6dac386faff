"""A TLS ClientHello's SNI, read the way mitmproxy reads it, without importing mitmproxy's TLS stack.

The front door decides a transparent connection by its SNI before mitmproxy has been imported (a
cold daemon serves its first connection while mitmproxy loads: issue 25). mitmproxy's own
`parse_client_hello` lives in its TLS layer, whose import pulls OpenSSL and cryptography (~0.3 s).
A second reader that drifted from the Gate's would be a parser differential (the front door
relaying a name the Gate would have judged otherwise), so this one uses the same pieces: the same
record reassembly rules, mitmproxy's own generated ClientHello parser (kaitaistruct) and its own
host check; tests/unit/test_tlshello.py compares the two on generated and mutated hellos.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from kaitaistruct import KaitaiStream  # type: ignore[import-untyped]
from mitmproxy.contrib.kaitaistruct import tls_client_hello
from mitmproxy.net import check

_RECORD_HEADER = 5


def starts_like_record(d: bytes) -> bool:
    """Could `d` start a TLS handshake record (SSLv3 to TLS 1.3)? Fewer than 3 bytes: not TLS."""
    return len(d) > 2 and d[0] == 0x16 and d[1] == 0x03 and d[2] <= 0x03


@dataclass(frozen=True)
class Hello:
    """What the front door needs of a ClientHello: the name it asks for, if it names a valid one, and the
    application protocols it offers (None: no ALPN extension)."""

    sni: str | None
    alpn: tuple[bytes, ...] | None = None


def client_hello(data: bytes) -> Hello | None:
    """The ClientHello in `data`: None while incomplete; ValueError when it is malformed (never relayed)."""
    raw = _reassembled(data)
    if not raw:
        return None
    try:
        parsed = tls_client_hello.TlsClientHello(KaitaiStream(io.BytesIO(raw[4:])))  # type: ignore[no-untyped-call]
    except EOFError as e:
        raise ValueError("Invalid ClientHello") from e
    return Hello(_sni(parsed), _alpn(parsed))


def _records(data: bytes) -> Iterator[bytes]:
    """The bodies of the handshake records in `data`, as far as they are whole."""
    offset = 0
    while len(data) >= offset + _RECORD_HEADER:
        header = data[offset : offset + _RECORD_HEADER]
        if not starts_like_record(header):
            raise ValueError(f"Expected TLS record, got {header!r} instead.")
        (size,) = struct.unpack("!H", header[3:])
        if size == 0:
            raise ValueError("Record must not be empty.")
        offset += _RECORD_HEADER
        if len(data) < offset + size:
            return
        yield data[offset : offset + size]
        offset += size


def _reassembled(data: bytes) -> bytes | None:
    """The handshake message (type, length, body) spread over one or more records, once it is whole."""
    message = b""
    for body in _records(data):
        message += body
        if len(message) >= 4:
            size = struct.unpack("!I", b"\x00" + message[1:4])[0] + 4
            if len(message) >= size:
                return message[:size]
    return None


def _sni(parsed: object) -> str | None:
    """One server name of type host_name, and a valid host: anything else is no SNI (mitmproxy's rule)."""
    ext = getattr(parsed, "extensions", None)
    if not ext:
        return None
    for e in ext.extensions:
        if e.type != 0x00:
            continue
        names = e.body.server_names
        if len(names) == 1 and names[0].name_type == 0 and check.is_valid_host(names[0].host_name):
            return str(names[0].host_name.decode("ascii"))
    return None


def whole(buf: bytes) -> bool:
    """Enough bytes to tell: not TLS, a whole ClientHello, or one that cannot be parsed."""
    if len(buf) < 3 or not starts_like_record(buf):
        return len(buf) >= 3
    try:
        return client_hello(buf) is not None
    except ValueError:
        return True


def hello_or_none(buf: bytes) -> Hello | None:
    """The ClientHello `buf` starts with; None when it is not TLS, not whole yet or malformed."""
    if not buf or not starts_like_record(buf):
        return None
    try:
        return client_hello(buf)
    except ValueError:
        return None


def _alpn(parsed: object) -> tuple[bytes, ...] | None:
    """The protocols of the ALPN extension (16), in the client's order; None without one."""
    ext = getattr(parsed, "extensions", None)
    for e in ext.extensions if ext else ():
        if e.type == 0x10:
            return tuple(bytes(p.name) for p in e.body.alpn_protocols)
    return None


def offers_http1(hello: Hello) -> bool:
    """The client can speak HTTP/1.1 with a server that terminates its TLS: it offers it, or no ALPN at all."""
    return not hello.alpn or b"http/1.1" in hello.alpn
