"""WinDivert filter strings for the optional transparent capture (the same language eBPFDivert
compiles on Linux, so tests validate every string with pydivert.check_filter).

Two handles: a SOCKET-layer sniff handle learns who connects (processId per connect), and a
NETWORK-layer handle takes every outbound off-host TCP packet (the sandbox's SYNs and data, the
proxy's replies to reflected flows) for the redirect loop to reflect, pass or drop. Loopback is
never taken: the explicit-proxy path (loopback to the proxy's ports) must not depend on the loop.
"""

from __future__ import annotations

from dataclasses import dataclass


class DivertFilterError(ValueError):
    """A port that would make the filter match something other than what its name says."""


@dataclass(frozen=True)
class DivertFilters:
    socket: str  # Layer.SOCKET, Flag.SNIFF | Flag.RECV_ONLY: observe, never block
    network: str  # Layer.NETWORK: diverted; what is not re-sent is dropped


def _port(p: int) -> int:
    if not 0 < p < 65536:
        raise DivertFilterError(f"port {p} is out of range")
    return p


def connect_events() -> str:
    """Every outbound TCP connect off the host, with the connecting process's id."""
    return "event == CONNECT and tcp and !loopback"


def outbound_tcp(transparent_port: int) -> str:
    """Every outbound off-host TCP packet; the proxy's replies (source = its transparent port)
    are among them because a reflected flow's peer is the original off-host address."""
    _port(transparent_port)
    return "outbound and !loopback and tcp"


def plan_filters(transparent_port: int) -> DivertFilters:
    return DivertFilters(connect_events(), outbound_tcp(transparent_port))
