"""The exit line of a run: what was allowed and denied, and what would allow each denied destination.

Attempted credential leaks come first, then requests an inspected host's `http:` rules refused
(launcher.audit.refusals), then denied destinations. A request refused on an allowed connection
is counted as a refused request, not as a denied destination: each record counts once. When the
command failed, the refusals by design it likely met follow (launcher.audit.bydesign).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from netguard import audit
from netguard.audit import PolicyRecord, Record

if TYPE_CHECKING:  # imported at exit, and only when the command failed: a fast start matters
    from launcher.audit import bydesign


def _records(path: Path, task: str) -> list[Record]:
    try:
        return [r for r in audit.read(path) if r["task"] == task]
    except (OSError, audit.LogError):
        return []  # the exit line never fails the run: the command's status is what counts


def summary(path: Path, task: str) -> str:
    """The exit line, then (when something was refused) the leaks, refused requests and denied destinations."""
    return _summary(_records(path, task), path, task)


def exit_report(path: Path, task: str, facts: bydesign.Facts) -> str:
    """summary(), then (when the command failed) one hint per kind of refusal by design it likely met."""
    records = _records(path, task)
    out = _summary(records, path, task)
    if facts.status == 0:
        return out
    from launcher.audit import bydesign

    hints = bydesign.hints(facts, _policy(records), os.path.exists)
    return "\n".join([out, *hints])


def _policy(records: list[Record]) -> PolicyRecord | None:
    """The run's boundary as the launcher wrote it (the sandbox cannot write the log)."""
    for r in records:
        if r["event"] == "policy":
            return r
    return None


def _summary(records: list[Record], path: Path, task: str) -> str:
    decisions = [r for r in records if r["event"] == "decision"]
    allowed = sum(r["action"] == "allow" for r in decisions)
    denied = sum(r["action"] == "deny" for r in decisions)
    would_deny = sum(r["would"] == "deny" for r in decisions)
    would = f" ({would_deny} would have been denied)" if would_deny else ""
    from launcher.audit import limited as limits
    from launcher.audit import refusals

    refused, leaks = refusals.counts(records, task)
    limited = limits.totals(records, task)
    extra = f", {refused} request{'s' if refused != 1 else ''} refused" if refused else ""
    extra += f", {leaks} ATTEMPTED LEAK{'S' if leaks != 1 else ''}" if leaks else ""
    n = sum(c for c, _ in limited.values())
    extra += f", {n} refused by limits" if n else ""
    line = f"sandgate: {allowed} allowed{would}, {denied} denied{extra} -> {path}"
    if not denied and not refused and not leaks and not n:
        return line
    from launcher.audit import denials
    from launcher.config import load

    out = [line, *refusals.lines(records, task), *limits.lines(limited)]
    if denied:
        out += denials.lines(records, task, load.bundled_rulesets())
    return "\n".join(out)
