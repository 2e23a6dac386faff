"""Domain fronting: a request naming another origin than the one its connection was judged for. Pure.

The threat: a shared server (a CDN, a virtual host) serves by the Host, so `CONNECT allowed.test` +
`Host: evil.test` inside TLS, or plain `GET http://allowed.test/` + `Host: evil.test`, reaches evil.test.
Both paths that read requests ask here: the Gate (netguard.decision.flowview) and the front door's
inspected path (netguard.daemon.tlshttp).
"""

from __future__ import annotations

from netguard import hosts
from netguard.decision.decide import norm_key

NO_HOST = "no Host header: a shared server would answer for its default site, not the name judged (domain fronting)"


def by_host(named: str, judged: str, port: int | None = None, judged_port: int | None = None) -> str | None:
    """Why a Host naming `named` (and `port`, if it names one) on a connection judged for `judged`:`judged_port`
    is fronting, or None (a name unknown on either side: None). A server that routes by name and port (Envoy's
    virtual hosts) picks its site by both."""
    if not named or not judged:
        return None
    if norm_key(named, 0)[0] != norm_key(judged, 0)[0]:
        return f"Host header names {named}, not {judged}, the name this connection was judged for (domain fronting)"
    if port is not None and judged_port is not None and port != judged_port:
        return f"Host header names port {port}, not {judged_port}, the port this connection was judged for (domain fronting)"
    return None


def by_target(authority: str, tls: str, port: int) -> str | None:
    """An absolute-form target (`GET https://other.test/x`) names the origin a server must serve, Host aside
    (RFC 9112 3.2.2; nginx picks its server by it): it must be the TLS name and port too (issue 24 review:
    `--request-target https://pass.test/...` in a tunnel to api.test carried api.test's credential)."""
    named, p = hosts.split_host_port(authority)
    if norm_key(named or "", 0)[0] == norm_key(tls, 0)[0] and p in (None, str(port)):
        return None
    return f"request target names {authority}, not {tls}:{port}, the origin of this TLS connection"
