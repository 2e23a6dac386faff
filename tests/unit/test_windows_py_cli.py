"""Every Windows command through launcher.cli, on the fake machine, in an interpreter made to look like
CPython on Windows (tests/support/winpython.py): not only imports (test_windows_imports.py) but every call
on the way. Before issue 28's win-py fixes each `run` died on os.geteuid (userconfig, checks), `--policy`
on os.O_PATH (hostilefile), a workspace's .sandgate.yaml on os.O_NOFOLLOW (trust), and `cleanup` on fcntl.
Fake evidence only: Windows itself has not run this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.run.windows import runner
from tests.support import winpython

REPO = Path(__file__).resolve().parent.parent.parent

FLOW = """
import json, os, sys
from tests.support import winprobefakes
from tests.support.winfake import FakeWinApi
from launcher import cli
from launcher.run.windows import runner

fake = FakeWinApi()
fake.program = winprobefakes.program
fake.m.files[fake.python()] = b"MZ"
runner.make_api = lambda: fake
out = {}
for name, argv in json.loads(sys.argv[1]):
    if name == "chdir":
        os.chdir(argv)
        continue
    try:
        out[name] = cli.main(argv)
    except SystemExit as e:
        out[name] = f"exit {e.code}"
print("RESULT " + json.dumps(out), flush=True)
"""


def _flow(tmp: Path, steps: list[tuple[str, object]]) -> tuple[dict[str, object], str]:
    code = f"{winpython.PRELUDE}\n{FLOW}"
    home = str(tmp / "home")  # USERPROFILE: what expanduser reads on Windows, where the workflow runs this too
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    env.update(HOME=home, USERPROFILE=home, XDG_STATE_HOME=str(tmp / "state"))
    r = subprocess.run(
        [sys.executable, "-c", code, str(REPO), json.dumps(steps)],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=env,
        timeout=120,
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (r.stdout[-2000:], r.stderr[-4000:])
    return json.loads(lines[-1][len("RESULT ") :]), r.stderr


def test_setup_run_verify_cleanup_remove_call_nothing_windows_lacks(tmp_path: Path) -> None:
    from tests.support import winprobefakes

    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nnetwork:\n  allow:\n    - example.test\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".sandgate.yaml").write_text("version: 1\nnetwork:\n  allow:\n    - example.test\n")
    steps: list[tuple[str, object]] = [
        ("setup", ["setup"]),
        ("run_allow", ["run", "--allow", "example.test", "--", "tool", "--flag"]),
        ("run_policy", ["run", "--policy", str(policy), "--", "tool"]),
        ("run_none", ["run", "--", "tool"]),
        ("verify", ["verify", "--only", ",".join(winprobefakes.simulated())]),
        ("chdir", str(ws)),
        ("run_workspace", ["run", "--", "tool"]),
        ("trust", ["trust"]),
        ("cleanup", ["cleanup"]),
        ("remove", ["setup", "--remove"]),
    ]
    out, err = _flow(tmp_path, steps)
    assert "Traceback" not in err, err[-4000:]
    assert out == {
        "setup": 0,
        "run_allow": 0,
        "run_policy": 0,
        "run_none": 0,
        "verify": 0,
        "run_workspace": 0,
        "trust": "exit 125",  # one line: not on Windows yet
        "cleanup": 0,
        "remove": 0,
    }, err[-4000:]
    assert "sandgate: error: trusting a workspace policy is not available on Windows yet" in err


def test_a_user_config_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "home" / ".config" / "sandgate" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("version: 1\nnetwork:\n  allow:\n    - example.test\n")
    out, err = _flow(tmp_path, [("setup", ["setup"]), ("run", ["run", "--", "tool"])])
    assert out == {"setup": 0, "run": "exit 125"} and "Traceback" not in err, err[-3000:]
    assert f"sandgate: error: user config {config} is not read on Windows yet" in err


def test_an_ntstatus_exit_code_fits_os_exit() -> None:
    """GetExitCodeProcess's DWORD as the C int os._exit takes (win-py P8), the same 32 bits for the caller."""
    for code, want in ((0, 0), (3, 3), (0xC0000005, -1073741819), (0xC000013A, -1073741510), (0xFFFFFFFF, -1)):
        got = runner.exit_status(code)
        assert got == want and -(1 << 31) <= got < (1 << 31) and got & 0xFFFFFFFF == code
