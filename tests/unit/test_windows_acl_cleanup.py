"""`sandgate cleanup` on Windows gets to the Windows runner (win-acl A1): CPython on Windows has no
fcntl, and launcher/run/housekeeping.py, which `cleanup` loads on every platform, imported three
fcntl-based modules at the top, so the command died with a traceback before its win32 branch.

Run in a child interpreter with the POSIX-only modules removed (as tests/unit/test_windows_imports.py
does), sys.platform set to "win32" once everything the CLI imports up front is loaded, and the fake
WinApi behind the runner: the command's own lazy imports then meet what Windows would give them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

CLEANUP_WITHOUT_POSIX = """
import os, sys
for name in ("pwd", "grp", "fcntl", "termios", "resource"):
    sys.modules[name] = None  # not in CPython on Windows
for name in ("pipe2", "O_NOFOLLOW", "O_CLOEXEC", "O_NONBLOCK"):
    if hasattr(os, name):
        delattr(os, name)
import json, pathlib, shutil  # the standard library's own win32 branches need _winapi: loaded first
from launcher import cli
from launcher.run.windows import runner
from tests.support import winfake

fake = winfake.FakeWinApi()
winfake.set_up(fake)
runner.make_api = lambda: fake
sys.platform = "win32"
sys.exit(cli.main(sys.argv[1:]))
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLEANUP_WITHOUT_POSIX, *argv], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_sandgate_cleanup_on_windows_reaches_the_windows_runner_without_posix_modules() -> None:
    r = _run("cleanup")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    assert "nothing to clean up" in r.stderr  # the Windows runner's answer on a clean machine


def test_the_linux_only_housekeeping_commands_refuse_in_one_line_on_windows() -> None:
    for argv in (("daemon", "status"), ("cache", "clear")):
        r = _run(*argv)
        assert "Traceback" not in r.stderr and r.returncode != 0, r.stderr
        assert r.stderr.startswith("sandgate: error:") and r.stderr.count("\n") == 1 and "not on Windows" in r.stderr
