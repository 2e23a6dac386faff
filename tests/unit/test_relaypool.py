"""Relay workers (netguard.relay.relaypool + relayworker) without mitmproxy: real worker processes, real TCP.

Each flow is two connected TCP pairs (client <-> a, b <-> server); a and b are placed on the pool
as the handoff places them. Judged by the far ends (bytes, order, EOF), the reported counts and
why, the fds this process still holds, and the worker processes themselves (killed, never started).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from netguard.relay import relaypool

from ..support.daemonfake import eventually

T = TypeVar("T")


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        near = socket.create_connection(srv.getsockname(), timeout=5)
        far, _ = srv.accept()
    far.settimeout(5)
    return near, far


def _read_all(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(1 << 20):
        out += chunk
    return bytes(out)


class Loop:
    """An event loop on a thread with its own relaypool.pool()."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool: relaypool.Pool = self.call(relaypool.pool)

    def call(self, fn: Callable[[], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result(10)

    def ready(self, n: int = 1) -> bool:
        return eventually(lambda: sum(1 for w in self.pool.workers if w.capacity > 0) >= n, 10)

    def close(self) -> None:
        self.call(self.pool.stop)
        procs = [w.proc for w in self.pool.workers]
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        for p in procs:
            p.wait(5)  # a worker whose daemon closed its end exits by itself


class Flow:
    """client <-> [worker] <-> server; `ended` holds (why, up, down) once the worker reported."""

    def __init__(self, lp: Loop, idle: float = 0) -> None:
        self.client, a = _tcp_pair()
        b, self.server = _tcp_pair()
        self.ended: list[tuple[str | None, int, int]] = []
        fds = (a.detach(), b.detach())
        for fd in fds:
            os.set_blocking(fd, False)

        def done(why: str | None) -> None:
            assert self.moved is not None
            self.ended.append((why, self.moved.up, self.moved.down))

        self.moved: relaypool.Moved | None = lp.call(lambda: lp.pool.place(fds[0], fds[1], idle, done))
        assert self.moved is not None, "no worker took the flow"

    def close(self) -> None:
        self.client.close()
        self.server.close()


@pytest.fixture
def lp() -> Iterator[Loop]:
    loop = Loop()
    try:
        loop.call(loop.pool.start)
        assert loop.ready(relaypool.INITIAL)
        yield loop
    finally:
        loop.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_flow_in_a_worker_moves_every_byte_passes_half_closes_and_reports_exact_counts(lp: Loop) -> None:
    before = _fds()
    f = Flow(lp)
    assert eventually(lambda: _fds() == before + 2)  # the far ends only: this process holds neither relayed socket
    body = bytes(range(256)) * 8000
    f.client.sendall(body)
    f.client.shutdown(socket.SHUT_WR)
    assert _read_all(f.server) == body  # the half-close travelled
    f.server.sendall(b"answer after the client's half-close")
    f.server.shutdown(socket.SHUT_WR)
    assert _read_all(f.client) == b"answer after the client's half-close"
    assert eventually(lambda: f.ended == [(None, len(body), 36)])
    assert lp.pool.away == 0
    f.close()


def test_flows_spread_over_the_workers_and_a_cut_ends_both_sides_with_its_reason(lp: Loop) -> None:
    flows = [Flow(lp) for _ in range(6)]
    assert sorted(len(w.flows) for w in lp.pool.workers) == ([3, 3] if relaypool.INITIAL == 2 else [6])
    assert lp.pool.away == 6
    flows[0].client.sendall(b"12345")
    assert flows[0].server.recv(5) == b"12345"
    for f in flows:
        assert f.moved is not None
        lp.call(functools.partial(f.moved.cut, "closed by the proxy"))
    for f in flows:
        assert f.client.recv(10) == b"" and f.server.recv(10) == b""
    assert eventually(lambda: all(f.ended for f in flows))
    assert flows[0].ended == [("closed by the proxy", 5, 0)] and lp.pool.away == 0
    for f in flows:
        f.close()


def test_a_killed_worker_ends_its_flows_at_both_ends_and_another_takes_its_place(lp: Loop) -> None:
    f = Flow(lp)
    f.client.sendall(b"before")
    assert f.server.recv(6) == b"before"
    assert f.moved is not None
    victim = f.moved.worker.proc
    victim.send_signal(signal.SIGKILL)
    for end in (f.client, f.server):
        try:
            assert end.recv(10) == b""
        except ConnectionResetError:
            pass  # the end, either way: nothing more passes
    assert eventually(lambda: f.ended == [("relay worker died", 0, 0)])
    assert lp.pool.away == 0 and victim not in [w.proc for w in lp.pool.workers]
    assert eventually(lambda: victim.poll() is not None)  # reaped: no zombie in a long-lived daemon
    time.sleep(relaypool.RESPAWN)
    g = Flow(lp)  # the pool starts again after its pause
    g.client.sendall(b"after")
    assert g.server.recv(5) == b"after"
    f.close()
    g.close()


@pytest.mark.parametrize("exe", ["/nonexistent/python", "/bin/false"])
def test_a_worker_that_cannot_start_leaves_the_flow_to_the_caller(monkeypatch: pytest.MonkeyPatch, exe: str) -> None:
    monkeypatch.setattr(sys, "executable", exe)
    loop = Loop()
    try:
        a, b = socket.socketpair()
        assert loop.call(lambda: loop.pool.place(a.fileno(), b.fileno(), 0, lambda why: None)) is None
        time.sleep(0.5)  # /bin/false runs and exits without its hello: it is never used
        assert loop.call(lambda: loop.pool.place(a.fileno(), b.fileno(), 0, lambda why: None)) is None
        a.send(b"x")
        assert b.recv(1) == b"x"  # the caller's fds are untouched
        a.close()
        b.close()
    finally:
        loop.close()


_PARENT = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from netguard.relay import relaypool
async def main():
    p = relaypool.pool()
    p.start()
    while not any(w.capacity for w in p.workers):
        await asyncio.sleep(0.05)
    print(" ".join(str(w.proc.pid) for w in p.workers), flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def test_workers_die_with_their_daemon() -> None:
    from pathlib import Path

    root = str(Path(relaypool.__file__).resolve().parents[2])
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, root], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert pids and all(os.path.exists(f"/proc/{p}") for p in pids)
    parent.send_signal(signal.SIGKILL)  # no cleanup at all: PR_SET_PDEATHSIG and the EOF must do it
    parent.wait()

    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] in ("Z", "X")  # a zombie of init holds no fd
        except FileNotFoundError:
            return True

    assert eventually(lambda: all(gone(p) for p in pids))


def test_the_idle_timeout_runs_in_the_worker(lp: Loop) -> None:
    f = Flow(lp, idle=0.5)
    f.client.sendall(b"one")
    assert f.server.recv(3) == b"one"
    assert f.client.recv(10) == b"" and f.server.recv(10) == b""  # nothing for half a second: both ends closed
    assert eventually(lambda: f.ended == [("idle timeout", 3, 0)])
    f.close()


def test_full_workers_leave_the_flow_to_the_caller_and_another_worker_is_started(lp: Loop) -> None:
    first = Flow(lp)
    for w in lp.pool.workers:
        w.capacity = len(w.flows)  # as if each held all the flows its fd limit allows
    a, b = socket.socketpair()
    n = len(lp.pool.workers)
    assert lp.call(lambda: lp.pool.place(a.fileno(), b.fileno(), 0, lambda why: None)) is None
    assert len(lp.pool.workers) == n + 1  # started for the next flows
    assert eventually(lambda: lp.pool.workers[-1].hello, 10)
    second = Flow(lp)
    assert second.moved is not None and second.moved.worker is lp.pool.workers[-1]
    for s in (a, b):
        s.close()
    first.close()
    second.close()


def test_a_worker_imports_nothing_planted_beside_the_netguard_package(tmp_path: Path) -> None:
    """The directory holding netguard may be a checkout a sandbox writes: a planted stdlib name must not load."""
    real = Path(relaypool.__file__).resolve().parents[1]  # the real netguard package
    (tmp_path / "netguard").symlink_to(real)
    marker = tmp_path / "planted-ran"
    for name in ("asyncio", "socket", "json", "selectors"):  # what a worker imports at boot
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    check = "from netguard.relay import relayworker; import netguard; print(netguard.__file__)"
    r = subprocess.run(
        [sys.executable, "-I", "-S", "-c", relaypool.boot(str(tmp_path)) + check],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "netguard" / "__init__.py")  # netguard came from there
    assert not marker.exists()  # and nothing else did


def test_the_first_flow_starts_no_worker_at_once_and_the_workers_come_lazy_seconds_later() -> None:
    """A cold daemon's first flow must not boot worker processes beside the run that made it (issue 25:
    their start slowed a cold run's command and teardown on 2 cores); the flow stays with the caller."""
    loop = Loop()
    try:
        a, b = socket.socketpair()
        t0 = time.monotonic()
        assert loop.call(lambda: loop.pool.place(a.fileno(), b.fileno(), 0, lambda why: None)) is None
        assert loop.pool.workers == []  # nothing spawned with the first flow
        a.send(b"x")
        assert b.recv(1) == b"x"  # the caller's fds are untouched: it splices them itself
        assert loop.ready(relaypool.INITIAL)  # ...and the workers come by themselves
        assert time.monotonic() - t0 >= relaypool.LAZY
        f = Flow(loop)  # the next flow is taken by one
        f.client.sendall(b"later")
        assert f.server.recv(5) == b"later"
        f.close()
        a.close()
        b.close()
    finally:
        loop.close()


def test_a_stopped_pool_starts_no_worker_later() -> None:
    loop = Loop()
    try:
        a, b = socket.socketpair()
        assert loop.call(lambda: loop.pool.place(a.fileno(), b.fileno(), 0, lambda why: None)) is None
        loop.call(loop.pool.stop)
        time.sleep(relaypool.LAZY + 0.2)
        assert loop.pool.workers == []  # a proxy that stopped leaves no worker behind
        a.close()
        b.close()
    finally:
        loop.close()
