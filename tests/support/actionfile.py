"""The repository's GitHub Action (action.yml) as the tests read it: its steps and their scripts.

The e2e tests run the action's own `run:` scripts with the environment GitHub would give them, so
what is tested is the text users get, not a copy of it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
ACTION = REPO / "action.yml"
CI_DOC = REPO / "docs" / "ci.md"


def load() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(ACTION.read_text())
    return data


def steps() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = load()["runs"]["steps"]
    return found


def script(step_id: str | None = None, *, name: str | None = None) -> str:
    """The `run:` text of the step with this id (or name)."""
    for s in steps():
        if (step_id is not None and s.get("id") == step_id) or (name is not None and s.get("name") == name):
            text: str = s["run"]
            return text
    raise KeyError(step_id or name)


def example_workflow() -> str:
    """The example workflow of docs/ci.md (its first yaml block)."""
    m = re.search(r"```yaml\n(.*?)```", CI_DOC.read_text(), re.S)
    assert m, "docs/ci.md has no ```yaml example"
    return m.group(1)


def outputs(github_output: Path) -> dict[str, str]:
    """`name=value` lines a step appended to $GITHUB_OUTPUT (the last one of a name wins)."""
    found: dict[str, str] = {}
    for line in github_output.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key] = value
    return found
