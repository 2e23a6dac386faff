"""SANDGATE_TIMINGS=1: a run's phases as monotonic timestamps on stderr, for bench/startup.py.

Each mark is one line `sandgate-timing PHASE NANOSECONDS` (CLOCK_MONOTONIC, the clock every
process of the machine shares, so the launcher, the holder, init and the bench line up). The
sandbox's processes are forks of the launcher and inherit the switch read here at import; they
write before exec, so CMD's own output comes after. Off (the default) it costs one environment
lookup per process and one bool test per mark; nothing else is imported.
"""

from __future__ import annotations

import os
import time

ON = os.environ.get("SANDGATE_TIMINGS") == "1"
PREFIX = "sandgate-timing"


def mark(phase: str) -> None:
    """Record that PHASE just ended (a no-op unless SANDGATE_TIMINGS=1)."""
    if ON:
        try:
            os.write(2, f"{PREFIX} {phase} {time.monotonic_ns()}\n".encode())
        except OSError:
            pass  # a closed stderr: the timing is lost, the run is not


def parse(text: str) -> list[tuple[str, int]]:
    """(phase, ns) pairs from a run's stderr, in the order written; other lines are ignored."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == PREFIX and parts[2].isdigit():
            out.append((parts[1], int(parts[2])))
    return out
