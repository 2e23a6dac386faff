"""The daemon's asyncio side of its control socket: receive one message, answer a refused peer, say ready.

asyncio has no recvmsg with ancillary data (the fds a bind carries), so a message is read with
MSG_DONTWAIT once the socket is readable.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from netguard.daemon import specfd
from netguard.daemon.control import close_fds, recv_raw, send_message
from netguard.daemon.daemonpath import report_ready as report_ready


async def recv(sock: socket.socket) -> tuple[bytes, list[int], int]:
    """One message; a bind whose spec is in a memfd comes back expanded (specfd.expand, off the event loop:
    a new policy of 10^5 names takes a while to decode, and other sandboxes are served meanwhile)."""
    data, fds, flags = await recv_unexpanded(sock)
    if not specfd.names_memfd(data, fds):
        return data, fds, flags
    if specfd.small(fds[-1]):
        return specfd.expand(data, fds, flags)  # a few ms at most: a thread hop would cost more
    return await asyncio.to_thread(specfd.expand, data, fds, flags)


async def recv_unexpanded(sock: socket.socket) -> tuple[bytes, list[int], int]:
    """recvmsg once the socket is readable (asyncio has no recvmsg with ancillary data)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return recv_raw(sock, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            pass
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(sock.fileno(), _wake, fut)
        try:
            await fut
        finally:
            loop.remove_reader(sock.fileno())


async def refuse(conn: socket.socket, why: str) -> None:
    """Answer a refused peer's first request with why (within a second), then close: nothing else is read."""
    try:
        async with asyncio.timeout(1.0):
            _, fds, _ = await recv_unexpanded(conn)  # a refused peer's memfd is never read
        close_fds(fds)
        send_message(conn, err(f"refused: {why}; only a launcher outside every sandbox may use the daemon"))
    except (OSError, ValueError, TimeoutError):
        pass
    finally:
        conn.close()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def err(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text}
