"""Which rows `sandgate verify --only ...` runs: groups and probe names, parsed in one place.

Why probe names and not only groups: a change to one mechanism is checked in seconds by its own
probes (`--only git_hooks,rename_protected`), and the suite's mutation tests run just the rows a
weakening must flip and the ones it must leave alone, instead of whole groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from selftest.hostrows import HOST_ROWS
from selftest.probes.core import GROUPS, REGISTRY


@dataclass(frozen=True)
class Selection:
    """Groups and probe names; empty means every row."""

    names: frozenset[str] = frozenset()

    def wants(self, group: str, probe: str) -> bool:
        return not self.names or group in self.names or probe in self.names

    def runner_only(self) -> tuple[str, ...]:
        """What the probe runner is told (its own names); () runs everything."""
        if not self.names:
            return ()
        inner = self.names - HOST_ROWS.keys()
        # Only host rows asked for: the runner still runs (the daemon row needs its setsid daemon),
        # restricted to their groups; the rows it returns are filtered by `wants`.
        return tuple(sorted(inner or {HOST_ROWS[n] for n in self.names}))


def parse_only(text: str | None) -> Selection:
    """`network`, `git_hooks,rename_protected`, ...: comma-separated groups or probe names."""
    if text is None:
        return Selection()
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError("--only needs a group or probe name (network, filesystem, process, or a probe)")
    if unknown := names - set(GROUPS) - REGISTRY.keys() - HOST_ROWS.keys():
        raise ValueError(
            f"--only: unknown probe or group {', '.join(sorted(unknown))}; the groups are "
            f"{', '.join(GROUPS)}, the probes are the table of docs/verify.md"
        )
    return Selection(names)
