"""The HTTP answers the daemon writes itself on a socket (403, 431), as bytes, without mitmproxy.

The front door refuses before mitmproxy is imported (a cold daemon: issue 25), so it cannot build a
mitmproxy Response. These are the same bytes mitmproxy would send for netguard.decision.flowview's
`refusal` (tests/unit/test_answers.py compares them): a client sees one answer whichever path refused it.
"""

from __future__ import annotations

from netguard import rules, verdict
from netguard.decision.limits import HEAD_MAX


def _response(status: str, headers: tuple[tuple[str, str], ...], body: bytes, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{version} {status}", *(f"{n}: {v}" for n, v in headers), f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def forbidden(host: str, port: int, decision: rules.Decision, close: bool = True) -> bytes:
    """The 403 a refused CONNECT gets: the body names host:port, the reason and the rule; then the close
    (`close` False: a request inside TLS, whose connection goes on, as flowview.refusal's)."""
    body = (verdict.refusal_text(host, port, decision) + "\n").encode()
    headers = (("Content-Type", "text/plain; charset=utf-8"), ("X-Sandgate", "blocked"))
    return _response("403 Forbidden", (*headers, ("Connection", "close")) if close else headers, body)


def refused_request(text: str, version: str = "HTTP/1.1") -> bytes:
    """The 403 for one judged request (netguard.decision.inspected.refusal_text); the connection stays open."""
    headers = (("Content-Type", "text/plain; charset=utf-8"), ("X-Sandgate", "blocked"))
    return _response("403 Forbidden", headers, text.encode(), version)


def bad_request(status: int, why: str) -> bytes:
    """The answer to a request head the front door's inspected path refuses to read (400, 431, 501), then the close."""
    reason = {400: "Bad Request", 431: "Request Header Fields Too Large", 501: "Not Implemented"}[status]
    headers = (("Content-Type", "text/plain; charset=utf-8"), ("X-Sandgate", "blocked"), ("Connection", "close"))
    return _response(f"{status} {reason}", headers, f"sandgate: {why}\n".encode())


def bad_gateway(why: str, source: str = "upstream-proxy") -> bytes:
    """The 502 for an upstream that failed the client (`source`: which one), then the close."""
    body = f"sandgate: {why}\n".encode()
    headers = (("Content-Type", "text/plain; charset=utf-8"), ("X-Sandgate", source), ("Connection", "close"))
    return _response("502 Bad Gateway", headers, body)


_TOO_LARGE_BODY = f"sandgate: request head larger than {HEAD_MAX} bytes\n".encode()
#: The answer to a request head past HEAD_MAX (netguard.decision.headlimit, the front door), then the close.
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    + f"Content-Length: {len(_TOO_LARGE_BODY)}\r\n\r\n".encode()
    + _TOO_LARGE_BODY
)
#: The answer to a request head not whole within the deadline (netguard.decision.limits), then the close.
TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
