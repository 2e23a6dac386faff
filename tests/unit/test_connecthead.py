"""The front door's CONNECT parser: only the plainest head is taken, and it reads it as mitmproxy does.

A head it accepts must be one mitmproxy parses to the same method, host and port (else the two would
judge different destinations); everything odd is None (mitmproxy's), and a prefix of a plain head is
"incomplete" (worth waiting for), never a Head.
"""

from __future__ import annotations

import pytest
from h11._receivebuffer import ReceiveBuffer
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.net.http.http1 import read_request_head

from netguard.daemon.connecthead import MAX_FIELDS, MAX_HEAD, Head, parse

_label = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,10}[A-Za-z0-9])?", fullmatch=True)
hostnames = st.lists(_label, min_size=1, max_size=4).map(".".join)
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
ports = st.integers(1, 65535)
_token = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}", fullmatch=True).filter(
    lambda n: n.lower() not in ("content-length", "transfer-encoding")
)
_value = st.from_regex(r"[\x21-\x7e]([\x20-\x7e]{0,30}[\x21-\x7e])?", fullmatch=True)
fields = st.lists(st.tuples(_token, _value), max_size=6)


def mitmproxy_reads(buf: bytes) -> http.Request:
    """The request head as mitmproxy's HTTP/1 layer reads it (its receive buffer, then its parser)."""
    rb = ReceiveBuffer()
    rb += buf
    lines = rb.maybe_extract_lines()
    assert lines is not None
    req: http.Request = read_request_head([bytes(x) for x in lines])
    return req


def head(host: str, port: int, version: str = "1.1", headers: list[tuple[str, str]] | None = None) -> bytes:
    lines = [f"CONNECT {host}:{port} HTTP/{version}"] + [f"{n}: {v}" for n, v in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@given(st.one_of(hostnames, ipv4), ports, st.sampled_from(["1.0", "1.1"]), fields)
def test_a_plain_head_is_read_as_mitmproxy_reads_it(
    host: str, port: int, version: str, hs: list[tuple[str, str]]
) -> None:
    buf = head(host, port, version, hs)
    got = parse(buf)
    assert got == Head(host, port, f"HTTP/{version}", len(buf))  # type: ignore[arg-type]
    req = mitmproxy_reads(buf)
    assert (req.method, req.host, req.port, req.http_version) == ("CONNECT", host, port, f"HTTP/{version}")


@given(st.one_of(hostnames, ipv4), ports, fields, st.data())
def test_every_prefix_is_incomplete_and_what_follows_the_head_is_the_tunnels(
    host: str, port: int, hs: list[tuple[str, str]], data: st.DataObject
) -> None:
    buf = head(host, port, headers=hs)
    cut = data.draw(st.integers(0, len(buf) - 1))
    assert parse(buf[:cut]) == "incomplete"
    assert parse(buf + data.draw(st.binary(min_size=1, max_size=20))) == parse(buf)  # sent before the 200


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_and_a_head_is_only_ever_a_whole_plain_connect(buf: bytes) -> None:
    got = parse(buf)
    assert got is None or got == "incomplete" or isinstance(got, Head)
    if isinstance(got, Head):
        assert buf.startswith(b"CONNECT ") and buf[: got.size].endswith(b"\r\n\r\n")
        assert buf.find(b"\r\n\r\n") + 4 == got.size


@given(st.binary(max_size=300))
def test_arbitrary_bytes_after_a_connect_line(rest: bytes) -> None:
    buf = b"CONNECT a.test:443 HTTP/1.1\r\n" + rest
    got = parse(buf)
    if isinstance(got, Head):
        req = mitmproxy_reads(buf[: got.size])
        assert (req.method, req.host, req.port) == ("CONNECT", "a.test", 443)


@pytest.mark.parametrize(
    "buf",
    [
        b"connect a.test:443 HTTP/1.1\r\n\r\n",  # method case
        b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"CONNECT a.test HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT a.test:0 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:65536 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:0443 HTTP/1.1\r\n\r\n",  # leading zero
        b"CONNECT a.test:+443 HTTP/1.1\r\n\r\n",
        b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",  # IPv6 literal: mitmproxy's
        b"CONNECT a_b.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a..test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test.:443 HTTP/1.1\r\n\r\n",
        b"CONNECT -a.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:443 HTTP/2.0\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1 \r\n\r\n",
        b"CONNECT  a.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:443\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\nHost: a\r\n\r\n",  # bare LF
        b"CONNECT a.test:443 HTTP/1.1\r\nHost: a\n\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",  # obs-fold
        b"CONNECT a.test:443 HTTP/1.1\r\nHost : a\r\n\r\n",  # space before the colon
        b"CONNECT a.test:443 HTTP/1.1\r\nno colon\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",  # a body, even empty: mitmproxy's
        b"CONNECT a.test:443 HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: \xff\r\n\r\n",  # not ASCII
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"CONNECT " + b"a" * 64 + b".test:443 HTTP/1.1\r\n\r\n",  # a label past 63
        b"CONNECT a.test:443 HTTP/1.1\r\n" + b"X: a\r\n" * (MAX_FIELDS + 1) + b"\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n",
        b"\r\nCONNECT a.test:443 HTTP/1.1\r\n\r\n",
    ],
)
def test_anything_but_a_plain_connect_is_mitmproxys(buf: bytes) -> None:
    assert parse(buf) is None


@pytest.mark.parametrize(
    "buf", [b"", b"C", b"CONNECT", b"CONNECT a.test:443 HTTP/1.1", b"CONNECT a.test:443 HTTP/1.1\r\nHost: a\r\n\r"]
)
def test_a_prefix_is_waited_for(buf: bytes) -> None:
    assert parse(buf) == "incomplete"


@pytest.mark.parametrize("buf", [b"G", b"GET / HTTP/1.1\r\n", b"\x16\x03\x01", b"CONNECT a\nb", b"x" * MAX_HEAD])
def test_what_cannot_become_a_plain_connect_is_not_waited_for(buf: bytes) -> None:
    assert parse(buf) is None


def test_the_host_keeps_its_case_as_mitmproxy_does() -> None:
    got = parse(b"CONNECT Allowed.TEST:443 HTTP/1.0\r\n\r\n")
    assert got == Head("Allowed.TEST", 443, "HTTP/1.0", 37)
