"""The exit line of a run: what was allowed and denied, and what would allow each denied destination."""

from __future__ import annotations

from pathlib import Path

from netguard import audit


def summary(path: Path, task: str) -> str:
    """The exit line, then (when something was refused) the denied destinations and what would allow each."""
    try:
        records = [r for r in audit.read(path) if r["task"] == task]
    except (OSError, audit.LogError):
        records = []  # the exit line never fails the run: the command's status is what counts
    decisions = [r for r in records if r["event"] == "decision"]
    allowed = sum(r["action"] == "allow" for r in decisions)
    denied = sum(r["action"] == "deny" for r in decisions)
    would_deny = sum(r["would"] == "deny" for r in decisions)
    would = f" ({would_deny} would have been denied)" if would_deny else ""
    line = f"sandgate: {allowed} allowed{would}, {denied} denied -> {path}"
    if not denied:
        return line
    from launcher.audit import denials
    from launcher.config import load

    return "\n".join([line, *denials.lines(records, task, load.bundled_rulesets())])
