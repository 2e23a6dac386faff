"""One allowed and two blocked plain-HTTP fake hosts in a fresh World, and a runner whose policy allows only
the first: what the refusal tests judge against (tests/e2e/test_refusals_e2e.py, test_notices_e2e.py).
A denied request is judged by what its server saw (`seen`: nothing), beside the allowed one it did see."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .runner import Sandgate, write_policy
from .world import Server, World, new_world

POLICY = "version: 1\nnetwork:\n  allow:\n    - allowed.test\n"
NAMES = ("allowed", "blocked", "blocked2")


@dataclass
class ThreeHosts:
    world: World
    sg: Sandgate
    servers: dict[str, Server]

    def audit(self) -> Path:
        """A fresh audit log path for one run."""
        return self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"

    def seen(self, name: str) -> int:
        """How many requests the fake server `name` received."""
        return len(self.servers[name].log_records())


@contextmanager
def three_hosts(addresses: tuple[str, str, str]) -> Iterator[ThreeHosts]:
    """`allowed.test`, `blocked.test`, `blocked2.test` at `addresses` (distinct per module: no two share a server)."""
    with new_world() as w:
        servers = {}
        for name, addr in zip(NAMES, addresses, strict=True):
            w.add_host(f"{name}.test", addr)
            servers[name] = w.serve("http", addr, 80, f"{name}.test")
        yield ThreeHosts(w, Sandgate(w, policy=write_policy(w, POLICY), cwd=w.tmp), servers)
