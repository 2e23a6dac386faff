"""The upstream connect of a flow the front door decided: to the pinned address, started at once.

Started synchronously (the SYN leaves before the explicit path's `200` is sent: the upstream
handshake overlaps the client's turn), and finished without a loop turn when the kernel has
already completed it (a local upstream usually has). None / False: it failed, the socket is
closed, and so is the client (as for mitmproxy's connect errors).
"""

from __future__ import annotations

import asyncio
import errno
import select
import socket

from netguard.decision.decide import Decided


async def connect(d: Decided) -> socket.socket | None:
    """A socket connected to the pinned address, or None."""
    up = start(d)
    if up is None:
        return None
    try:
        return up if await connected(up) else None
    except BaseException:
        up.close()
        raise


def start(d: Decided) -> socket.socket | None:
    """A non-blocking connect to the pinned address, begun now; None if it failed at once."""
    ip = d.verdict.ip
    assert ip is not None  # only an allowed decision has one
    up = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    up.setblocking(False)
    nodelay(up)
    if up.connect_ex((ip, d.port)) not in (0, errno.EINPROGRESS):
        up.close()
        return None
    return up


async def connected(up: socket.socket) -> bool:
    """Wait until `up`'s connect finished; False (and `up` closed) if it failed. The cancelled caller closes it."""
    if not _writable_now(up):
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        loop.add_writer(up.fileno(), lambda: None if done.done() else done.set_result(None))
        try:
            await done
        finally:
            loop.remove_writer(up.fileno())
    if up.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:  # read once: reading clears it
        up.close()
        return False
    return True


def _writable_now(up: socket.socket) -> bool:
    """The connect has finished (succeeded or failed): poll says writable, no loop turn needed."""
    p = select.poll()
    p.register(up, select.POLLOUT)
    return bool(p.poll(0))


def nodelay(s: socket.socket) -> None:
    """TCP_NODELAY on a relayed socket: the relay forwards what it reads as it reads it, so Nagle's
    algorithm only holds a second small write (a server's TLS session tickets, then its response) for
    the ACK the client delays 40 ms (issue 25: +42.9 ms per new HTTPS response; mitmproxy's own
    transports set it too)."""
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
