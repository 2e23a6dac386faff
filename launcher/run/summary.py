"""The exit line of a run: what was allowed and denied, and what would allow each denied destination."""

from __future__ import annotations

from pathlib import Path

from launcher.config import bundled as allowlists
from launcher.config import load as lpolicy
from launcher.config.errors import PolicyFileError
from netguard import policy as netpolicy
from netguard import rules
from netguard.audit import read_records


def summary(path: Path, task: str) -> str:
    """The exit line, then (when something was refused) the denied destinations and what would allow each."""
    counts = {"allow": 0, "deny": 0, "would": 0}
    records: list[dict[str, object]] = []
    try:
        records = [r for r in read_records(path) if r.get("task") == task]
    except (OSError, ValueError):
        pass
    for r in records:
        if r.get("event") == "decision":
            action = str(r.get("action"))
            counts[action] = counts.get(action, 0) + 1
            counts["would"] += r.get("would") == "deny"
    would = f" ({counts['would']} would have been denied)" if counts["would"] else ""
    line = f"sandgate: {counts['allow']} allowed{would}, {counts['deny']} denied -> {path}"
    if not counts["deny"]:
        return line
    from launcher import denials

    return "\n".join([line, *denials.lines(records, task, _bundled_rulesets())])


def _bundled_rulesets() -> dict[str, rules.Ruleset]:
    """Each bundled allowlist compiled, to say which one would allow a denied host (parse cache: fast)."""
    out: dict[str, rules.Ruleset] = {}
    for name in allowlists.bundled_names():
        path = allowlists.bundled_path(name)
        if path is None:
            continue
        try:
            sections = lpolicy.load_policy_file(path)
        except PolicyFileError:
            continue
        out[name] = rules.compile_policy(netpolicy.merge([s.network for s in sections]))
    return out
