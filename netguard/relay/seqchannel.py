"""One end of an AF_UNIX SOCK_SEQPACKET socketpair on the event loop: datagrams with fds (SCM_RIGHTS).

The daemon and each relay worker talk over one (netguard.relay.relaywire). Sending never blocks the
loop: a datagram the kernel cannot take yet waits in order in a queue, its fds held (still ours)
until it is sent, then closed here, because once sent the receiver holds the sockets. EOF (the other
process exited or died) is reported once; a datagram whose fds were cut short (MSG_CTRUNC) is too,
as the other side is then not one we can trust to count.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from collections.abc import Callable, Sequence

from netguard.relay.relaywire import MAX_DATAGRAM

MAX_FDS = 2  # per datagram: one flow's two sockets


class Channel:
    """`on_message(data, fds)` per datagram received (fds are the callee's); `on_eof()` once, then closed."""

    def __init__(
        self,
        sock: socket.socket,
        on_message: Callable[[bytes, list[int]], None],
        on_eof: Callable[[], None],
    ) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._on_eof: Callable[[], None] | None = on_eof
        self._out: deque[tuple[bytes, Sequence[int]]] = deque()
        self.closed = False
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._readable)

    def send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """Send `data` with `fds` (ours from now on: closed once sent, or when the channel closes)."""
        if self.closed:
            _close_all(fds)
            return
        self._out.append((data, fds))
        if len(self._out) == 1:
            self._flush()

    @property
    def queued(self) -> int:
        return len(self._out)

    def _flush(self) -> None:
        while self._out:
            data, fds = self._out[0]
            try:
                if fds:
                    socket.send_fds(self._sock, [data], list(fds))
                else:
                    self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._sock.fileno(), self._writable)
                return
            except OSError:
                self._eof()  # the other end is gone: what we still hold is closed with the channel
                return
            self._out.popleft()
            _close_all(fds)  # the receiver holds them now (or they close with its end)
        self._loop.remove_writer(self._sock.fileno())

    def _writable(self) -> None:
        self._flush()

    def _readable(self) -> None:
        while not self.closed:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, MAX_DATAGRAM, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._eof()
                return
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or (not data and not fds):
                _close_all(fds)
                self._eof()  # EOF, or a datagram we cannot read whole
                return
            self._on_message(data, fds)

    def _eof(self) -> None:
        on_eof, self._on_eof = self._on_eof, None
        self.close()
        if on_eof is not None:
            on_eof()

    def close(self) -> None:
        """Stop and close the socket; fds still queued are closed (their flows end with the other side)."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._loop.remove_writer(self._sock.fileno())
        while self._out:
            _close_all(self._out.popleft()[1])
        self._sock.close()


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
