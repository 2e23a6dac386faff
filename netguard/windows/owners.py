"""Who owns a SYN: the connect events the SOCKET layer reported, matched to packets (pure).

Threat answered: redirecting (or worse, passing) a flow on a guess. The NETWORK layer carries no
process id, so a SYN is matched to the connect event with its remote address and port (and local
port where the platform reports it: WinDivert at ALE_AUTH_CONNECT does, eBPFDivert's cgroup hook
runs before the port is bound and reports 0). A SYN is reflected only if every event it could be
is the job's, passed only if none is, and dropped otherwise: unknown owner, or an ambiguous mix.
A dropped SYN costs a retransmit, never an escape.

Whose a connect is (`judge`, the table below) is decided from its process, looked up once when its
event is read (`held`): in the run's job, by the job's own pid list, asked after the process handle
is taken (so both answers are one process's) -> reflect (the command's: the proxy decides, audited);
outside the job -> pass only if its token user is another user's. A process of the sandbox SID outside the job
(an interactive-token task, anything the teardown sweep is for) is dropped: the run's permits match
the SID, so passing it would be direct, unaudited off-host TCP, and reflecting it would put a
stranger's flow under the command's policy. An owner that cannot be opened or whose SID cannot be
read is dropped too (fail closed). A lookup keeps its process handle while a connect event of that
pid waits for its SYN: "the identifier may be reused" only once "all handles to the process are
closed" (PROCESS_INFORMATION docs), so a cached answer can never be a reused pid's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["reflect", "pass", "drop"]
#: "unseen": no connect event matches the SYN (yet); the loop looks once more, then drops.
Decision = Literal["reflect", "pass", "drop", "unseen"]
#: "unknown": the process could not be opened or asked (gone, or its DACL refuses the loop).
Membership = Literal["job", "outside", "unknown"]
#: How long a connect event waits for its SYN (a SYN follows its connect within milliseconds).
EVENT_TTL = 10.0


@dataclass(frozen=True)
class Owner:
    """What the loop learned about a connect's process, read through one handle."""

    membership: Membership
    sid: str | None  # its token user; None: unreadable


@dataclass(frozen=True)
class Held:
    """A lookup and the process handle it keeps open (0: none, nothing pinned, never cached)."""

    owner: Owner
    handle: int = 0


@dataclass(frozen=True)
class Opened:
    """One process as the loop opened it: its handle (0: gone or refused) and token user (None: unreadable)."""

    handle: int = 0
    sid: str | None = None


def held(pid: int, opened: Opened, listed: frozenset[int] | None) -> Held:
    """The lookup of `pid` from its opened process and the job's pid list (None: the list could not
    be read). The list decides membership, so the job's processes are the job's even when their
    DACL refuses the loop; a pid it does not list is "outside", judged by the SID read."""
    membership: Membership = "unknown" if listed is None else ("job" if pid in listed else "outside")
    return Held(Owner(membership, opened.sid), opened.handle)


def judge(owner: Owner, sandbox_sid: str) -> Verdict:
    """The verdict for one connect by its owner (pure, the whole table)."""
    if owner.membership == "job":
        return "reflect"  # the command's, whatever its token says: the proxy decides
    if owner.membership == "unknown" or owner.sid is None:
        return "drop"  # cannot tell whose: never passed on a guess
    if owner.sid.upper() == sandbox_sid.upper():
        return "drop"  # escaped the job: its decision would be unaudited (H3)
    return "pass"  # another user's: the loop sees the machine's traffic


@dataclass(frozen=True)
class ConnectEvent:
    pid: int
    remote_addr: str
    remote_port: int
    local_port: int  # 0: not known at connect time
    at: float  # monotonic seconds


class Owners:
    """Connect events with their owners, matched to SYNs. `look(pid)`: the WinApi lookup;
    `release(handle)`: closes a handle it kept."""

    def __init__(
        self, look: Callable[[int], Held], sandbox_sid: str, release: Callable[[int], None] = lambda _: None
    ) -> None:
        self._look, self._sid, self._release = look, sandbox_sid, release
        self._events: list[tuple[ConnectEvent, Held]] = []
        self._held: dict[int, Held] = {}  # pid -> its lookup, while an event of that pid is pending

    def add(self, event: ConnectEvent) -> None:
        """Look the owner up now, while it has just connected (or reuse a lookup whose handle
        still pins that pid)."""
        held = self._held.get(event.pid) or self._look(event.pid)
        if held.handle:
            self._held[event.pid] = held
        self._events.append((event, held))

    def _drop(self, item: tuple[ConnectEvent, Held]) -> None:
        self._events.remove(item)
        event, held = item
        if not held.handle or any(e.pid == event.pid for e, _ in self._events):
            return  # no handle, or another pending event of that pid still needs it pinned
        del self._held[event.pid]
        self._release(held.handle)

    def _candidates(self, dst_addr: str, dst_port: int, src_port: int, now: float) -> list[tuple[ConnectEvent, Held]]:
        for old in [i for i in self._events if now - i[0].at >= EVENT_TTL]:
            self._drop(old)
        same = [i for i in self._events if i[0].remote_addr == dst_addr and i[0].remote_port == dst_port]
        exact = [i for i in same if i[0].local_port == src_port]
        return exact or [i for i in same if i[0].local_port == 0]

    def decide(self, dst_addr: str, dst_port: int, src_port: int, now: float) -> Decision:
        """The decision for one SYN; a reflected or passed SYN consumes the event it was matched to
        (a dropped one keeps it: its retransmit is dropped again, until the event expires)."""
        found = self._candidates(dst_addr, dst_port, src_port, now)
        if not found:
            return "unseen"  # unknown owner
        verdicts = {judge(held.owner, self._sid) for _, held in found}
        if len(verdicts) != 1:
            return "drop"  # the job's and someone else's connect to one destination: cannot tell
        (verdict,) = verdicts
        if verdict != "drop":
            self._drop(found[0])
        return verdict

    def close(self) -> None:
        """Forget every event and close every handle kept (the loop has ended)."""
        for item in list(self._events):
            self._drop(item)

    def held(self) -> int:
        """How many process handles are kept (tests: none outlives its events)."""
        return len(self._held)

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
