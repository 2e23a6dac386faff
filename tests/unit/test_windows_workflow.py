"""The Windows CI workflow judges what the commands print, not any non-zero exit (issue 28, M12).

A direct connection that fails because the run never started, or whose output is lost (W6),
also exits non-zero; only the WFP refusal itself (WSAEACCES, 10013, printed by the command)
shows the boundary worked. This workplace cannot run the workflow; this test checks its text.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "windows.yml"


def _steps() -> list[dict[str, Any]]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
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


def _pwsh_steps() -> list[dict[str, Any]]:
    """The steps run by GitHub's pwsh wrapper (the default shell on windows-latest)."""
    return [s for s in _steps() if "run" in s and s.get("shell", "pwsh") == "pwsh"]


def test_a_step_expecting_a_failing_command_resets_the_exit_code() -> None:
    """GitHub's pwsh wrapper appends `if ((Test-Path -LiteralPath variable:\\LASTEXITCODE)) { exit
    $LASTEXITCODE }` (docs.github.com, "Exit codes and error action preference"): a step whose last
    native command exits non-zero on purpose fails unless it ends with its own `exit 0` (win-divert D3)."""
    expecting = [s for s in _pwsh_steps() if re.search(r"\$LASTEXITCODE -ne [1-9]", s["run"])]
    assert expecting, "the direct connection step checks the command's own non-zero status"
    for step in expecting:
        last = [line.strip() for line in str(step["run"]).splitlines() if line.strip()][-1]
        assert last == "exit 0", step["name"]


WITHOUT_POSIX_SITE = """
import sys
for name in ("pwd", "grp", "fcntl", "termios", "resource"):
    sys.modules[name] = None  # not in CPython on Windows
"""


def _collect_as_on_windows(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(WITHOUT_POSIX_SITE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, *argv, "--setup-plan", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_unit_step_collects_every_windows_module_without_posix_modules(tmp_path: Path) -> None:
    """tests/conftest.py imports fcntl (tests/support/suitelock.py): on the Windows runner pytest would
    stop before the first test. The step runs with --noconftest, and every test_windows_* module must
    import without the POSIX-only modules and need no fixture of that conftest (win-divert D4);
    --setup-plan resolves every test's fixtures without running anything. The step's own command."""
    step = next(s for s in _steps() if "unit tests" in s.get("name", ""))
    words = shlex.split(str(step["run"]))
    assert words[:3] == ["python", "-m", "pytest"] and "--noconftest" in words
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "unit").glob("test_windows_*.py"))
    argv = [w for w in words[1:] if w != "tests/unit/test_windows_*.py"] + modules
    done = _collect_as_on_windows(tmp_path, argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # Control: the simulation bites (the conftest that imports fcntl is refused without the flag).
    plain = _collect_as_on_windows(tmp_path, [w for w in argv if w != "--noconftest"])
    assert plain.returncode != 0 and "fcntl" in plain.stdout + plain.stderr
