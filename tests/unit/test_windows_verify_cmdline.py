"""`sandgate verify` on Windows starts its probe bodies within CreateProcessWithLogonW's command line
limit (issue 28 review, win-divert D5).

"lpCommandLine: The command line to be executed. The maximum length of this string is 1024
characters" (learn.microsoft.com/windows/win32/api/winbase/nf-winbase-createprocesswithlogonw).
Every body's script is longer than that (1052 to 10361 characters), so `python -c SCRIPT NAME`
would not start a single row on Windows. verify writes the script to the scratch workspace and runs
`python -I FILE NAME`; the fake kernel refuses a longer command line (winkernel.check_command_line)
and the fake python exits 2 when FILE is missing (winprobefakes.program).
"""

from __future__ import annotations

import json
import ntpath
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fsguard.windows import exesearch
from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import runner
from selftest.windows import allbodies, probebody
from sgbase.windows.api import Proc, WinApiError
from tests.support import winkernel, winprobefakes
from tests.support.winfake import FakeWinApi

#: A long but ordinary interpreter path and scratch workspace (a runner's tool cache, a long user name).
PYTHON = r"C:\hostedtoolcache\windows\Python\3.12.10\x64\python.exe"
WORKDIR = r"C:\Users\a-rather-long-user-name-for-a-windows-account\AppData\Local\sandgate-verify-0123abcd"


@pytest.mark.parametrize("body", allbodies.bodies(), ids=lambda b: b.name)
def test_each_body_starts_within_the_command_line_limit(body: probebody.ProbeBody) -> None:
    line = exesearch.cmdline(body.argv(PYTHON, ntpath.join(WORKDIR, probebody.SCRIPT_FILE)))
    assert len(line) <= winkernel.CPWL_CMDLINE_MAX
    assert len(body.script) > winkernel.CPWL_CMDLINE_MAX  # why: as `-c SCRIPT` none of them would start


def test_the_fake_refuses_what_windows_refuses() -> None:
    """The control: a body run the old way (`python -c SCRIPT`) is refused by the fake kernel."""
    body = allbodies.bodies()[0]
    long = exesearch.cmdline((PYTHON, "-c", body.script, body.name))
    launch = SimpleNamespace(cmdline=long)
    with pytest.raises(WinApiError, match="1024"):
        winkernel.check_command_line(launch)  # type: ignore[arg-type]


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    fake = FakeWinApi()
    fake.program = winprobefakes.program
    fake.m.files[fake.python()] = b"MZ"  # the interpreter verify's probes run with
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    assert cli.main(["setup"]) == 0
    return fake


def test_verify_writes_each_script_runs_it_and_removes_it(
    machine: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[str, ...]] = []
    original = machine.start_suspended

    def start(launch: Launch) -> Proc:
        seen.append(launch.argv)
        script = next(b.script for b in allbodies.bodies() if b.name == launch.argv[-1])
        assert launch.argv[1] == "-I" and machine.m.files[launch.argv[2]].decode() == script  # there at the start
        return original(launch)

    machine.start_suspended = start  # type: ignore[method-assign]
    capsys.readouterr()
    assert cli.main(["verify", "--only", "private_desktop,git_rename"]) == 0
    assert [a[-1] for a in seen] == ["private_desktop", "git_rename"]
    assert not [p for p in machine.m.files if p.endswith(probebody.SCRIPT_FILE)]  # removed after each run
    out = capsys.readouterr().out
    assert "ok    private_desktop" in out and "ok    git_rename" in out


def test_a_missing_script_is_a_row_that_did_not_run(machine: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    original = machine.write_file

    def lose_scripts(path: str, data: bytes) -> None:
        if not path.endswith(probebody.SCRIPT_FILE):
            original(path, data)

    machine.write_file = lose_scripts  # type: ignore[method-assign]
    capsys.readouterr()
    assert cli.main(["verify", "--only", "private_desktop"]) == 1
    assert "did not run" in capsys.readouterr().out


def test_the_acl_script_runs_as_a_file(tmp_path: Path) -> None:
    """The script stands alone as a file too (no sandgate import; -I: no workspace on sys.path)."""
    (tmp_path / "json.py").write_text("raise SystemExit('the workspace shadowed the stdlib')\n")  # -I ignores it
    body = next(b for b in allbodies.bodies() if b.name == "case_variant")
    (tmp_path / probebody.SCRIPT_FILE).write_text(body.script)
    done = subprocess.run(
        [sys.executable, "-I", probebody.SCRIPT_FILE, body.name], cwd=tmp_path, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads((tmp_path / probebody.RESULT).read_text())
    assert [r["name"] for r in got["probes"]] == ["acl_probes"]  # a POSIX folder has no `...\.git`: it ran
    assert got["probes"][0]["ok"] is False  # and never passes there
