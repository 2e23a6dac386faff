"""r3-day D1: the standalone proxy's listeners must not set SO_REUSEADDR on Windows.

There it lets a socket "forcibly bind to a port in use by another socket" (learn.microsoft.com/
windows/win32/winsock/using-so-reuseaddr-and-so-exclusiveaddruse): a second run's proxy would bind
127.0.0.1:3128 over the first run's proxy or its held port (realapi.hold_port, a plain bind) instead
of being refused, and the first run's command would reach the second run's allowlist. Linux cannot
reproduce Windows' bind semantics, so the option itself is checked on the real socket.
"""

from __future__ import annotations

import socket
import sys

import pytest

from netguard.daemon import standalone


def _reuse(sock: socket.socket) -> int:
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
    finally:
        sock.close()


def test_front_door_socket_has_no_reuseaddr_on_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    assert _reuse(standalone._tcp_socket("regular@127.0.0.1:0", ("127.0.0.1", 0))) == 0


def test_dns_tcp_socket_has_no_reuseaddr_on_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    udp, tcp = standalone._dns_sockets(("127.0.0.1", 0))
    udp.close()
    assert _reuse(tcp) == 0


def test_posix_keeps_reuseaddr_for_time_wait() -> None:
    """The matching permitted case: on Linux the option stays (a restarted proxy over TIME_WAIT)."""
    assert sys.platform != "win32"
    assert _reuse(standalone._tcp_socket("regular@127.0.0.1:0", ("127.0.0.1", 0))) != 0
