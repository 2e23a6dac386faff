"""Who owns a SYN: the connect events the SOCKET layer reported, matched to packets (pure).

Threat answered: redirecting (or worse, passing) a flow on a guess. The NETWORK layer carries no
process id, so a SYN is matched to the connect event with its remote address and port (and local
port where the platform reports it: WinDivert at ALE_AUTH_CONNECT does, eBPFDivert's cgroup hook
runs before the port is bound and reports 0). A SYN is reflected only if every event it could be
is the job's, passed only if none is, and dropped otherwise: unknown owner, or an ambiguous mix.
A dropped SYN costs a retransmit, never an escape.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["reflect", "pass", "drop"]
#: How long a connect event waits for its SYN (a SYN follows its connect within milliseconds).
EVENT_TTL = 10.0


@dataclass(frozen=True)
class ConnectEvent:
    pid: int
    remote_addr: str
    remote_port: int
    local_port: int  # 0: not known at connect time
    at: float  # monotonic seconds


class Owners:
    def __init__(self, in_job: Callable[[int], bool]) -> None:
        self._in_job = in_job
        self._events: list[ConnectEvent] = []

    def add(self, event: ConnectEvent) -> None:
        self._events.append(event)

    def _candidates(self, dst_addr: str, dst_port: int, src_port: int, now: float) -> list[ConnectEvent]:
        self._events = [e for e in self._events if now - e.at < EVENT_TTL]
        same = [e for e in self._events if e.remote_addr == dst_addr and e.remote_port == dst_port]
        exact = [e for e in same if e.local_port == src_port]
        return exact or [e for e in same if e.local_port == 0]

    def decide(self, dst_addr: str, dst_port: int, src_port: int, now: float) -> Verdict:
        """The verdict for one SYN; a decided SYN consumes the event it was matched to."""
        found = self._candidates(dst_addr, dst_port, src_port, now)
        if not found:
            return "drop"  # unknown owner
        members = {self._in_job(e.pid) for e in found}
        if len(members) != 1:
            return "drop"  # the job's and someone else's connect to one destination: cannot tell
        self._events.remove(found[0])
        return "reflect" if members == {True} else "pass"

    def __len__(self) -> int:
        return len(self._events)


def address_from_words(words: Sequence[int]) -> str:
    """A WINDIVERT_DATA_SOCKET address (UINT32[4], host order, least significant word first; IPv4
    as ::ffff:a.b.c.d) as text, in the form `canonical()` gives packet addresses."""
    raw = b"".join(int(w).to_bytes(4, "big") for w in reversed(list(words)))
    addr = ipaddress.IPv6Address(raw)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def canonical(addr: str) -> str:
    """One spelling per address (`::FFFF:1.2.3.4`, `0:0::1` and friends compare equal)."""
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)
