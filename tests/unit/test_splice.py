"""The kernel relay alone (netguard.relay.splice.Pair) between real TCP sockets on 127.0.0.1.

Each test builds two connected pairs (client <-> proxy side a, proxy side b <-> server), hands the
proxy's ends to a Pair on an event loop in a thread, and judges by what the far ends saw: bytes
and their order, half-closes, resets, the idle timeout, the cut, backpressure and leaked fds.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from netguard.relay import splice


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        near = socket.create_connection(srv.getsockname(), timeout=5)
        far, _ = srv.accept()
    far.settimeout(5)
    return near, far


class Rig:
    """client <-> [a Pair b] <-> server; the Pair runs on its own loop thread."""

    def __init__(self, idle: float = 0) -> None:
        self.client, a = _tcp_pair()
        b, self.server = _tcp_pair()
        self.done = threading.Event()
        self.why: list[str | None] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        fds = (a.detach(), b.detach())

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            def ended(why: str | None) -> None:
                self.why.append(why)
                self.done.set()

            self.ended = ended

            async def start() -> None:
                for fd in fds:
                    os.set_blocking(fd, False)
                self.pair = splice.Pair(fds[0], fds[1], ended, idle)
                self.pair.start()
                ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def cut(self) -> None:
        self.loop.call_soon_threadsafe(self.pair.cut, "cut by test")

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        self.client.close()
        self.server.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def _read_all(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(1 << 20):
        out += chunk
    return bytes(out)


def test_bytes_pass_both_ways_in_order_and_are_counted(rig: Rig) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # several pipes' worth, not a multiple of the pipe
    t = threading.Thread(target=rig.client.sendall, args=(data,))
    t.start()
    got = bytearray()
    while len(got) < len(data):
        got += rig.server.recv(1 << 20)
    t.join()
    assert bytes(got) == data
    rig.server.sendall(b"reply")
    assert rig.client.recv(100) == b"reply"
    rig.client.shutdown(socket.SHUT_WR)
    rig.server.shutdown(socket.SHUT_WR)
    assert rig.done.wait(5) and rig.why == [None]
    assert (rig.pair.up, rig.pair.down) == (len(data), 5)


def test_released_when_quiet_and_taken_up_again_mid_stream_nothing_is_lost_or_doubled(rig: Rig) -> None:
    """How netguard.relay.relay moves a flow to a worker: `release` at a quiet moment gives the open
    sockets back, another relay takes them up. Done every 64 KiB while both directions stream."""
    counted: list[tuple[int, int]] = []

    def hop() -> None:
        a, b = rig.pair.release()
        counted.append((rig.pair.up, rig.pair.down))
        rig.pair = splice.Pair(a, b, rig.ended, 0)
        rig.pair.on_bytes(64 * 1024, hop)
        rig.pair.start()

    rig.loop.call_soon_threadsafe(rig.pair.on_bytes, 64 * 1024, hop)
    up, down = os.urandom(2 * 1024 * 1024 + 5), os.urandom(1024 * 1024 + 3)
    senders = [
        threading.Thread(target=rig.client.sendall, args=(up,)),
        threading.Thread(target=rig.server.sendall, args=(down,)),
    ]
    for t in senders:
        t.start()
    got_up, got_down = bytearray(), bytearray()
    reader = threading.Thread(target=lambda: got_down.extend(_read_n(rig.client, len(down))))
    reader.start()
    got_up += _read_n(rig.server, len(up))
    reader.join(10)
    for t in senders:
        t.join(10)
    assert bytes(got_up) == up and bytes(got_down) == down
    assert len(counted) >= 10  # it really hopped, mid-stream
    rig.client.shutdown(socket.SHUT_WR)
    rig.server.shutdown(socket.SHUT_WR)
    assert rig.done.wait(5) and rig.why == [None]  # one end, from the last relay only
    assert (sum(u for u, _ in counted) + rig.pair.up, sum(d for _, d in counted) + rig.pair.down) == (
        len(up),
        len(down),
    )


def _read_n(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n and (chunk := s.recv(1 << 20)):
        out += chunk
    return bytes(out)


def test_a_half_close_travels_and_the_other_direction_goes_on(rig: Rig) -> None:
    rig.client.sendall(b"request")
    rig.client.shutdown(socket.SHUT_WR)  # like `curl -T`: the request is over, the answer is not
    assert _read_all(rig.server) == b"request"  # EOF arrived after the bytes
    assert not rig.done.is_set()
    rig.server.sendall(b"answer after the client's EOF")
    rig.server.shutdown(socket.SHUT_WR)
    assert _read_all(rig.client) == b"answer after the client's EOF"
    assert rig.done.wait(5) and rig.why == [None]


def test_a_reset_ends_the_pair_and_the_other_side_sees_the_end(rig: Rig) -> None:
    rig.client.sendall(b"x")
    assert rig.server.recv(10) == b"x"
    rig.server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    rig.server.close()  # RST
    try:
        assert _read_all(rig.client) == b""
    except ConnectionResetError:
        pass
    rig.client.sendall(b"more")  # into a side whose peer is gone: the pair must end, not spin
    assert rig.done.wait(5)


def test_the_idle_timeout_closes_both_sides() -> None:
    r = Rig(idle=0.3)
    try:
        r.client.sendall(b"x")
        assert r.server.recv(1) == b"x"
        t0 = time.monotonic()
        assert r.done.wait(5) and r.why == ["idle timeout"]
        assert time.monotonic() - t0 >= 0.25
        assert r.client.recv(10) == b"" and r.server.recv(10) == b""
    finally:
        r.close()


def test_cut_closes_both_sides_at_once(rig: Rig) -> None:
    rig.client.sendall(b"x")
    assert rig.server.recv(1) == b"x"
    rig.cut()
    assert rig.done.wait(5) and rig.why == ["cut by test"]
    assert rig.client.recv(10) == b"" and rig.server.recv(10) == b""


def test_a_receiver_that_does_not_read_stops_the_reading() -> None:
    """Backpressure: the relay never holds more than one pipe per direction; the sender blocks."""
    r = Rig()
    try:
        r.client.setblocking(False)
        sent, chunk = 0, bytes(1 << 20)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sent += r.client.send(chunk)
            except BlockingIOError:
                time.sleep(0.05)
        # socket buffers on both sides (autotuned, a few MiB each) plus one pipe: far less than 3 s of loopback
        assert sent < 64 * 1024 * 1024, sent
        way = r.pair._ways[0]
        assert way.pipe is not None and way.held <= way.pipe.size
        got = 0
        r.client.setblocking(True)
        r.client.shutdown(socket.SHUT_WR)
        while chunk := r.server.recv(1 << 20):
            got += len(chunk)
        assert got == sent
    finally:
        r.close()


def test_no_fd_outlives_a_pair() -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        r = Rig()
        r.client.sendall(b"x" * 100000)
        r.client.shutdown(socket.SHUT_WR)
        assert len(_read_all(r.server)) == 100000
        r.server.shutdown(socket.SHUT_WR)
        assert r.done.wait(5)
        r.close()
    # the pool keeps a few empty pipes for reuse (two fds each), never one per pair
    assert len(os.listdir("/proc/self/fd")) - before <= 2 * 2


def test_pipes_in_existence_are_capped_and_a_cut_pipe_is_never_lent_again() -> None:
    pool = splice.Pipes()
    lent = [pool.take() for _ in range(splice.PIPES_MAX)]
    with pytest.raises(OSError):
        pool.take()  # the direction waits and retries; accept() keeps its fds
    os.write(lent[0].w, b"bytes of a cut connection")
    pool.give(lent[0], empty=False)  # closed, not pooled
    again = pool.take()
    assert again is not lent[0] and pool.made == splice.PIPES_MAX
    for p in [again, *lent[1:]]:
        pool.give(p, empty=True)
    assert pool.made <= splice.PIPES_MAX
    while pool._free:
        pool._free.pop().close()


def test_the_connection_budget_refuses_past_the_fd_limit() -> None:
    from netguard.daemon.fdlimit import PER_CONNECTION, RESERVE, Budget

    b = Budget(RESERVE + 20 * PER_CONNECTION + 1)
    assert [b.take() for _ in range(21)] == [True] * 20 + [False] and b.refused == 1
    b.give()
    assert b.take()
