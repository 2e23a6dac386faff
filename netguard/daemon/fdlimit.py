"""The daemon's connection budget under its open-file limit (raised at start: netguard.relay.nofile):
every proxied connection holds two sockets (none once a relay worker splices it:
netguard.relay.relaypool), so past the budget a new connection is refused before accept() meets EMFILE."""

from __future__ import annotations

from collections.abc import Callable

from netguard.decision.limits import Share, share_cap

PER_CONNECTION = 2  # client + upstream socket; spliced in-process, the two dups that replaced them (handoff)
RESERVE = 512  # listeners, control sockets, audit logs, DNS, epoll, and the splice's pipes (splice.PIPES_MAX)


class Budget:
    """How many proxied connections fit under the fd limit. Past it a new connection is refused at
    once: accept() itself must never meet EMFILE, where asyncio retries every pending accept in a
    loop (measured: a daemon at 100 % CPU, millions of log lines, every sandbox stalled).

    `away()` is how many of the `live` connections hold no fd here (spliced in a relay worker,
    whose own limit relaypool keeps): only the others count against this process's limit."""

    def __init__(self, soft: int, away: Callable[[], int] = lambda: 0) -> None:
        self.limit = max(16, (soft - RESERVE) // PER_CONNECTION)
        self.live = 0
        self.refused = 0
        self.sandboxes = 0  # bound right now: the fair share divides the budget among them
        self._away = away

    @classmethod
    def of(cls, limit: int) -> Budget:
        """A budget of `limit` connections, whatever the fd limit (Windows' select() set: standalone.budget)."""
        return cls(RESERVE + limit * PER_CONNECTION)

    @property
    def held(self) -> int:
        """Connections whose sockets this process holds."""
        return self.live - self._away()

    def take(self) -> bool:
        if self.held >= self.limit:
            self.refused += 1
            return False
        self.live += 1
        return True

    def give(self) -> None:
        self.live -= 1

    def admit(self, share: Share) -> str | None:
        """Take one connection for a sandbox: None, or why not (its share is used up, or the whole budget)."""
        cap = share_cap(self.limit, self.held, self.sandboxes)
        if share.live >= cap:
            shared = f"; the daemon is shared by {self.sandboxes} sandboxes" if self.sandboxes > 1 else ""
            return f"per-sandbox connection limit ({cap} open{shared})"
        if not self.take():
            return f"the daemon's connection budget is full ({self.limit} connections)"
        share.live += 1
        return None

    def release(self, share: Share) -> None:
        share.live -= 1
        self.give()
