"""flowview.fronted: a request must be for the origin it was judged for (domain fronting), inside TLS or plain."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow, tutils

from netguard.decision import flowview, fronting


def tunnelled(target: str, host_header: str = "api.test") -> http.HTTPFlow:
    """A request read inside `CONNECT api.test:443` (explicit proxy), its request line as sent."""
    f = tflow.tflow()
    f.client_conn.proxy_mode = ProxyMode.parse("regular")
    req = tutils.treq(method=b"GET", scheme=b"https", host="api.test", port=443, path=b"/v1/x")
    req.authority = target
    req.headers["Host"] = host_header
    f.request = req
    return f


@pytest.mark.parametrize("authority", ["", "api.test", "api.test:443", "API.TEST"])
def test_the_tls_origin_passes(authority: str) -> None:
    assert flowview.fronted(tunnelled(authority), "api.test") is None


@pytest.mark.parametrize("authority", ["pass.test", "pass.test:443", "api.test:8443", "api.test.evil.test"])
def test_an_absolute_form_target_naming_another_origin_is_fronting(authority: str) -> None:
    """Issue 24 review: `GET https://pass.test/...` in a tunnel to api.test carried api.test's credential."""
    why = flowview.fronted(tunnelled(authority), "api.test")
    assert why is not None and why.startswith(f"request target names {authority}, not api.test:443")


def test_a_host_header_naming_another_origin_is_fronting() -> None:
    why = flowview.fronted(tunnelled("", host_header="pass.test"), "api.test")
    assert why is not None and "Host header names pass.test" in why


@pytest.mark.parametrize("host_header", [None, "", "  "])
def test_gate_refuses_a_hostless_request_inside_tls(host_header: str | None) -> None:
    """No Host (or an empty one) inside `CONNECT api.test`: a shared server answers for its default site."""
    f = tunnelled("")
    if host_header is None:
        del f.request.headers["Host"]
    else:
        f.request.headers["Host"] = host_header
    assert flowview.fronted(f, "api.test") == fronting.NO_HOST


def plain(host_header: str, mode: str = "regular", url_host: str = "allowed.test") -> http.HTTPFlow:
    """A plain `GET http://allowed.test:8080/x` read by the explicit (or transparent) listener."""
    f = tflow.tflow()
    f.client_conn.proxy_mode = ProxyMode.parse(mode)
    req = tutils.treq(method=b"GET", scheme=b"http", host=url_host, port=8080, path=b"/x")
    req.authority = f"{url_host}:8080" if mode == "regular" else ""
    req.headers["Host"] = host_header
    f.request = req
    return f


@pytest.mark.parametrize("host_header", ["allowed.test", "Allowed.Test:8080", "allowed.test:80", ""])
def test_a_plain_request_whose_host_names_its_url_passes(host_header: str) -> None:
    assert flowview.fronted(plain(host_header), "allowed.test") is None


def test_a_plain_request_whose_host_names_another_site_is_fronting() -> None:
    """`GET http://allowed.test/` + `Host: evil.test`: judged for allowed.test, a shared server would serve evil.test."""
    why = flowview.fronted(plain("evil.test"), "allowed.test")
    assert why is not None and why.startswith("Host header names evil.test, not allowed.test")


def test_a_transparent_plain_request_is_judged_by_its_host_and_never_fronting() -> None:
    """Only a TLS request has a second name (its SNI): one left on the client record never judges plain HTTP."""
    assert flowview.fronted(plain("evil.test", "transparent", url_host="evil.test"), "evil.test") is None
