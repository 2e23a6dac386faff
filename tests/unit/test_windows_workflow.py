"""The Windows CI workflow judges what the commands print, not any non-zero exit (issue 28, M12).

A direct connection that fails because the run never started, or whose output is lost (W6),
also exits non-zero; only the WFP refusal itself (WSAEACCES, 10013, printed by the command)
shows the boundary worked. This workplace cannot run the workflow; this test checks its text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "windows.yml"


def _steps() -> list[dict[str, Any]]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    steps: list[dict[str, Any]] = doc["jobs"]["windows"]["steps"]
    return steps


def _step(word: str) -> str:
    (found,) = [s["run"] for s in _steps() if word in s.get("name", "")]
    return str(found)


def test_the_direct_connection_check_looks_for_the_wfp_refusal_and_prints_the_output() -> None:
    script = _step("direct connection")
    assert "Write-Output $out" in script  # the command's own output is in the log
    assert "SANDGATE-REFUSED 10013" in script and "-notmatch 'SANDGATE-REFUSED 10013'" in script
    assert "$LASTEXITCODE -eq 0" not in script  # the old check: any failure passed


def test_the_allowed_and_verify_checks_judge_the_output_too() -> None:
    allowed = _step("allowed host")
    assert "Write-Output $out" in allowed and "SANDGATE-ALLOWED 200" in allowed
    verify = _step("sandgate verify")
    assert "Write-Output $out" in verify and "' 0 failed'" in verify


def test_every_windows_unit_module_runs_there() -> None:
    step = next(s for s in _steps() if "unit tests" in s.get("name", ""))
    assert step.get("shell") == "bash" and "tests/unit/test_windows_*.py" in step["run"]  # a glob: none forgotten
    assert list((REPO / "tests" / "unit").glob("test_windows_*.py"))
