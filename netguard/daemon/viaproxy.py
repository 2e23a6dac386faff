"""The upstream dial of an allowed flow through its run's corporate proxy (netguard.upstreamproxy).

After the decision, the daemon connects to the proxy and sends `CONNECT <checked-ip>:<port>`: the
proxy reaches the very address the SSRF veto judged, and a denied flow never gets here. The proxy's
answer head is read with MSG_PEEK and then exactly its length is consumed, so whatever the upstream
sends after it stays in the socket for the relay. A proxy that refuses (407, 403, 502...), that does
not answer within WAIT or that answers garbage fails the flow: the client gets a clear error where
its protocol has one (a 502 to an explicit CONNECT) and the sandbox's log gets one `request` record
(method CONNECT, status null, reason "failed: upstream proxy ... 407 ...": never the credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

from netguard import upstreamproxy
from netguard.audit import Kind, request_record
from netguard.daemon import dial, peek
from netguard.decision.binding import Binding
from netguard.decision.decide import Decided
from netguard.upstreamproxy import Proxy, UpstreamError

WAIT = 30.0  # seconds for the proxy's TCP connect and its answer to CONNECT


class TunnelError(Exception):
    """The proxy did not open the tunnel; `why` says what happened (no credentials)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def authority(b: Binding, d: Decided) -> str:
    """What the proxy is asked to reach: the checked address (or, with by_name, the judged name)."""
    ip = d.verdict.ip
    assert ip is not None  # only an allowed decision is dialled
    up = b.upstream_proxy
    return upstreamproxy.target(ip, d.host, d.port, up is not None and up.by_name)


async def dial_via(b: Binding, d: Decided, proxy: Proxy, kind: Kind) -> tuple[socket.socket | None, str | None]:
    """A socket tunnelled through `proxy` to `d`'s checked address, or (None, why): recorded in `b`'s log."""
    target, t0 = authority(b, d), time.monotonic()
    try:
        return await tunnel(proxy, target), None
    except TunnelError as e:
        why = upstreamproxy.refusal(proxy, target, e.why)
    ms = int((time.monotonic() - t0) * 1000)
    b.audit.write(
        request_record(b.task, d.id, kind, "allow", d.host, d.port, "CONNECT", target, status=None,
                       duration_ms=ms, rule=d.verdict.decision.rule, reason=f"failed: {why}")
    )  # fmt: skip
    return None, why


async def tunnel(proxy: Proxy, target: str, wait: float = WAIT) -> socket.socket:
    """A connected socket whose bytes now go to `target` through `proxy`; TunnelError if it refused."""
    try:
        async with asyncio.timeout(wait):
            up = await _connect(proxy)
            try:
                await _handshake(up, proxy, target, wait)
            except BaseException:
                up.close()
                raise
            return up
    except TimeoutError:
        raise TunnelError(f"no answer within {wait:g} s") from None
    except OSError as e:
        raise TunnelError(e.strerror or str(e)) from None


async def _connect(proxy: Proxy) -> socket.socket:
    """A TCP connection to the proxy, resolved by the daemon's host (the proxy lives on the host's network)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    last: OSError = OSError(f"cannot resolve {proxy.host}")
    for family, _, _, _, addr in infos:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            await loop.sock_connect(s, addr)
        except OSError as e:
            s.close()
            last = e
            continue
        except BaseException:
            s.close()
            raise
        dial.nodelay(s)
        return s
    raise TunnelError(f"cannot connect: {last.strerror or last}")


async def _handshake(up: socket.socket, proxy: Proxy, target: str, wait: float) -> None:
    """CONNECT sent, the answer's head read (and only the head); TunnelError unless it is 2xx."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(up, upstreamproxy.connect_request(target, proxy))
    bad: list[str] = []

    def whole(buf: bytes) -> bool:
        try:
            return upstreamproxy.head_end(buf) is not None
        except UpstreamError as e:
            bad.append(str(e))
            return True

    data, _ = await peek.until(up, whole, wait)
    if bad:
        raise TunnelError(bad[0])
    n = upstreamproxy.head_end(data) if data else None
    if n is None:
        raise TunnelError("the proxy closed the connection without answering CONNECT")
    if len(up.recv(n)) != n:  # the head only: it was all there (peeked)
        raise TunnelError("the proxy's answer could not be read")
    try:
        reply = upstreamproxy.parse_reply(data[:n])
    except UpstreamError as e:
        raise TunnelError(str(e)) from None
    if not reply.ok:
        raise TunnelError(f"{reply.status} {reply.reason}".rstrip())


def close_quietly(s: socket.socket | None) -> None:
    if s is not None:
        with contextlib.suppress(OSError):
            s.close()
