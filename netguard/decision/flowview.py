"""How the Gate reads a mitmproxy request: header text, whether a 403 can still be sent, fronting; the 403.

Small facts about one flow that the Gate's hooks need and that would otherwise crowd gate.py.
"""

from __future__ import annotations

from mitmproxy import ctx, http
from mitmproxy.proxy.mode_specs import RegularMode
from mitmproxy.utils import human

from netguard import hosts, rules, verdict
from netguard.decision import fronting
from netguard.decision.decide import norm_key as norm_key  # the pins' key: one definition, the decider's

ENC, ESC = "utf-8", "surrogateescape"


def fields(headers: http.Headers) -> list[tuple[str, str]]:
    """Header (name, value) pairs as text; bytes that are not UTF-8 survive the round trip (surrogateescape)."""
    return [(n.decode(ENC, ESC), v.decode(ENC, ESC)) for n, v in headers.fields]


def answerable(req: http.Request) -> bool:
    """Can mitmproxy send a 403 for this request? Only after holding its body: not when it is being
    streamed, or declares a body longer than stream_large_bodies (which mitmproxy would stream).

    A body of unknown length (HTTP/1 chunked, HTTP/2 without content-length) is held up to that limit
    (netguard.daemon.master: 1 MiB, so memory stays bounded) and then answered; past it mitmproxy gives up
    on the connection. Either way the upstream never sees the request.
    """
    limit = human.parse_size(ctx.options.stream_large_bodies) if "stream_large_bodies" in ctx.options else None
    if req.stream:
        return False
    length = req.headers.get("content-length", "")
    return limit is None or not length.isdigit() or int(length) <= limit


def fronted(flow: http.HTTPFlow, host: str) -> str | None:
    """Why a request is domain fronting (netguard.decision.fronting), or None. Explicit proxy: the name judged
    is the CONNECT's or the URL's. Transparent: the Host itself was judged, so only TLS has a second name
    (the SNI) to differ from it."""
    req = flow.request
    port: int | None = None
    if isinstance(flow.client_conn.proxy_mode, RegularMode):
        named, p = hosts.split_host_port((req.host_header or "").strip())  # judged: the CONNECT's or URL's name
        judged, port = host, int(p) if p and p.isdigit() and req.scheme == "https" else None
    else:
        # host: already taken from the Host header; only a TLS request has a second name, its SNI
        named, judged = host, (flow.client_conn.sni or "") if req.scheme == "https" else ""
    if not named and judged and req.scheme == "https":  # inside TLS: a shared server would pick its default site
        return fronting.NO_HOST
    if not named or not judged:
        return None
    if (why := fronting.by_host(named or "", judged, port, req.port)) is not None:
        return why
    if not req.authority or req.is_http2:  # HTTP/2's :authority is what the Host check above read
        return None
    return fronting.by_target(req.authority, judged, req.port)


def refusal(host: str, port: int, decision: rules.Decision, close: bool = True) -> http.Response:
    """The 403 a refused HTTP client or CONNECT gets: the body names host:port, the reason and the rule."""
    body = verdict.refusal_text(host, port, decision) + "\n"
    headers = {"Content-Type": "text/plain; charset=utf-8", "X-Sandgate": "blocked"}
    return http.Response.make(403, body, {**headers, "Connection": "close"} if close else headers)
