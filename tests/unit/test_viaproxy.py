"""netguard.daemon.viaproxy: the daemon's tunnel through a corporate proxy, against a fake proxy on loopback."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Awaitable, Callable

import pytest

from netguard.daemon import viaproxy
from netguard.daemon.viaproxy import TunnelError
from netguard.decision import answers
from netguard.upstreamproxy import Proxy

Answer = Callable[[bytes], Awaitable[bytes | None]]  # the head it got -> what it sends (None: close at once)


async def _with_proxy(answer: Answer, client: Callable[[Proxy], Awaitable[None]]) -> list[bytes]:
    heads: list[bytes] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        heads.append(head)
        reply = await answer(head)
        if reply is not None:
            w.write(reply)
            await w.drain()
            await asyncio.sleep(0.2)
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await client(Proxy("127.0.0.1", port, "u:pw"))
    return heads


def _run(answer: Answer, client: Callable[[Proxy], Awaitable[None]]) -> list[bytes]:
    return asyncio.run(_with_proxy(answer, client))


def test_a_2xx_opens_the_tunnel_and_what_follows_the_head_stays_in_the_socket() -> None:
    async def answer(head: bytes) -> bytes:
        return b"HTTP/1.1 200 Connection established\r\nVia: corp\r\n\r\nSSH-2.0-server-first\r\n"

    got: list[bytes] = []

    async def client(p: Proxy) -> None:
        s = await viaproxy.tunnel(p, "198.51.100.7:22")
        loop = asyncio.get_running_loop()
        got.append(await loop.sock_recv(s, 100))
        s.close()

    heads = _run(answer, client)
    assert got == [b"SSH-2.0-server-first\r\n"]  # the relay gets the upstream's first bytes, not the head
    basic = base64.b64encode(b"u:pw").decode()
    assert heads == [
        f"CONNECT 198.51.100.7:22 HTTP/1.1\r\nHost: 198.51.100.7:22\r\nProxy-Authorization: Basic {basic}\r\n\r\n".encode()
    ]


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
            "407 Proxy Authentication Required",
        ),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", "403 Forbidden"),
        (b"HTTP/1.0 502 Bad Gateway\r\n\r\n", "502 Bad Gateway"),
        (b"garbage that is no HTTP\r\n\r\n", "did not answer CONNECT with HTTP"),
        (None, "closed the connection without answering"),
    ],
)
def test_a_refusal_says_what_the_proxy_answered(reply: bytes | None, says: str) -> None:
    async def answer(head: bytes) -> bytes | None:
        return reply

    async def client(p: Proxy) -> None:
        with pytest.raises(TunnelError) as e:
            await viaproxy.tunnel(p, "198.51.100.7:443")
        assert says in e.value.why

    _run(answer, client)


def test_a_silent_proxy_times_out() -> None:
    async def answer(head: bytes) -> bytes | None:
        await asyncio.sleep(1)
        return None

    async def client(p: Proxy) -> None:
        with pytest.raises(TunnelError, match=r"no answer within 0\.3 s"):
            await viaproxy.tunnel(p, "198.51.100.7:443", wait=0.3)

    _run(answer, client)


def test_a_proxy_nobody_listens_on_is_a_tunnel_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now

    async def main() -> None:
        with pytest.raises(TunnelError, match="cannot connect"):
            await viaproxy.tunnel(Proxy("127.0.0.1", port), "198.51.100.7:443", wait=2)

    asyncio.run(main())


def test_the_502_an_explicit_client_gets() -> None:
    raw = answers.bad_gateway("upstream proxy http://p:1 did not tunnel CONNECT 1.2.3.4:443: 407 Proxy Auth")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and b"Connection: close" in head
    assert body == b"sandgate: upstream proxy http://p:1 did not tunnel CONNECT 1.2.3.4:443: 407 Proxy Auth\n"
    assert f"content-length: {len(body)}".encode() in head
