"""A sandbox's share of the shared daemon, and the records of what its limits refused (issue 22).

One daemon serves every sandbox of a user. Without shares, one sandbox's silent connections took the
daemon's whole descriptor budget (another sandbox's allowed request then failed at once), and one
endless request head grew the daemon by gigabytes. So each sandbox has:
  connections  at most PER_SANDBOX open at once and never more than half of the daemon's budget;
               once half the budget is in use, no more than a fair share of it (the budget over twice
               the number of sandboxes, at least MIN_SHARE)
  deadline     DEADLINE seconds to send what decides a connection (a whole request head or ClientHello)
  head         HEAD_MAX bytes for a request head, checked before mitmproxy reads it (431 for HTTP, a
               close otherwise) and again for every later head mitmproxy parses (netguard.decision.headlimit)
  questions    netguard.asking.QUESTIONS approval questions open at once
  lookups      LOOKUPS name lookups of the connect path in flight: the daemon's one resolver has room
               for resolver.MAX_FLIGHTS; one sandbox asking 2,048 slow names at once filled it, and other
               sandboxes' allowed hosts were refused as "the resolver failed"
  records      DENIALS_LOGGED denial records per run: a churn of denied connections or DNS queries wrote
               ~1 GB an hour to the user's disk; past it denials are counted (a limit record), not written
npm opens 15-50 sockets, pip a few, cargo up to ~100, a browser test a few hundred: none of them
meets these. Every refusal goes to the sandbox's own audit log, the first of each limit at once and
the rest as a count once a second, so a flood costs a line a second, not a line a connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from netguard.audit import Kind, Limit, LimitRecord, limit_record

PER_SANDBOX = 2048  # open connections; 10 sandboxes x 1,000 tunnels (bench/concurrency.py) fit
MIN_SHARE = 64  # what a sandbox may always open while the budget lasts: more than npm's 50
DEADLINE = 30.0  # seconds; nginx waits 60 for a head, Go servers commonly 10-30
HEAD_MAX = 32 * 1024  # bytes; nginx's default ceiling (4 x 8 KiB), Node's is 16 KiB
LOOKUPS = 256  # a sandbox's lookups in flight (two queries each, A and AAAA): 8 sandboxes fill MAX_FLIGHTS
DENIALS_LOGGED = 10_000  # denial records a run's log holds in full (~3 MB); enough to say what was refused
FLUSH = 1.0  # seconds between two records of one limit


class Share:
    """One sandbox's open connections, as its Budget counts them."""

    __slots__ = ("live",)

    def __init__(self) -> None:
        self.live = 0


def share_cap(limit: int, held: int, sandboxes: int) -> int:
    """How many connections one sandbox may hold now. Pure: the fair-share rule, tested on its own.

    `limit` is the daemon's budget, `held` what is in use, `sandboxes` how many are bound."""
    cap = min(PER_SANDBOX, max(MIN_SHARE, limit // 2))  # one sandbox never takes the others' half
    if held >= limit // 2:  # under pressure: each its fair part of the budget
        cap = min(cap, max(MIN_SHARE, limit // (2 * max(1, sandboxes))))
    return cap


class Refusals:
    """One sandbox's limit records: the first refusal of a (limit, kind) at once, then a count per FLUSH."""

    def __init__(self, task: str, write: Callable[[LimitRecord], None]) -> None:
        self.task = task
        self.total: dict[Limit, int] = {}
        self._write = write
        self._pending: dict[tuple[Limit, Kind], tuple[int, str]] = {}
        self._quiet_until: dict[tuple[Limit, Kind], float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def refuse(self, limit: Limit, kind: Kind, reason: str) -> None:
        self.total[limit] = self.total.get(limit, 0) + 1
        key = (limit, kind)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if key not in self._pending and now >= self._quiet_until.get(key, 0.0):
            self._emit(key, 1, reason)
            self._quiet_until[key] = now + FLUSH
            return
        count = self._pending.get(key, (0, reason))[0]
        self._pending[key] = (count + 1, reason)
        if self._timer is None:
            self._timer = loop.call_at(self._quiet_until.get(key, now), self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        for key in list(self._pending):
            if now >= self._quiet_until.get(key, 0.0):
                count, reason = self._pending.pop(key)
                self._emit(key, count, reason)
                self._quiet_until[key] = now + FLUSH
        if self._pending:
            self._timer = asyncio.get_running_loop().call_at(
                min(self._quiet_until[k] for k in self._pending), self._tick
            )

    def flush(self) -> None:
        """Write every pending count now (the sandbox is going away)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key, (count, reason) in self._pending.items():
            self._emit(key, count, reason)
        self._pending.clear()

    def _emit(self, key: tuple[Limit, Kind], count: int, reason: str) -> None:
        try:
            self._write(limit_record(self.task, key[1], key[0], count, reason))
        except OSError:
            pass  # a full disk must not turn a refusal into a daemon error; the refusal itself stands
