"""An endless request head sent to an allowed host through the shared daemon (issue 22).

Before the head limit, one transparent connection streaming header lines grew the shared daemon from
0.39 to 2.7 GB in 10 s: mitmproxy buffers a head until it is whole. The probe streams header lines to
the allowed canary (up to STREAM_MAX, then ends the head, so a proxy that took it all would forward it
and the canary would log the marker); the daemon must answer 431 after about HEAD_MAX bytes and
close. Verify samples the daemon's memory while it streams (asked through askfiles, judged outside:
selftest/sidecar.py). The permitted twin: a large but ordinary head (half the limit) to
the same host is answered, and the canary logs it.

`stream_head` is also bench/fairshare.py's streamer. Stdlib only.
"""

from __future__ import annotations

import http.client
import socket
from typing import Any

from selftest import askfiles, markers
from selftest.probes.core import Ctx, Result, Unsupported, probe
from selftest.probes.netio import BODY_LIMIT, HTTP_TIMEOUT, USER_AGENT, net_failure

CONTEXTS = ("child",)  # one connection shows the bound; every context's traffic goes to the same daemon
MiB = 1 << 20
STREAM_MAX = 96 * MiB  # past the 64 MiB growth verify judges by: a daemon that buffers it all shows it
CUT_MAX = 8 * MiB  # sent before the cut: the limit plus what the kernel's socket buffers took meanwhile
LINE = b"X-Fill: " + b"a" * 1000 + b"\r\n"
CHUNK = LINE * 64
RSS_WAIT = 10.0  # seconds for verify to find the daemon and read its memory
PORT = 80  # the allowed canary's plain HTTP
SNDBUF = 256 << 10  # the probe's own send buffer: little of what it sent waits on its side


def _recv_reply(s: socket.socket) -> bytes:
    data = b""
    try:
        while len(data) < BODY_LIMIT:
            got = s.recv(BODY_LIMIT - len(data))
            if not got:
                break
            data += got
    except OSError:
        pass  # reset, timeout: what came before it is the reply
    return data


def stream_head(addr: tuple[str, int], host: str, target: str, most: int = STREAM_MAX) -> tuple[int, bytes]:
    """Send a request line and header lines until the peer stops taking them or `most` bytes went, then
    end the head; (bytes of header lines sent, the reply's first bytes)."""
    try:
        s = socket.create_connection(addr, timeout=HTTP_TIMEOUT)
    except OSError as e:
        raise net_failure(e) from e
    with s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)  # "taken" then means taken by the peer
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n".encode())
        sent = 0
        try:
            while sent < most:
                s.sendall(CHUNK)
                sent += len(CHUNK)
            s.sendall(b"Connection: close\r\n\r\n")  # a whole head at last: forwarded by a proxy that took it all
        except OSError:
            pass  # the daemon cut it: its answer is read below
        return sent, _recv_reply(s)


def legit_head(addr: tuple[str, int], host: str, target: str, size: int) -> tuple[int, bytes]:
    """An ordinary request with `size` bytes of headers (a cookie-heavy browser): (status, body)."""
    lines = b"".join(b"X-Fill-%d: " % i + b"b" * 1000 + b"\r\n" for i in range(size // 1024))
    head = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nConnection: close\r\n".encode()
    try:
        with socket.create_connection(addr, timeout=HTTP_TIMEOUT) as s:
            s.sendall(head + lines + b"\r\n")
            resp = http.client.HTTPResponse(s, method="GET")
            resp.begin()
            return resp.status, resp.read(BODY_LIMIT)
    except OSError as e:
        raise net_failure(e) from e


def memory_text(start: dict[str, Any] | None, end: dict[str, Any] | None) -> str:
    if start is None or end is None or "kib" not in start or "grew_kib" not in end:
        return "the daemon's memory was not measured (verify did not answer)"
    return (
        f"the daemon's RSS grew by {end['grew_kib'] / 1024:.1f} MiB while it streamed (from {start['kib'] / 1024:.0f})"
    )


def verdict(sent: int, reply: bytes) -> str:
    """Permitted when the daemon took far more than a head (or the head got through); blocked only by
    the limit's own answer, a 431; anything else (a stall, a bare close) cannot tell."""
    if sent >= CUT_MAX or reply.startswith(b"HTTP/1.1 2"):
        return "permitted"
    return "blocked" if reply.startswith(b"HTTP/1.1 431") else "unsupported"


@probe("network", "endless_head", "blocked", contexts=CONTEXTS)
def endless_head(c: Ctx) -> Result:
    """An endless request head to an allowed host: the shared daemon must answer 431 at its head limit and grow by under 64 MiB, not buffer it (v2: 2.3 GB)."""
    if c.spec.head_limit <= 0:
        raise Unsupported("verify named no head limit")
    addr, host = (c.spec.allowed_ip, PORT), c.spec.allowed_host
    try:
        twin = str(legit_head(addr, host, markers.control_path(c.mark, c.probe), c.spec.head_limit // 2))
    except Exception as e:  # the verdict is the attack's; the twin is judged outside by its canary
        twin = f"failed: {e}"
    start = askfiles.ask(c.spec.results_dir, "rss-start", c.mark, {}, RSS_WAIT)
    sent, reply = stream_head(addr, host, c.path)
    end = askfiles.ask(c.spec.results_dir, "rss-end", c.mark, {}, RSS_WAIT)
    status = reply.split(b"\r\n", 1)[0].decode("latin-1") or "no reply, closed"
    return verdict(sent, reply), (
        f"{sent} bytes of header lines taken, then {status!r} (limit {c.spec.head_limit}); "
        f"{memory_text(start, end)}; an ordinary {c.spec.head_limit // 2}-byte head: {twin[:80]}"
    )
