"""innerhead.parse: a request head inside TLS the front door terminated, read strictly (nothing can go to
mitmproxy afterwards, so every head is a request, "incomplete" or a refusal)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.daemon import innerhead
from netguard.daemon.innerhead import Bad, Inner
from netguard.decision.limits import HEAD_MAX

H = b"Host: api.test\r\n"


def parsed(head: bytes) -> Inner:
    got = innerhead.parse(head)
    assert isinstance(got, Inner), got
    return got


def test_a_plain_get_goes_upstream_as_sent() -> None:
    head = b"GET /v1/x?q=1 HTTP/1.1\r\nHost: api.test:443\r\nX-A: b\r\n\r\n"
    r = parsed(head + b"body-of-next")
    assert (r.method, r.target, r.host, r.size, r.body, r.close, r.head) == (
        "GET",
        "/v1/x?q=1",
        "api.test",
        len(head),
        0,
        False,
        head,
    )
    assert r.fields == [("Host", "api.test:443"), ("X-A", "b")] and r.version == "HTTP/1.1"


@pytest.mark.parametrize(
    "line, target, authority",
    [
        (b"GET https://api.test/v1 HTTP/1.1", "/v1", "api.test"),
        (b"GET https://other.test:8443/v1?x HTTP/1.1", "/v1?x", "other.test:8443"),  # judged by the caller
        (b"GET HTTPS://api.test HTTP/1.1", "/", "api.test"),
        (b"OPTIONS * HTTP/1.1", "*", None),
    ],
)
def test_absolute_form_becomes_origin_form_and_names_its_authority(
    line: bytes, target: str, authority: str | None
) -> None:
    r = parsed(line + b"\r\n" + H + b"\r\n")
    assert (r.target, r.authority) == (target, authority)
    assert r.head.split(b"\r\n", 1)[0] == b"%s %s %s" % (line.split(b" ")[0], target.encode(), line.rsplit(b" ", 1)[1])


@pytest.mark.parametrize(
    "fields, body, close, expect, upgrade",
    [
        (b"Content-Length: 5\r\n", 5, False, False, False),
        (b"Content-Length: 5, 5\r\n", 5, False, False, False),
        (b"Transfer-Encoding: chunked\r\n", "chunked", False, False, False),
        (b"Transfer-Encoding: Chunked\r\nConnection: close\r\n", "chunked", True, False, False),
        (b"Expect: 100-continue\r\nContent-Length: 9\r\n", 9, False, True, False),
        (b"Upgrade: websocket\r\nConnection: Upgrade\r\n", 0, False, False, True),
        (b"Connection: upgrade\r\n", 0, False, False, False),  # no Upgrade: nothing for a 101 to switch to
    ],
)
def test_body_framing_and_connection_options(
    fields: bytes, body: object, close: bool, expect: bool, upgrade: bool
) -> None:
    r = parsed(b"POST /x HTTP/1.1\r\n" + H + fields + b"\r\n")
    assert (r.body, r.close, r.expect, r.upgrade) == (body, close, expect, upgrade)


def test_http_1_0_closes_unless_kept_alive() -> None:
    assert parsed(b"GET / HTTP/1.0\r\n" + H + b"\r\n").close
    assert not parsed(b"GET / HTTP/1.0\r\n" + H + b"Connection: keep-alive\r\n\r\n").close


@pytest.mark.parametrize(
    "head, status",
    [
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"GET / HTTP/1.0\r\n\r\n", 400),  # no Host in HTTP/1.0 either: the server's default site
        (b"GET / HTTP/1.1\r\nHost: \r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a.test/x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: \xc3\xa9.test\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/1.1\r\n" + H + b" folded\r\n\r\n", 400),  # obs-fold
        (b"GET / HTTP/1.1\r\nHost : api.test\r\n\r\n", 400),  # space before the colon
        (b"GET / HTTP/1.1\r\nHost: api.test\rX: y\r\n\r\n", 400),  # a bare CR
        (b"GET / HTTP/1.1\r\nHost: api.test\nX: y\r\n\r\n", 400),  # a bare LF
        (b"GET /a b HTTP/1.1\r\n" + H + b"\r\n", 400),
        (b"GET / HTTP/2.0\r\n" + H + b"\r\n", 400),
        (b"CONNECT api.test:443 HTTP/1.1\r\n" + H + b"\r\n", 400),
        (b"GET api.test/x HTTP/1.1\r\n" + H + b"\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + H + b"X: " + b"a" * HEAD_MAX + b"\r\n\r\n", 431),
    ],
)
def test_what_it_refuses(head: bytes, status: int) -> None:
    got = innerhead.parse(head)
    assert isinstance(got, Bad) and got.status == status, got


def test_incomplete_until_the_blank_line_then_refused_past_head_max() -> None:
    assert innerhead.parse(b"GET / HTTP/1.1\r\n" + H) == "incomplete"
    assert isinstance(innerhead.parse(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (HEAD_MAX // 6)), Bad)


@given(st.binary(max_size=300))
def test_whatever_it_accepts_goes_upstream_with_no_bare_cr_or_lf(noise: bytes) -> None:
    """Fuzz: a head it accepts is forwarded as lines ending in CRLF, each a request line or a plain field."""
    got = innerhead.parse(b"GET / HTTP/1.1\r\nHost: api.test\r\nX: " + noise + b"\r\n\r\n")
    if isinstance(got, Inner):
        lines = got.head[:-4].split(b"\r\n")
        assert all(b"\r" not in ln and b"\n" not in ln for ln in lines)
        assert got.head.endswith(b"\r\n\r\n") and got.host == "api.test"
