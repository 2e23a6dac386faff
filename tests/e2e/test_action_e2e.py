"""The GitHub Action's shell steps (action.yml), run as GitHub runs them, inside a disposable World.

The install step needs PyPI (tests/e2e/test_real_registry_install_smoke.py runs it); here the
checkout's own `.venv/bin/sandgate` stands in for what it installs. The run step's script, with the
environment GitHub gives it (inputs as SG_* variables, RUNNER_TEMP, GITHUB_OUTPUT), must confine
the command (the allowed fake host answers, the blocked one sees nothing), report the exit status
and the audit log as outputs; the summary step must write the denial to the job summary.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..support import actionfile
from ..support.runner import REPO, VIEW
from ..support.world import World

ALLOWED, BLOCKED = "198.51.100.10", "198.51.100.20"
COMMAND = """\
curl -sS -m 10 http://allowed.test/ >allowed.txt
curl -sS -m 10 http://blocked.test/ >blocked.txt || true
"""


def _github_env(world: World, ws: Path, **inputs: str) -> dict[str, str]:
    """What a composite step's shell gets: runner variables and the step's env (inputs default to "")."""
    base = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "RUNNER_TEMP": str(world.tmp / "runner-temp"),
        "GITHUB_OUTPUT": str(ws.parent / "github-output"),
        "GITHUB_STEP_SUMMARY": str(ws.parent / "step-summary.md"),
        "GITHUB_JOB": "test",
        "SG_SANDGATE": str(REPO / ".venv/bin/sandgate"),
    }
    names = ("SG_RUN", "SG_ALLOW", "SG_DENY", "SG_POLICY", "SG_WRITE", "SG_ARGS", "SG_ARTIFACT", "SG_JOB_INDEX")
    step = dict.fromkeys(names, "") | {"SG_LEARN": "false", "SG_ARGS": "\n".join(VIEW)}
    return base | step | inputs


def _step(world: World, ws: Path, step_id: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = actionfile.script(step_id)
    return world.run(["bash", "-e", "-c", script], cwd=ws, env=env, capture_output=True, text=True, timeout=90)


def test_the_run_step_confines_the_command_and_the_summary_names_the_denial(world: World) -> None:
    world.add_host("allowed.test", ALLOWED)
    world.add_host("blocked.test", BLOCKED)
    allowed = world.serve("http", ALLOWED, 80, "allowed.test")
    blocked = world.serve("http", BLOCKED, 80, "blocked.test")
    (world.tmp / "runner-temp").mkdir()
    ws = world.tmp / "job" / "ws"
    ws.mkdir(parents=True)
    env = _github_env(world, ws, SG_RUN=COMMAND, SG_ALLOW="allowed.test")

    r = _step(world, ws, "run", env)
    assert r.returncode == 0, r.stderr
    out = actionfile.outputs(Path(env["GITHUB_OUTPUT"]))
    log = Path(out["audit-log"])
    assert (out["exit-code"], log.name, out["artifact"]) == ("0", "test-1.jsonl", "sandgate-audit-test-1")
    assert log.parent == world.tmp / "runner-temp" / "sandgate-audit" and log.stat().st_size > 0
    assert "hello from allowed.test" in (ws / "allowed.txt").read_text()  # the permitted twin
    assert "sandgate: blocked blocked.test:80" in (ws / "blocked.txt").read_text()
    assert allowed.log_records() and not blocked.log_records()  # the blocked host saw nothing

    summary_env = env | {"SG_LOG": str(log), "SG_RC": out["exit-code"]}
    r = world.run(["bash", "-c", actionfile.script(name="Audit summary")], cwd=ws, env=summary_env, text=True)
    assert r.returncode == 0
    page = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert "| **denied** | blocked&#46;test&#58;80 |" in page, page
    assert "| allowed | allowed&#46;test&#58;80 |" in page, page
    assert "The command exited with status 0." in page


def test_the_run_step_reports_the_exit_status_and_a_second_use_gets_its_own_log(world: World) -> None:
    (world.tmp / "runner-temp").mkdir()
    ws = world.tmp / "job" / "ws"
    ws.mkdir(parents=True)
    env = _github_env(world, ws, SG_RUN="echo made >here; exit 3")
    for n in (1, 2):
        r = _step(world, ws, "run", env)
        assert r.returncode == 0, r.stderr  # the step itself succeeds: summary and upload come next
        out = actionfile.outputs(Path(env["GITHUB_OUTPUT"]))
        assert (out["exit-code"], out["artifact"]) == ("3", f"sandgate-audit-test-{n}")
    assert (ws / "here").read_text() == "made\n"  # the workspace is written for real

    last = world.run(["bash", "-c", actionfile.script(name="The command's exit status")], env=env | {"SG_RC": "3"})
    assert last.returncode == 3

    r = _step(world, ws, "run", env | {"SG_LEARN": "yes"})
    assert r.returncode == 2 and "the learn input is 'yes'; use true or false" in r.stderr
