"""The front door's plain-HTTP parser (netguard.daemon.plainhead) and chunk framing (netguard.daemon.chunks).

What it takes it must read exactly as mitmproxy would; anything it is unsure of must be None (mitmproxy's).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.daemon import plainhead
from netguard.daemon.chunks import Chunked
from netguard.decision.limits import HEAD_MAX

GET = b"GET http://a.test:8080/p?q=1 HTTP/1.1\r\nHost: A.test:8080\r\nProxy-Connection: keep-alive\r\n\r\n"


def test_a_plain_absolute_form_request() -> None:
    r = plainhead.request(GET + b"next bytes")
    assert r is not None
    assert (r.method, r.host, r.port, r.url, r.size, r.length, r.close) == (
        "GET", "a.test", 8080, "http://A.test:8080/p?q=1", len(GET), 0, False,
    )  # fmt: skip
    assert r.head == b"GET /p?q=1 HTTP/1.1\r\nHost: A.test:8080\r\nProxy-Connection: keep-alive\r\n\r\n"


def test_the_default_port_and_a_body_and_close() -> None:
    raw = (
        b"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 12\r\nConnection: Keep-Alive, close\r\n\r\n"
    )
    r = plainhead.request(raw)
    assert r is not None and (r.port, r.url, r.length, r.close) == (80, "http://a.test/x", 12, True)


def test_a_transparent_request_is_judged_by_its_host_on_the_destination_port() -> None:
    raw = b"GET /x HTTP/1.1\r\nHost: A.Test:9\r\n\r\n"
    r = plainhead.request(raw, 8080)
    assert r is not None and (r.host, r.port, r.url, r.head) == ("a.test", 8080, "http://a.test:8080/x", raw)
    assert plainhead.request(GET, 8080) is None  # absolute-form on the transparent port: mitmproxy's


@pytest.mark.parametrize(
    "raw",
    [
        GET.replace(b"Host: A.test:8080", b"Host: b.test:8080"),  # another site on the judged address
        GET.replace(b"Host: A.test:8080", b"Host: a.test:8081"),
        GET.replace(b"Host: A.test:8080\r\n", b""),  # no Host
        GET.replace(b"\r\n\r\n", b"\r\nHost: a.test:8080\r\n\r\n"),  # two
        GET.replace(b"HTTP/1.1", b"HTTP/1.0"),
        GET.replace(b"GET", b"get"),
        GET.replace(b"GET http://a.test:8080", b"CONNECT http://a.test:8080"),
        GET.replace(b"http://", b"https://"),
        GET.replace(b"http://a.test", b"http://u@a.test"),
        GET.replace(b"http://a.test:8080", b"http://[::1]:8080"),
        GET.replace(b"a.test:8080", b"a.test:99999"),
        GET.replace(b"a.test", b"a_b.test"),
        GET.replace(b"a.test", b"a..test"),
        GET.replace(b"/p?q=1", b"/p q"),
        GET.replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n"),
        GET.replace(b"\r\n\r\n", b"\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
        GET.replace(b"\r\n\r\n", b"\r\nContent-Length: -1\r\n\r\n"),
        GET.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"),
        GET.replace(b"\r\n\r\n", b"\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"),
        GET.replace(b"\r\n\r\n", b"\r\nConnection: Upgrade\r\n\r\n"),
        GET.replace(b"Proxy-Connection: keep-alive", b"Proxy-Connection : keep-alive"),  # space before the colon
        GET.replace(b"Proxy-Connection: keep-alive", b"X: a\r\n folded"),  # obs-fold
        GET.replace(b"\r\nHost", b"\nHost"),  # a bare LF
        GET[:-2],  # not whole yet
        GET.replace(b"\r\n\r\n", b"\r\n" + b"X-A: 1\r\n" * 70 + b"\r\n"),  # too many fields
        GET.replace(b"\r\n\r\n", b"\r\nX-A: " + b"a" * HEAD_MAX + b"\r\n\r\n"),
        b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n",
    ],
)
def test_anything_it_is_not_sure_of_is_mitmproxys(raw: bytes) -> None:
    assert plainhead.request(raw) is None


@pytest.mark.parametrize(
    ("raw", "method", "want"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "GET", ("length", 5, False, False)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", "GET", ("length", 5, False, False)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD", ("none", 0, False, False)),
        (b"HTTP/1.1 204 No Content\r\n\r\n", "GET", ("none", 0, False, False)),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", "GET", ("none", 0, False, False)),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", "GET", ("none", 0, False, True)),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "GET", ("chunked", 0, False, False)),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "GET", ("close", 0, True, False)),
        (b"HTTP/1.1 200 OK\r\n\r\n", "GET", ("close", 0, True, False)),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", "GET", ("length", 1, True, False)),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n", "GET", ("length", 1, True, False)),
        (
            b"HTTP/1.1 200 \xc3\xa9\r\nX-Name: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n",
            "GET",
            ("length", 0, False, False),
        ),
    ],
)
def test_response_framing(raw: bytes, method: str, want: tuple[str, int, bool, bool]) -> None:
    r = plainhead.response(raw + b"body", method)
    assert isinstance(r, plainhead.Response) and r.size == len(raw)
    assert (r.body, r.length, r.close, r.interim) == want


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 99 Low\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * HEAD_MAX,
    ],
)
def test_an_unframeable_response_is_none(raw: bytes) -> None:
    assert plainhead.response(raw, "GET") is None


def test_a_response_head_in_pieces_is_incomplete() -> None:
    assert plainhead.response(b"HTTP/1.1 200 OK\r\nContent-Len", "GET") == "incomplete"


def _chunked(payloads: list[bytes], trailer: bytes = b"") -> bytes:
    return b"".join(b"%x;e=1\r\n%s\r\n" % (len(p), p) for p in payloads if p) + b"0\r\n" + trailer + b"\r\n"


@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    st.sampled_from([b"", b"X-T: 1\r\n", b"A: b\r\nC: d\r\n"]),
    st.lists(st.integers(min_value=1, max_value=50), max_size=30),
    st.binary(max_size=10),
)
def test_a_chunked_body_ends_where_it_ends_however_it_is_cut(
    payloads: list[bytes], trailer: bytes, cuts: list[int], after: bytes
) -> None:
    body = _chunked(payloads, trailer)
    stream = body + after  # the next response's bytes follow on a kept-alive connection
    c, pos, end = Chunked(), 0, None
    for size in [*cuts, len(stream)]:
        piece = stream[pos : pos + size]
        if not piece:
            break
        got = c.feed(piece)
        if got is not None:
            end = pos + got
            break
        pos += len(piece)
    assert end == len(body) and c.data == sum(len(p) for p in payloads)


@pytest.mark.parametrize(
    "raw",
    [b"z\r\n", b"5\r\nhelloXX\r\n", b"5\nhello\r\n", b"1" * 5000, b"0\r\n" + b"X: " + b"a" * 40000 + b"\r\n"],
)
def test_a_malformed_chunked_body_raises(raw: bytes) -> None:
    with pytest.raises(ValueError):
        Chunked().feed(raw)
