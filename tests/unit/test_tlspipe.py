"""TlsPipe (netguard.daemon.tlspipe): TLS over memory BIOs on a non-blocking socket, as the front door's
inspected path uses it towards an upstream, against Python's own TLS server on a socketpair."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from OpenSSL import SSL

from netguard.daemon.tlspipe import TlsError, TlsPipe
from selftest.certs import CA

Server = Callable[[ssl.SSLSocket], None]


@pytest.fixture
def ca(tmp_path: Path) -> Iterator[tuple[CA, Path]]:
    yield CA(), tmp_path


def _serve(ca: CA, tmp: Path, then: Server) -> tuple[socket.socket, threading.Thread]:
    """Our end of a socketpair whose other end is a TLS server for `up.test` doing `then` after its handshake."""
    ours, theirs = socket.socketpair()
    chain, key = ca.issue("up.test").write(tmp / "up.pem", tmp / "up.key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain, key)

    def run() -> None:
        try:
            with ctx.wrap_socket(theirs, server_side=True) as s:
                then(s)
        except ssl.SSLError:
            pass  # the client refused its certificate: what the test expects, said by the client

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ours.setblocking(False)
    return ours, t


def _client(ca: CA, tmp: Path, sock: socket.socket) -> TlsPipe:
    ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    ctx.set_verify(SSL.VERIFY_PEER)
    ctx.load_verify_locations(str(ca.write_cert(tmp / "ca.pem")))
    conn = SSL.Connection(ctx)
    conn.set_tlsext_host_name(b"up.test")
    conn.set_connect_state()
    return TlsPipe(sock, conn)


class _Endless:
    """A socket whose peer never stops: every non-blocking read returns a full buffer."""

    reads = 0

    def recv(self, n: int, flags: int = 0) -> bytes:
        self.reads += 1
        return b"\x17\x03\x03" + bytes(n - 3)


def test_an_upstream_that_keeps_sending_is_not_idle_and_the_check_is_bounded() -> None:
    """An allowed upstream streaming records after its answer must not hold the daemon's loop in idle_open."""
    endless = _Endless()

    async def main() -> bool:
        conn = SSL.Connection(SSL.Context(SSL.TLS_CLIENT_METHOD))
        conn.set_connect_state()
        return TlsPipe(endless, conn).idle_open()  # type: ignore[arg-type]  # the socket's one call used

    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(asyncio.run(main())), daemon=True)
    t.start()
    t.join(5)
    assert result == [False] and endless.reads <= 8


def test_two_writers_at_once_never_cut_a_record(ca: tuple[CA, Path]) -> None:
    """A body's copy and a read's own records may send at once: the peer must still decrypt every byte."""
    got: list[bytes] = []

    def slow_reader(s: ssl.SSLSocket) -> None:
        s.settimeout(10)
        buf = b""
        while len(buf) < 2 * (1 << 20):
            data = s.recv(65536)
            if not data:
                break
            buf += data
        got.append(buf)

    sock, t = _serve(*ca, slow_reader)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # sendall must wait: the writers overlap

    async def main() -> None:
        pipe = _client(*ca, sock)
        await pipe.handshake()
        await asyncio.gather(pipe.send(b"a" * (1 << 20)), pipe.send(b"b" * (1 << 20)))

    try:
        asyncio.run(main())
        t.join(10)
    finally:
        sock.close()
    assert got and sorted(got[0]) == sorted(b"a" * (1 << 20) + b"b" * (1 << 20))


def test_a_certificate_that_does_not_verify_fails_the_handshake(ca: tuple[CA, Path], tmp_path: Path) -> None:
    sock, t = _serve(CA("impostor"), tmp_path, lambda s: None)

    async def main() -> None:
        await _client(*ca, sock).handshake()

    try:
        with pytest.raises(TlsError, match="certificate verify failed"):
            asyncio.run(main())
    finally:
        sock.close()
        t.join(5)
