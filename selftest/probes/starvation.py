"""Starving the other sandboxes of the shared daemon: silent connections past this sandbox's share (issue 22).

One daemon serves every sandbox of a user. Before per-sandbox shares, one sandbox's 19,000 silent
TCP connections (never a byte, so nothing can be decided) took the daemon's whole descriptor budget,
and another sandbox's allowed request failed at once. The probe opens more silent connections than a
sandbox's share (netguard.decision.limits.PER_SANDBOX, told by verify) and counts how many the daemon
keeps: those past the share must be closed at once. While it holds them it asks verify for the
permitted twin: another sandbox's allowed request, which must be answered normally (judged outside by
the canary, selftest/sidecar.py).

`open_silent` and `Hold` are also bench/fairshare.py's hog. Stdlib only.
"""

from __future__ import annotations

import errno
import resource
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

from selftest import askfiles
from selftest.probes.core import Ctx, Result, Unsupported, probe

CONTEXTS = ("child",)  # the share is per sandbox, not per process: one hog in the sandbox says it all
SPARE_FDS = 64  # the runner's own files beside the hog's sockets
SETTLE = 5.0  # seconds for the daemon to close what is past the share (it pauses 0.1 s per refused burst)
VICTIM_WAIT = 14.0  # seconds for verify to run the victim sandbox (a `sandgate run` of its own)
_GONE = select.POLLIN | select.POLLERR | select.POLLHUP  # closed by the daemon (FIN or RST), or refused


@dataclass
class Hold:
    """Silent TCP connections held open: the hog."""

    socks: list[socket.socket]

    def census(self) -> tuple[int, int, int]:
        """(held, closed, pending): established and still open / closed by the other end / not connected yet."""
        poller = select.poll()
        for s in self.socks:
            poller.register(s.fileno(), select.POLLIN | select.POLLOUT)
        events = dict(poller.poll(0))
        closed = sum(1 for ev in events.values() if ev & _GONE)
        held = sum(1 for ev in events.values() if ev & select.POLLOUT and not ev & _GONE)
        return held, closed, len(self.socks) - held - closed

    def settle(self, closed_at_least: int, timeout: float) -> tuple[int, int, int]:
        """The census once `closed_at_least` are closed and none is pending, or at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            held, closed, pending = self.census()
            if (closed >= closed_at_least and not pending) or time.monotonic() >= deadline:
                return held, closed, pending
            time.sleep(0.1)

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []


def raise_nofile(want: int) -> None:
    """Soft RLIMIT_NOFILE up to `want`; Unsupported when the hard limit is lower (the share cannot be passed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        raise Unsupported(f"the open-file hard limit here is {hard}: cannot hold the {want} a hog needs")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def open_silent(target: tuple[str, int], n: int) -> Hold:
    """`n` non-blocking connects to `target` that never send a byte."""
    raise_nofile(n + SPARE_FDS)
    hold = Hold([])
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            hold.socks.append(s)
            s.setblocking(False)
            err = s.connect_ex(target)
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, f"connect to {target[0]}:{target[1]} failed at once")
    except BaseException:
        hold.close()
        raise
    return hold


def victim_text(answer: dict[str, Any] | None) -> str:
    """What verify said of the victim sandbox's request."""
    if answer is None:
        return "verify did not answer (no victim ran)"
    if answer.get("error"):
        return f"failed: {answer['error']}"
    return f"HTTP {answer.get('status')} in {answer.get('ms', 0):.0f} ms"


@probe("network", "starvation", "blocked", contexts=CONTEXTS)
def starvation(c: Ctx) -> Result:
    """Silent connections past this sandbox's share of the shared daemon (v2: 19,000 took every fd), while another sandbox's allowed request must still be answered."""
    n, share = c.spec.hog_connections, c.spec.connection_share
    if share <= 0 or n <= share:
        raise Unsupported(f"verify named no share to exceed (share {share}, connections {n})")
    hold = open_silent((c.spec.blocked_ip, c.spec.tcp_port), n)  # any port: every one goes to the daemon
    try:
        held, closed, pending = hold.settle(n - share, SETTLE)
        victim = askfiles.ask(c.spec.results_dir, "victim", c.mark, {"probe": c.probe}, VICTIM_WAIT)
        still = hold.census()[0]
    finally:
        hold.close()
    observed = "permitted" if max(held, still) > share else "blocked"
    return observed, (
        f"held {held} of {n} silent connections (share {share}; {still} still held after the victim), "
        f"{closed} closed by the daemon, {pending} never connected; "
        f"meanwhile another sandbox's allowed request: {victim_text(victim)}"
    )
