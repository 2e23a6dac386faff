"""The workflow's unit step RUN as on Windows, not only collected (issue 28, round two, r2-ci C1, C5, C10, C11).

The Windows runner executes `python -m pytest ... --noconftest tests/unit/test_windows_*.py` with CPython
for Windows: no pwd, grp, fcntl, termios, resource, tty or pty, and sys.platform "win32" for every test.
test_windows_workflow.py resolves the step's fixtures (`--setup-plan`) but calls no test, so an import inside
a test body (selftest.probes -> fcntl, C1) failed only there; and a test that relied on Linux's answer
without saying so took the Windows branch there: test_windows_setup's "setup on Linux" ran a real, elevated
`sandgate setup` on the runner (C10), test_windows_win32divert's "off Windows" expected an error Windows does
not give (C11). Here the step's own command runs every module in an interpreter where those modules are
refused and each test is called with sys.platform "win32" (tests/support/winreach.py), which records every
call that would reach the real machine there. Tests may fail here for what only Linux lacks (WinDivert's DLL,
a real Win32 binding): what is checked is that no POSIX-only import is reached, and nothing but the listed
tests touches the machine. Linux evidence of these two properties only.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "windows.yml"
POSIX_ONLY = ("pwd", "grp", "fcntl", "termios", "resource", "tty", "pty")
#: Not run again here (the suite's time): this module (it would run itself); the workflow's own test, which
#: starts pytest over the whole glob again (--setup-plan); test_windows_imports.py, whose every test is a child
#: interpreter with the same modules refused already; and the proxy's 600-connection floods (seconds each, a
#: child proxy under tests/support/winpython.py, which refuses them too).
NOT_AGAIN = {Path(__file__).name, "test_windows_workflow.py", "test_windows_imports.py"}
DESELECT = (
    "tests/unit/test_windows_py_proxy.py::test_more_connections_than_select_can_wait_on_are_refused_not_a_dead_proxy",
)
#: Tests that reach the real machine on Windows on purpose, and what they do there (harmless, per user).
REAL_ON_WINDOWS = {
    "tests/unit/test_windows_plan.py::test_win32_imports_here_and_calls_nothing": ["win32.fn CreateJobObjectW"],
    "tests/unit/test_windows_plan.py::test_dpapi_is_only_reached_on_windows": ["win32.fn CryptProtectData"],
}

SITE = f"""
import sys
for name in {POSIX_ONLY!r}:
    sys.modules[name] = None  # CPython on Windows has none of these
"""


def _step() -> list[str]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    steps: list[dict[str, Any]] = doc["jobs"]["windows"]["steps"]
    (run,) = [str(s["run"]) for s in steps if "unit tests" in s.get("name", "")]
    words = shlex.split(run)
    assert words[:3] == ["python", "-m", "pytest"] and words[-1] == "tests/unit/test_windows_*.py", words
    return words


def _as_on_windows(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(SITE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SANDGATE_WINREACH_LOG": str(tmp_path / "reached.jsonl")}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(
    sys.platform == "win32", reason="a simulation of the Windows runner: there the step itself is the real run"
)
def test_the_unit_step_as_on_windows_imports_no_posix_module_and_touches_no_machine(tmp_path: Path) -> None:
    words = _step()
    modules = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests" / "unit").glob("test_windows_*.py") if p.name not in NOT_AGAIN
    )
    skip = [w for d in DESELECT for w in ("--deselect", d)]
    plugin = ["-p", "tests.support.winreach", "-p", "no:cacheprovider"]
    done = _as_on_windows(tmp_path, [sys.executable, *words[1:-1], *plugin, *skip, *modules])
    text = done.stdout + done.stderr
    ran = sum(
        int(n) for n in re.findall(r"(\d+) (?:passed|failed)", done.stdout.splitlines()[-1] if done.stdout else "")
    )
    assert ran > 300, text[-3000:]  # the step ran, not an early collection error
    halted = sorted({m for m in POSIX_ONLY if f"import of {m} halted" in text})
    assert halted == [], text[-4000:]  # C1: a POSIX-only module reached in a test or the code it calls
    log = tmp_path / "reached.jsonl"
    reached = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
    seen = {r["test"]: r["reached"] for r in reached}
    assert {t: r for t, r in seen.items() if t not in REAL_ON_WINDOWS} == {}  # C10: nothing else touches the runner
    # Control: the recorder sees the tests that are real there on purpose, so an empty list above means something.
    assert all(seen.get(t) == r for t, r in REAL_ON_WINDOWS.items()), seen
    # Control: the refusal is in force in that interpreter (an import of fcntl fails there).
    control = _as_on_windows(tmp_path, [sys.executable, "-c", "import fcntl"])
    assert control.returncode != 0 and "fcntl" in control.stderr


def _bare_repository_reads(path: Path) -> list[str]:
    """`X.read_text()` of a repository file (X names REPO, ROOT, WORKFLOW or DOC) without an encoding."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "read_text" or any(k.arg == "encoding" for k in node.keywords) or node.args:
            continue
        receiver = ast.unparse(node.func.value)
        if any(name in receiver for name in ("REPO", "ROOT", "WORKFLOW", "DOC")):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_repository_files_are_read_as_utf8_not_in_the_runners_code_page(tmp_path: Path) -> None:
    """C5: read_text() decodes with locale.getencoding(), cp1252 on windows-latest (no UTF-8 mode in 3.12);
    a UTF-8 byte cp1252 leaves undefined (0x81, 0x8d, 0x8f, 0x90, 0x9d) would fail there only."""
    found = [f for p in sorted((REPO / "tests" / "unit").glob("test_windows_*.py")) for f in _bare_repository_reads(p)]
    assert found == []
    # Control: the check sees the spelling it is for, and not the one it asks for.
    sample = tmp_path / "test_windows_sample.py"
    sample.write_text('a = (ROOT / "docs").read_text()\nb = (ROOT / "docs").read_text(encoding="utf-8")\n')
    assert _bare_repository_reads(sample) == ["test_windows_sample.py:1: (ROOT / 'docs').read_text()"]
