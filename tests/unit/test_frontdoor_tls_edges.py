"""The front door's inspected path at its edges: heads it refuses, an upstream that does not verify, clients
and runs it must leave to mitmproxy, and many clients at once (machinery: test_frontdoor_tls)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from netguard.credentials import Secret
from sgbase.origin import Origin

from ..support.dnsfake import FakeDns
from ..support.httpsorigin import ANSWERS, BODY, HttpsOrigin
from ..support.tlsharness import get_h2
from .test_frontdoor_tls import LISTENERS, Tls, both, origin, records, req, same

__all__ = ["origin"]  # the fixture, shared with test_frontdoor_tls

MALFORMED = {
    "two lengths": (
        b"Content-Length: 1\r\nContent-Length: 2\r\n",
        b"400 Bad Request",
        b"Content-Length is not one number",
    ),
    "chunked and a length": (
        b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n",
        b"400 Bad Request",
        b"both Transfer-Encoding and",
    ),
    "another coding": (b"Transfer-Encoding: gzip\r\n", b"501 Not Implemented", b"Transfer-Encoding other than chunked"),
    "no host": (b"", b"400 Bad Request", b"a request needs exactly one Host field"),
    "empty host": (b"", b"400 Bad Request", b"the Host field names no host"),
    "http/1.0 without host": (b"", b"400 Bad Request", b"a request needs exactly one Host field"),
}
# Heads that are whole requests but for their Host: a shared server would answer them for its default site.
_HOSTLESS = {
    "no host": b"GET /len HTTP/1.1\r\nUser-Agent: t\r\n\r\n",
    "empty host": b"GET /len HTTP/1.1\r\nHost: \r\nUser-Agent: t\r\n\r\n",
    "http/1.0 without host": b"GET /len HTTP/1.0\r\nUser-Agent: t\r\n\r\n",
}


@contextlib.contextmanager
def fast_only(tmp: Path, mp: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns]) -> Iterator[Tls]:
    w = Tls(tmp, mp, True, *origin)
    try:
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("listener", LISTENERS)
@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_head_is_refused_and_never_reaches_the_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str, case: str
) -> None:
    """The front door alone: mitmproxy answers the first three with its own HTML 400 page (also for gzip, where
    the front door says 501); a request without a Host (or an empty one) is refused on both (the Gate: as
    fronting, test_gate_refuses_a_hostless_request_inside_tls), each in its own words: nothing to compare."""
    extra, status, why = MALFORMED[case]
    bad = req("/echo", "POST", extra=extra) + b"ab" if extra else _HOSTLESS[case]
    with fast_only(tmp_path, monkeypatch, origin) as w, w.connect(listener) as c:
        assert c.ask(req("/len")) == ANSWERS["/len"][0] + BODY  # the path took the connection
        got = c.ask(bad) + c.rest()
        assert got.startswith(b"HTTP/1.1 " + status + b"\r\n") and b"X-Sandgate: blocked" in got and why in got
        assert got.endswith(b"<EOF>")  # a head it will not read ends the connection (nothing to hand on)
        assert w.served == ["/len"] and origin[0].got == [req("/len")]
        assert [r["path"] for r in w.settled(records(listener, 1, 1)) if r["event"] == "request"][-1:] == ["/len"]


@pytest.mark.parametrize("listener", LISTENERS)
def test_an_upstream_certificate_that_does_not_verify_is_a_502_and_gets_no_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    def scenario(w: Tls) -> tuple[Any, int]:
        if listener == "explicit":
            w.warm()  # taught through the real origin: the front door then takes the CONNECT
        w.origin.ctx = w.origin.untrusted  # an impostor now answers for insp.test
        with w.connect(listener) as c:
            return [c.ask(req("/len")), c.rest()], records(listener, 1, 1)

    (_, got_m, rec_m, up_m), (fast, got_f, rec_f, up_f) = both(monkeypatch, tmp_path, origin, scenario)
    assert fast.served == ["/len"] and up_m == up_f == [] and origin[0].conns == 0
    for got in (got_m, got_f):
        assert got[0].startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and got[1] == b"<EOF>"
    # The 502's page and OpenSSL's words differ (mitmproxy's own HTML, "Certificate verify failed: unable to
    # get local issuer certificate"; the front door's text, "certificate verify failed"): the rest agrees.
    assert b"<h1>502 Bad Gateway</h1>" in got_m[0] and b"X-Sandgate: upstream" in got_f[0]
    said = f"failed: sandgate: upstream certificate verify failed for insp.test:{fast.p} ("
    assert b"upstream certificate verify failed for insp.test:%d" % fast.p in got_f[0]
    for rec in (rec_m, rec_f):
        last = rec[-1]
        assert (last["event"], last["status"], last["bytes_down"]) == ("request", None, 0)
        assert last["reason"].startswith(said) and "verify failed" in last["reason"][len(said) :].lower()
    assert [{**r, "reason": r["reason"][: len(said)]} for r in rec_f] == [
        {**r, "reason": r["reason"][: len(said)]} for r in rec_m
    ]


@pytest.mark.parametrize("listener, taught", [("transparent", False), ("transparent", True), ("explicit", True)])
def test_an_h2_only_client_is_left_to_mitmproxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str, taught: bool
) -> None:
    """A client offering only h2 (gRPC, Go with NextProtos ["h2"]) gets h2 from mitmproxy, which speaks
    HTTP/1.1 upstream for it; the inspected path speaks HTTP/1.1 only, so it must never take one. `taught`:
    after an HTTP/1.1 exchange taught the daemon that the upstream answers HTTP/1.1, as in any run after
    its first connection to the host. Explicit: the front door took the CONNECT before the hello showed h2
    only, and bridges the tunnel to mitmproxy (tlshttp.tunnel): the same answers, the same records."""

    def scenario(w: Tls) -> tuple[Any, int]:
        if taught:
            w.warm()
        alpn: str | None = "no handshake"
        try:
            with w.connect(listener, alpn=["h2"]) as c:
                alpn = c.s.selected_alpn_protocol()
                return (alpn, get_h2(c.s, "insp.test", "/len")), 2 + 2 * taught
        except (OSError, AssertionError) as e:  # said as what the client got, beside what mitmproxy's client got
            return (alpn, f"failed: {type(e).__name__}: {e}"), 2 * taught

    fast, got = same(monkeypatch, tmp_path, origin, scenario)
    assert got == ("h2", (200, BODY)) and fast.served == []


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_client_offering_h2_and_http1_to_a_known_http1_upstream_gets_http1_on_either_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    def scenario(w: Tls) -> tuple[Any, int]:
        w.warm()
        with w.connect(listener, alpn=["h2", "http/1.1"]) as c:
            return (c.s.selected_alpn_protocol(), c.ask(req("/len"))), 4

    fast, got = same(monkeypatch, tmp_path, origin, scenario)
    assert got == ("http/1.1", ANSWERS["/len"][0] + BODY) and fast.served == ["/len"]


def test_thirty_clients_at_once_each_get_their_own_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns]
) -> None:
    """30 kept-alive clients on both listeners, three requests each, all at once: no answer crosses over."""
    with fast_only(tmp_path, monkeypatch, origin) as w:
        w.warm()

        def client(i: int) -> bool:
            with w.connect(LISTENERS[i % 2]) as c:
                for k in range(3):
                    target = f"/id/{i}-{k}".encode()
                    if c.ask(req(target.decode())) != b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (
                        len(target), target,
                    ):  # fmt: skip
                        return False
            return True

        with ThreadPoolExecutor(30) as pool:
            assert all(pool.map(client, range(30)))
        assert sorted(w.served) == sorted(f"/id/{i}-{k}" for i in range(30) for k in range(3))
        assert len([r for r in w.settled(2 + 30 + 90) if r["event"] == "request"]) == 91
        assert origin[0].conns == 30  # one upstream connection per client, kept for its three requests


REAL = "sk-REALSECRETVALUE0123456789"
SECRET = Secret(
    "insp.test", "Authorization", f"Bearer {REAL}", REAL, "sk-sandgate-sentinel-0f0f", "API_KEY", Origin("p", 1)
)


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_run_with_a_brokered_credential_is_left_to_mitmproxy_which_brokers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    def scenario(w: Tls) -> tuple[Any, int]:
        w.binding.secrets = (SECRET,)  # leak checks, brokering and scrubbing are mitmproxy's alone
        with w.connect(listener) as c:
            return c.ask(req("/len", extra=b"Authorization: Bearer %s\r\n" % SECRET.sentinel.encode())), records(
                listener, 1, 1
            )

    fast, got = same(monkeypatch, tmp_path, origin, scenario)
    assert got == ANSWERS["/len"][0] + BODY and fast.served == []
    assert b"\r\nAuthorization: Bearer " + REAL.encode() + b"\r\n" in origin[0].got[-1]  # brokered on its way
    assert SECRET.sentinel.encode() not in origin[0].got[-1]


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_get_whose_body_hides_a_request_is_refused_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: tuple[HttpsOrigin, FakeDns], listener: str
) -> None:
    """CL.0 smuggling: `GET /len` whose body is `DELETE /len ...`. An origin endpoint that ignored the length
    would run the DELETE, which no rule judged; so the GET is refused (httprules.BODILESS) and never sent."""
    smuggled = req("/len", "DELETE")

    def scenario(w: Tls) -> tuple[Any, int]:
        if listener == "explicit":
            w.warm()  # the front door takes the CONNECT (tlshttp.takes)
        with w.connect(listener) as c:
            got = c.ask(req("/len", extra=b"Content-Length: %d\r\n" % len(smuggled)) + smuggled)
            after = c.ask(req("/len"))  # the refused body was drained, not read as a request
        return (got.split(b"\r\n", 1)[0], b"CL.0 request smuggling" in got, after), records(listener, 1, 2)

    fast, got = same(monkeypatch, tmp_path, origin, scenario)
    assert got == (b"HTTP/1.1 403 Forbidden", True, ANSWERS["/len"][0] + BODY)
    assert fast.served == ["/len", "/len"] and fast.origin.got == [req("/len")]
