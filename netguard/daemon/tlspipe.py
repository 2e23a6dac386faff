"""TLS the front door terminates or originates itself: pyOpenSSL over memory BIOs on a non-blocking socket.

The inspected path (netguard.daemon.tlshttp) uses the very SSL.Context objects mitmproxy's path gets
from netguard.decision.tlsinspect (the run's leaf towards the sandbox; the verified trust store, SNI
and name check towards the upstream), so both paths offer and check the same thing. Each record
OpenSSL writes is sent as one `sendall` of everything pending (TCP_NODELAY is on: no Nagle stall).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from OpenSSL import SSL

RAW_READ = 256 * 1024  # ciphertext per socket read
_RECORD = 16 * 1024  # TLS plaintext per record (RFC 8446 5.1): what one SSL_read can return
CHUNK = 256 * 1024  # plaintext per exchange step (netguard.daemon.httpexchange): fewer, larger loop turns


class TlsError(Exception):
    """The TLS handshake failed (the peer's certificate, a protocol error) or the peer left during it."""


class TlsPipe:
    """One TLS connection over `sock` (owned by the caller); `conn` is set to accept or connect state already."""

    raw: socket.socket | None = None  # bytes on the socket are not the bytes read: never spliced
    chunk = CHUNK

    def __init__(self, sock: socket.socket, conn: SSL.Connection) -> None:
        self.sock, self.conn = sock, conn
        self._loop = asyncio.get_running_loop()
        self._eof = False
        self._back = b""  # bytes read past what the caller wanted (a request head's body): recv gives them first
        # One writer at a time: a body's copy sends while the response is read, and a read may have records to
        # send too (a key update's answer); two sendalls at once would interleave their bytes mid-record.
        self._sending = asyncio.Lock()

    async def handshake(self) -> None:
        """The whole handshake (the caller bounds it in time); TlsError when it fails."""
        while True:
            try:
                self.conn.do_handshake()
                break
            except SSL.WantReadError:
                await self._flush()
                if not await self._fill():
                    raise TlsError("the peer closed during the TLS handshake") from None
            except SSL.Error as e:
                with contextlib.suppress(OSError):
                    await self._flush()  # the alert, so the peer learns why
                raise TlsError(_why(e)) from None
        await self._flush()

    async def recv(self, n: int) -> bytes:
        """Up to `n` decrypted bytes; b"" at the peer's close (close_notify, or the TCP close)."""
        if self._back:
            out, self._back = self._back[:n], self._back[n:]
            return out
        while True:
            try:
                return self._more(self.conn.recv(min(n, _RECORD)), n)
            except SSL.WantReadError:
                pass
            except SSL.ZeroReturnError:
                return b""
            except SSL.SysCallError:
                return b""  # EOF without close_notify: what mitmproxy takes as the end too
            except SSL.Error as e:
                raise OSError(_why(e)) from None
            await self._flush()  # reading may have produced records to send (a key update's answer)
            if not await self._fill():
                self.conn.bio_shutdown()

    def _more(self, first: bytes, n: int) -> bytes:
        """`first` and whatever else OpenSSL can decrypt now, up to `n`: one SSL_read returns one record
        (16 KiB), and a loop turn per record cost more than the cryptography (measured: 3 CPU-s per GB)."""
        out, total = [first], len(first)
        while total < n:
            try:
                more = self.conn.recv(min(n - total, _RECORD))
            except SSL.Error:
                break  # WantRead (nothing more now), or the end: the next recv says which
            out.append(more)
            total += len(more)
        return out[0] if len(out) == 1 else b"".join(out)

    async def send(self, data: bytes) -> None:
        try:
            self.conn.sendall(data)  # into the memory BIO: always whole
        except SSL.Error as e:
            raise OSError(_why(e)) from None
        await self._flush()

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def unread(self, data: bytes) -> None:
        """Give back bytes read too far: the next recv returns them first."""
        self._back = data + self._back

    def idle_open(self) -> bool:
        """Still open, with no application data nobody asked for: records that came since (TLS 1.3 session
        tickets a server sends after its first response) are read into OpenSSL without waiting."""
        if self._back or self._eof:
            return False
        for _ in range(4):  # tickets are a few hundred bytes: an upstream that keeps sending is not idle
            try:
                data = self.sock.recv(RAW_READ, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return False
            if not data:
                return False  # closed
            self.conn.bio_write(data)
        else:
            return False
        try:
            self.conn.recv(1, socket.MSG_PEEK)  # SSL_peek: handshake records are consumed, data stays
        except SSL.WantReadError:
            return True
        except SSL.Error:
            return False  # closed (close_notify) or broken
        return False  # an answer nobody asked for

    async def _fill(self) -> bool:
        """The socket's next bytes into OpenSSL; False at its close."""
        if self._eof:
            return False
        data = await self._loop.sock_recv(self.sock, RAW_READ)
        if not data:
            self._eof = True
            return False
        self.conn.bio_write(data)
        return True

    async def _flush(self) -> None:
        async with self._sending:  # records leave in the order OpenSSL made them, each whole
            out = []
            while True:
                try:
                    out.append(self.conn.bio_read(RAW_READ))
                except SSL.WantReadError:
                    break
            if out:
                await self._loop.sock_sendall(self.sock, b"".join(out))


def _why(e: SSL.Error) -> str:
    """OpenSSL's reason text (`certificate verify failed`, ...), as mitmproxy shows it."""
    args = e.args[0] if e.args else None
    if isinstance(args, list) and args and isinstance(args[-1], tuple) and len(args[-1]) >= 3:
        return str(args[-1][2])
    return str(e) or type(e).__name__
