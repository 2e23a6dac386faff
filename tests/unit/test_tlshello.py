"""netguard.daemon.tlshello reads every ClientHello exactly as mitmproxy's parse_client_hello does.

The front door decides by this reader, the Gate by mitmproxy's: a hello on which they disagree (one
sees an SNI the other does not, one calls whole what the other calls incomplete or malformed) would be
a name judged one way on one path and another way on the other. So both are run on real hellos, on
every truncation of them, on hellos split over records, and on hypothesis' mutations of them.
"""

from __future__ import annotations

import contextlib
import ssl
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy.layers.tls import parse_client_hello

from netguard.daemon import tlshello
from netguard.decision import answers, flowview
from netguard.rules import Decision


def hello(sni: str | None, alpn: list[str] | None = None) -> bytes:
    """A real ClientHello (Python's ssl), as a client sends it first."""
    ctx = ssl.create_default_context()
    if sni is None:
        ctx.check_hostname = False
    if alpn:
        ctx.set_alpn_protocols(alpn)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def ours(buf: bytes) -> tuple[str, str | None]:
    try:
        h = tlshello.client_hello(buf)
    except ValueError:
        return "malformed", None
    return ("incomplete", None) if h is None else ("whole", h.sni)


def theirs(buf: bytes) -> tuple[str, str | None]:
    try:
        h = parse_client_hello(buf)
    except ValueError:
        return "malformed", None
    return ("incomplete", None) if h is None else ("whole", h.sni)


def split_records(buf: bytes, size: int) -> bytes:
    """The same handshake message carried in records of `size` bytes (clients may fragment it)."""
    body = buf[5:]
    out = b""
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += buf[:3] + struct.pack("!H", len(part)) + part
    return out


HELLOS = [hello("registry.npmjs.org"), hello(None), hello("a.test", ["h2", "http/1.1"]), hello("xn--bcher-kva.test")]


def test_real_hellos_give_the_same_sni() -> None:
    for h in HELLOS:
        assert ours(h) == theirs(h)
    assert ours(HELLOS[0]) == ("whole", "registry.npmjs.org")
    assert ours(HELLOS[1]) == ("whole", None)


def test_every_truncation_is_judged_alike() -> None:
    for h in HELLOS[:2]:
        for n in range(len(h)):
            assert ours(h[:n]) == theirs(h[:n]), n


def test_a_hello_split_over_records_is_reassembled_alike() -> None:
    for size in (1, 7, 100, 512):
        buf = split_records(HELLOS[0], size)
        assert ours(buf) == theirs(buf) == ("whole", "registry.npmjs.org")


def test_the_record_start_test_matches_mitmproxys() -> None:
    for buf in (b"", b"\x16", b"\x16\x03", b"\x16\x03\x01", b"\x16\x03\x04", b"\x17\x03\x01", b"GET / HTTP/1.1"):
        assert tlshello.starts_like_record(buf) == starts_like_tls_record(buf)


def test_an_empty_record_and_a_non_handshake_record_are_malformed_in_both() -> None:
    first_record = split_records(HELLOS[0], 100)[:105]
    for buf in (b"\x16\x03\x01\x00\x00" + HELLOS[0], first_record + b"\x17\x03\x01\x00\x10" + bytes(16)):
        assert ours(buf) == theirs(buf) == ("malformed", None)


@settings(max_examples=400, deadline=None)
@given(
    which=st.integers(0, len(HELLOS) - 1),
    at=st.integers(0, 600),
    byte=st.integers(0, 255),
    cut=st.integers(0, 700),
)
def test_mutated_hellos_are_judged_alike(which: int, at: int, byte: int, cut: int) -> None:
    h = bytearray(HELLOS[which])
    h[at % len(h)] = byte
    buf = bytes(h[: max(cut, 1)])
    assert ours(buf) == theirs(buf)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_after_a_record_header_are_judged_alike(tail: bytes) -> None:
    buf = b"\x16\x03\x01" + tail
    assert ours(buf) == theirs(buf)


def test_the_403_is_the_bytes_mitmproxy_would_send() -> None:
    from mitmproxy.net.http.http1 import assemble_response

    for d in (Decision("deny", None, "no rule allows it"), Decision("deny", "p.yaml:4", "denied by a rule")):
        mitm = assemble_response(flowview.refusal("a.test", 443, d))  # type: ignore[no-untyped-call]
        assert answers.forbidden("a.test", 443, d) == mitm
