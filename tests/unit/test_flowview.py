"""flowview.fronted: a decrypted request must be for the origin its TLS connection is for (domain fronting)."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow, tutils

from netguard.decision import flowview


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
