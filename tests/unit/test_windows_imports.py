"""The Windows entry points load without what CPython on Windows lacks (issue 14).

Linux CI cannot run Windows, but it can catch the commonest way a Windows run breaks before it
starts: a module on the Windows path importing a POSIX-only module (pwd, fcntl, termios,
resource) or using a Linux-only `os` name at import time. Each module is imported in a fresh
interpreter where those are absent; the Linux room (launcher.run.launch) must still be refused
there, which proves the check itself bites.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

#: What `sandgate run|setup|cleanup|proxy` load on Windows, and the proxy child the backend starts.
WINDOWS_PATH = (
    "launcher.cli",
    "launcher.run.windows.runner",
    "launcher.run.windowsbackend",
    "launcher.run.windows.setup",
    "launcher.run.windows.realapi",
    "selftest.windows.verifyrun",  # `sandgate verify` on win32 (issue 28, W3)
    "selftest.windows.probeacl",  # its ACL rows, loaded by allbodies.bodies() (issue 28, H2)
    "selftest.windows.probenet",  # its H3/H4 rows, loaded by allbodies.bodies()
    "netguard.windows.win32divert",  # the transparent path (issue 28, item 2)
    "launcher.cliargs",  # `run --transparent`: a Windows-only flag
    "launcher.cliparsers",  # `setup --transparent`
    "launcher.run.options",
    "launcher.run.policyargs",
    "launcher.run.summary",
    "launcher.run.proxy",
    "netguard.daemon.standalone",
    "netguard.localaddrs",  # the proxy child's veto table (win-py P6)
)

# Imports only: every call on the way is checked by test_windows_py_cli.py (the CLI on the fake machine) and
# test_windows_py_proxy.py (the proxy child), in an interpreter without what Windows lacks (tests/support/winpython.py).

WITHOUT_POSIX = """
import os, sys
for name in ("pwd", "grp", "fcntl", "termios", "resource"):
    sys.modules[name] = None  # not in CPython on Windows
for name in [n for n in dir(os) if n.startswith("SPLICE_")] + ["splice", "pipe2", "O_NOFOLLOW", "O_CLOEXEC", "O_NONBLOCK"]:
    if hasattr(os, name):
        delattr(os, name)
import importlib
importlib.import_module(sys.argv[1])
"""


def _import_without_posix(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_POSIX, module], capture_output=True, text=True, cwd=REPO, timeout=60
    )


@pytest.mark.parametrize("module", WINDOWS_PATH)
def test_a_module_on_the_windows_path_imports_without_posix_modules(module: str) -> None:
    r = _import_without_posix(module)
    assert r.returncode == 0, r.stderr[-1500:]


def test_the_linux_run_room_is_refused_there_so_the_check_bites() -> None:
    r = _import_without_posix("launcher.run.launch")
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr
