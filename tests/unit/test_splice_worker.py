"""Spliced tunnels in the daemon's relay workers (netguard.relay.relaypool): a real daemon, real worker processes.

Which process holds a tunnel's socket is read off the kernel (/proc/net/tcp inode -> /proc/PID/fd),
so these tests judge where the bytes really run. A sandbox's drop cuts its flows in the worker and
leaves another sandbox's flow in the same worker alone; a worker killed mid-flow ends its flow at
both ends with a close record, and the daemon serves new tunnels afterwards.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from netguard.audit import CloseRecord, read_records
from netguard.relay import relay

from ..support.daemonfake import Box, Daemon, eventually, fresh_daemon
from .test_splice_proxy import Upstream


def _holders(sock: socket.socket) -> set[int]:
    """The pids holding the far end of `sock` (a connection to a daemon's listener on 127.0.0.1)."""
    here, there = sock.getsockname()[1], sock.getpeername()[1]
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == there and int(cols[2].split(":")[1], 16) == here:
                inode = cols[9]
    assert inode is not None
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]" for fd in os.listdir(f"/proc/{pid}/fd")):
                out.add(int(pid))
        except OSError:
            continue
    return out


def _held(sock: socket.socket) -> bool:
    return bool(_holders(sock))


def _workers(d: Daemon) -> set[int]:
    with open(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children") as f:
        return {int(p) for p in f.read().split()}


class Streams:
    """An upstream that streams a download on every connection; `ended[i]` is set when the i-th one was cut."""

    def __init__(self) -> None:
        self.ended: list[threading.Event] = []
        self.up = Upstream(self._serve)

    def _serve(self, c: socket.socket) -> None:
        ended = threading.Event()
        self.ended.append(ended)
        c.recv(10)
        try:
            while True:
                c.sendall(bytes(65536))  # a download in progress
        except OSError:
            ended.set()


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with fresh_daemon("sgw") as d:
        yield d


def _tunnel(box: Box, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", box.regular), timeout=5)
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\nx" % port)
    assert s.recv(19).startswith(b"HTTP/1.1 200")
    assert s.recv(65536)
    return s


def _in_worker(d: Daemon, box: Box, port: int) -> socket.socket:
    """A download tunnel whose daemon end a worker holds: it starts in the daemon and moves once it has
    carried relay.MOVE_AFTER bytes (the first ones of a fresh daemon may stay while its workers boot)."""
    for _ in range(50):
        s = _tunnel(box, port)
        got = 0
        while got <= relay.MOVE_AFTER + (1 << 20):
            chunk = s.recv(1 << 20)
            assert chunk, "the download ended early"
            got += len(chunk)
        if eventually(functools.partial(_held, s), 2) and _holders(s) <= _workers(d):
            return s
        s.close()
        time.sleep(0.1)
    raise AssertionError("no tunnel was ever spliced in a relay worker")


def _drain(s: socket.socket) -> None:
    s.settimeout(5)
    try:
        while s.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass


def _closes(box: Box) -> list[CloseRecord]:
    return [r for r in read_records(box.audit) if r["event"] == "close"]


def test_a_drop_cuts_its_flows_in_the_worker_and_leaves_another_sandboxs_alone(daemon: Daemon) -> None:
    ua, ub = Streams(), Streams()
    try:
        a = Box(daemon, "a", {"allow": [{"cidr": "127.0.0.0/8", "ports": [ua.up.port]}]})
        b = Box(daemon, "b", {"allow": [{"cidr": "127.0.0.0/8", "ports": [ub.up.port]}]})
        sa, sb = _in_worker(daemon, a, ua.up.port), _in_worker(daemon, b, ub.up.port)  # not the daemon itself
        ended_a, ended_b = ua.ended[-1], ub.ended[-1]
        a.client.end()
        assert ended_a.wait(10)  # the upstream was cut in the worker, not left streaming into a dead tunnel
        _drain(sa)
        assert eventually(lambda: any(r["bytes_down"] > 1 << 20 for r in _closes(a)))
        assert sb.recv(65536) and not ended_b.wait(0.5) and sb.recv(65536)  # b's download goes on
        assert all(r["bytes_down"] < 1 << 20 for r in _closes(b))  # only tunnels closed while looking
    finally:
        ua.up.close()
        ub.up.close()


def test_a_worker_killed_mid_flow_ends_it_at_both_ends_with_a_close_record(daemon: Daemon) -> None:
    u = Streams()
    try:
        a = Box(daemon, "a", {"allow": [{"cidr": "127.0.0.0/8", "ports": [u.up.port]}]})
        s = _in_worker(daemon, a, u.up.port)
        (victim,) = _holders(s)
        time.sleep(0.3)  # the records of tunnels closed while looking are written
        before = len(_closes(a))
        os.kill(victim, signal.SIGKILL)
        assert u.ended[-1].wait(10)  # the upstream's socket closed with the worker
        _drain(s)
        assert eventually(lambda: len(_closes(a)) == before + 1)  # recorded as ended, though its counts died with it
        assert eventually(lambda: "relay worker" in daemon.log() and "died" in daemon.log())
        assert eventually(lambda: victim not in _workers(daemon))
        again = _tunnel(a, u.up.port)  # the daemon goes on: in-process, or in a worker started since
        again.close()
    finally:
        u.up.close()


def test_the_daemons_exit_cuts_the_flows_in_its_workers_and_they_are_gone(daemon: Daemon) -> None:
    u = Streams()
    try:
        a = Box(daemon, "a", {"allow": [{"cidr": "127.0.0.0/8", "ports": [u.up.port]}]})
        s = _in_worker(daemon, a, u.up.port)
        workers = _workers(daemon)
        time.sleep(0.3)
        before = len(_closes(a))
        daemon.proc.send_signal(signal.SIGTERM)
        assert u.ended[-1].wait(10)
        _drain(s)
        assert daemon.proc.wait(10) == 0
        assert len(_closes(a)) == before + 1 and _closes(a)[-1]["bytes_down"] > 65536  # recorded before it went
        assert eventually(lambda: not any(os.path.exists(f"/proc/{p}/fd/0") for p in workers))
    finally:
        u.up.close()
