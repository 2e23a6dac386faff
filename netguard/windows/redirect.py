"""The redirect loop: connect events in, packets reflected into the proxy, passed, or dropped.

It runs against any divert handle with pydivert's recv/send (WinDivert on Windows; eBPFDivert in
the Linux harness test, which exercises this code path and is no evidence of Windows behaviour).
Not a boundary on its own: WinDivert fails open when its handle closes, so on Windows the sandbox
user's off-host TCP is permitted only by dynamic WFP filters that die with this process
(wfp.transparent_permits); everything else the persistent filters still block.

Per packet: a SYN is decided once per flow (owners.Owners: the job's -> reflect, another user's ->
pass; the sandbox user's outside the job, unknown or ambiguous -> drop); a reflected flow's later segments and the proxy's replies are
rewritten (reflect.py); every other packet passes unchanged. A mid-flow packet of an undecided
flow passes: it cannot be the sandbox's, whose connects are possible only while this loop runs,
and whose reflected flows are remembered until FLOW_TTL after they close (bounded memory).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from netguard.windows import owners, reflect

Outcome = Literal["reflect", "pass", "drop", "return"]
Flow = tuple[str, int, str, int]
INBOUND = 1  # pydivert.Direction.INBOUND (WINDIVERT_ADDRESS.Outbound = 0)
#: How long a closed reflected flow (and a passed flow's verdict) is remembered. Longer than TCP's
#: TIME_WAIT (120 s on Windows): a late segment of a forgotten reflected flow would count as
#: undecided and go out to the original destination, which is exactly what must not happen.
FLOW_TTL = 300.0


class DivertHandle(Protocol):
    def recv(self, bufsize: int = ..., timeout: float | None = ...) -> Any: ...
    def send(self, packet: Any, recalculate_checksum: bool = ...) -> int: ...


@dataclass
class Counters:
    reflect: int = 0
    passed: int = 0
    drop: int = 0
    returned: int = 0


def fields(pkt: Any) -> reflect.Fields:
    return reflect.Fields(
        owners.canonical(pkt.src_addr),
        int(pkt.src_port),
        owners.canonical(pkt.dst_addr),
        int(pkt.dst_port),
        pkt.direction == INBOUND,
    )


def _apply(pkt: Any, f: reflect.Fields) -> None:
    pkt.src_addr, pkt.dst_addr = f.src_addr, f.dst_addr
    pkt.src_port, pkt.dst_port = f.src_port, f.dst_port
    pkt.direction = INBOUND


class Redirector:
    def __init__(
        self,
        network: DivertHandle,
        socket_events: DivertHandle,
        proxy_port: int,
        who: owners.Owners,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.network, self.socket_events, self.proxy_port = network, socket_events, proxy_port
        self.owners = who
        self.nat = reflect.NatTable()
        self.decided: dict[Flow, Outcome] = {}
        self._since: dict[Flow, float] = {}  # pass: decided at; reflect: closed (FIN/RST) at
        self.counters = Counters()
        self._clock = clock
        self._purged = clock()
        self._lock = threading.Lock()

    def original(self, peer_addr: str, peer_port: int) -> reflect.Original | None:
        """For the proxy: where the connection it accepted from (peer_addr, peer_port) was going."""
        with self._lock:
            return self.nat.for_peer(owners.canonical(peer_addr), peer_port)

    def take_events(self, timeout: float) -> int:
        """Read connect events until none arrives within `timeout`; how many were read."""
        n = 0
        while True:
            try:
                ev = self.socket_events.recv(timeout=timeout)
            except TimeoutError:
                return n
            s = ev.socket
            remote = owners.address_from_words(s.RemoteAddr)
            self.owners.add(
                owners.ConnectEvent(int(s.ProcessId), remote, int(s.RemotePort), int(s.LocalPort), self._clock())
            )
            n, timeout = n + 1, 0.0

    def _syn(self, f: reflect.Fields) -> Outcome:
        decision = self.owners.decide(f.dst_addr, f.dst_port, f.src_port, self._clock())
        if decision == "unseen":
            self.take_events(0.05)  # the event may be a moment behind its SYN: one more look
            decision = self.owners.decide(f.dst_addr, f.dst_port, f.src_port, self._clock())
        verdict: Outcome = "drop" if decision == "unseen" else decision  # still no owner
        if verdict == "reflect" and not self.nat.add(f):
            verdict = "drop"  # collides with a live reflected flow: never mis-route
        return verdict

    def handle(self, pkt: Any) -> Outcome:
        """Decide one outbound packet and send what is not dropped; the outcome, for counting."""
        f = fields(pkt)
        flow = (f.src_addr, f.src_port, f.dst_addr, f.dst_port)
        with self._lock:
            if f.src_port == self.proxy_port and (o := self.nat.for_peer(f.dst_addr, f.dst_port)):
                _apply(pkt, reflect.from_proxy(f, o.dst_port))
                outcome: Outcome = "return"
            elif pkt.tcp is not None and pkt.tcp.syn and not pkt.tcp.ack:
                outcome = self.decided.get(flow) or self._syn(f)  # a retransmit keeps its verdict
                if outcome != "drop":
                    self.decided[flow] = outcome
            else:
                outcome = self.decided.get(flow, "pass")
            self._remember(flow, outcome, pkt)
            if outcome == "reflect":
                _apply(pkt, reflect.to_proxy(f, self.proxy_port))
        if outcome != "drop":
            self.network.send(pkt)
        self._count(outcome)
        return outcome

    def _remember(self, flow: Flow, outcome: Outcome, pkt: Any) -> None:
        """Start a flow's forgetting clock (a passed flow at once, a reflected one once it closes)
        and forget what has expired, at most once a second: memory bounded by the connection rate."""
        now = self._clock()
        closing = pkt.tcp is not None and (pkt.tcp.fin or pkt.tcp.rst)
        if (outcome == "pass" and flow in self.decided) or (outcome == "reflect" and closing):
            self._since.setdefault(flow, now)
        if now - self._purged < 1.0:
            return
        self._purged = now
        for old in [k for k, t in self._since.items() if now - t > FLOW_TTL]:
            del self._since[old]
            if self.decided.pop(old, None) == "reflect":
                self.nat.forget(old[2], old[1])

    def _count(self, outcome: Outcome) -> None:
        c = self.counters
        if outcome == "reflect":
            c.reflect += 1
        elif outcome == "pass":
            c.passed += 1
        elif outcome == "drop":
            c.drop += 1
        else:
            c.returned += 1

    def serve(self, stop: threading.Event, poll: float = 0.05) -> None:
        """Until `stop`: connect events first, then one packet, so an event is seen before its SYN.
        However it ends, the owners' process handles are closed."""
        try:
            while not stop.is_set():
                self.take_events(0.0)
                try:
                    pkt = self.network.recv(timeout=poll)
                except TimeoutError:
                    continue
                self.handle(pkt)
        finally:
            self.owners.close()
