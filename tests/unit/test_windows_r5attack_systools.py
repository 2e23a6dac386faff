"""r5-attack A5: sandgate never starts a Windows tool by a bare name.

CreateProcess without an application name (CPython's subprocess) looks in the current directory before
PATH, so an elevated `sandgate setup` typed in a workspace would run a `powershell.exe` an earlier run's
command wrote there, as an administrator. These tests fail on the old `["powershell.exe", ...]` argv.
"""

from __future__ import annotations

import ast
import ntpath
import pathlib
import subprocess
from typing import Any

import pytest

from fsguard.windows import win32wmi
from launcher.run.windows import realapi
from sgbase.windows import systools

ROOT = pathlib.Path(__file__).resolve().parents[2]
WINDOWS_DIRS = ("fsguard/windows", "launcher/run/windows", "netguard/windows", "sgbase/windows")
_EXECUTABLE = (".exe", ".com", ".bat", ".cmd")
_TOOLS = {"powershell", "pwsh", "cmd", "netsh", "schtasks", "icacls", "reg", "sc", "wmic", "net", "whoami"}


class _Ran:
    def __init__(self) -> None:
        self.argv: list[str] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.argv = list(argv)
        return subprocess.CompletedProcess(argv, 0, "1\n", "")


def _absolute_powershell(argv: list[str], root: str) -> None:
    assert ntpath.isabs(argv[0]), argv[0]
    assert argv[0] == ntpath.join(root, "System32", "WindowsPowerShell", "v1.0", "powershell.exe")


def test_the_firewall_powershell_is_started_by_its_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _Ran()
    monkeypatch.setattr(subprocess, "run", ran)
    monkeypatch.setenv("SystemRoot", "D:\\Win")
    assert realapi.RealWinApi().firewall_has("sandgate-x") is True
    _absolute_powershell(ran.argv, "D:\\Win")


def test_the_wmi_powershell_is_started_by_its_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _Ran()
    monkeypatch.setattr(subprocess, "run", ran)
    monkeypatch.setenv("SystemRoot", "D:\\Win")
    assert win32wmi._ps("1") == "1"
    _absolute_powershell(ran.argv, "D:\\Win")


@pytest.mark.parametrize(
    ("env", "root"),
    [
        ({"SYSTEMROOT": "C:\\WINDOWS"}, "C:\\WINDOWS"),  # any spelling of the name (Windows' are case-blind)
        ({}, "C:\\Windows"),
        ({"SystemRoot": "Windows"}, "C:\\Windows"),  # relative: would be the current directory again
        ({"SystemRoot": "\\\\host\\share"}, "C:\\Windows"),  # never a network path
    ],
)
def test_system_root_is_absolute_and_local(env: dict[str, str], root: str) -> None:
    assert systools.system_root(env) == root
    assert systools.powershell(env).startswith(root + "\\System32\\")


def _bare_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every list literal in `source` that starts with a tool's bare name (an argv)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.List) and node.elts):
            continue
        first = node.elts[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        name = first.value.casefold()
        if (name.endswith(_EXECUTABLE) or name in _TOOLS) and not ntpath.isabs(first.value):
            found.append((node.lineno, first.value))
    return found


def test_no_windows_module_starts_a_tool_by_a_bare_name() -> None:
    found = [
        (str(path.relative_to(ROOT)), line, name)
        for d in WINDOWS_DIRS
        for path in sorted((ROOT / d).glob("*.py"))
        for line, name in _bare_names(path.read_text())
    ]
    assert found == []


def test_the_scan_sees_the_old_bare_name() -> None:
    old = 'import subprocess\nsubprocess.run(["powershell.exe", "-NoProfile"], check=False)\n'
    assert _bare_names(old) == [(2, "powershell.exe")]
    held = 'argv = ["powershell.exe", "-NoProfile", "-Command", script]\nsubprocess.run(argv)\n'  # as it was
    assert _bare_names(held) == [(1, "powershell.exe")]
    assert _bare_names('import subprocess\nsubprocess.run([r"C:\\Windows\\x.exe"])\n') == []
