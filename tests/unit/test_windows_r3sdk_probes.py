"""The verify bodies' own ctypes against mingw-w64's SDK (r3-sdk): probelogon, probedesktop, probenet's
WMI body and win32probefs declare their Win32 functions and structures themselves, in code that runs
only in a real sandbox. Each is executed here with a recording ctypes (tests/support/winscript.py:
Windows' widths, ctypes' own conversion of every argument) and what it declared and passed is compiled
against the SDK: the prototypes a body set, the values it passed undeclared (ctypes' default
conversion), the default int result, and its structures' layout (INPUT, KEYBDINPUT,
JOBOBJECT_BASIC_PROCESS_ID_LIST).
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

import pytest

from selftest.windows import probedesktop, probelogon, probenet, win32probefs
from tests.support import winscript, winsdk, winsdkcalls

#: mingw-w64's SDK and compiler are the Linux suite's; on Windows the real DLLs are loaded instead
pytestmark = pytest.mark.skipif(os.name == "nt", reason="the SDK check runs where mingw-w64 is (Linux)")

HANDLES = {"GetProcessWindowStation", "GetThreadDesktop", "OpenWindowStationW", "OpenDesktopW", "OpenProcess"}
#: the bodies' structures under the SDK's names and field names (offsets compared by name)
SDK_NAMES = {
    "INPUT": ("INPUT", {}),
    "KI": ("KEYBDINPUT", {"vk": "wVk", "scan": "wScan", "flags": "dwFlags", "extra": "dwExtraInfo"}),
    "PIDS": (
        "JOBOBJECT_BASIC_PROCESS_ID_LIST",
        {"assigned": "NumberOfAssignedProcesses", "listed": "NumberOfProcessIdsInList", "ids": "ProcessIdList"},
    ),
}


def _answer(name: str) -> Any:
    return 0x44 if name in HANDLES | {"CreateWindowExW"} else 1


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[winscript.Recording]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / probelogon.PID_FILE).write_text(json.dumps({"pid": 42}))
    return [winscript.run_script(s, _answer) for s in (probelogon.SCRIPT, probedesktop.SCRIPT, probenet.WMI)]


def _as_sdk(cls: type, name: str, fields: dict[str, str]) -> type:
    """`cls` with the SDK's field names; a variable-length tail array cut to the SDK's [1]."""
    out = []
    for f, t in cls._fields_:  # type: ignore[attr-defined]
        if issubclass(t, ctypes.Array) and f == "ids":
            t = t._type_ * 1
        out.append((fields.get(f, f), t))
    return type(name, (ctypes.Structure,), {"_fields_": out})


def test_every_probe_bodys_calls_and_structures_match_the_sdk(
    recorded: list[winscript.Recording], tmp_path: Path
) -> None:
    calls = [c for r in recorded for c in r.calls]
    names = {c.name for c in calls}
    assert {"OpenProcess", "OpenDesktopW", "SetThreadDesktop", "SendInput", "QueryInformationJobObject"} <= names
    structs = {k: v for r in recorded for k, v in r.structs.items()}
    assert set(structs) == set(SDK_NAMES), "a body laid out a structure this test does not map"
    b = winsdk.Bindings(structs={SDK_NAMES[k][0]: _as_sdk(v, *SDK_NAMES[k]) for k, v in structs.items()})
    body = winsdk.struct_checks(b, set()) + winsdkcalls.script_checks(calls)
    assert winsdkcalls.failures(body, tmp_path) == []
    for c in calls:  # and each name in the DLL the body loads it from
        assert c.name in winsdkcalls.exports(c.dll), (c.dll, c.name)


def test_a_slip_in_a_body_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A HANDLE through the default int result, a Python int for a pointer, a structure too small."""
    monkeypatch.chdir(tmp_path)
    slip = (
        "import ctypes\nk = ctypes.WinDLL('kernel32', use_last_error=True)\n"
        "h = k.OpenProcess(0x1000, False, 42)\n"  # restype left c_int
        "k.QueryInformationJobObject(7, 3, ctypes.byref(ctypes.c_uint32()), 4, None)\n"
    )
    calls = winscript.run_script(slip, _answer).calls
    text = "\n".join(winsdkcalls.failures(winsdkcalls.script_checks(calls), tmp_path))
    assert "OpenProcess: result is 4 bytes, integer" in text
    assert "QueryInformationJobObject: argument 1 is a Python int" in text
    with pytest.raises(ctypes.ArgumentError):  # a declared prototype converts as the real call does
        winscript.run_script(
            "import ctypes\nk = ctypes.WinDLL('kernel32')\nk.CloseHandle.argtypes = (ctypes.c_void_p,)\n"
            "k.CloseHandle(1.5)\n",
            _answer,
        )


def test_the_short_name_call_is_declared_as_the_sdk_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """win32probefs.OsFsOps.short_alias: GetShortPathNameW(LPCWSTR, LPWSTR, DWORD) -> DWORD, undeclared."""
    log = winscript.Recording()
    shim = winscript._ctypes(log, lambda name: 12)
    monkeypatch.setattr(ctypes, "WinDLL", shim.WinDLL, raising=False)
    monkeypatch.setattr(ctypes, "get_last_error", lambda: 0, raising=False)
    win32probefs.OsFsOps().short_alias(r"C:\w\Program Files")
    (call,) = log.calls
    assert winsdkcalls.failures(winsdkcalls.script_checks([call]), tmp_path) == []


def test_every_body_that_binds_win32_is_recorded_here() -> None:
    """A new body with its own WinDLL must join the recorded ones (the `recorded` fixture), or it goes unchecked."""
    from selftest.windows import allbodies

    binding = {b.script for b in allbodies.bodies() if "WinDLL" in b.script}
    # probeacl's bodies carry win32probefs' source: its one WinDLL is GetShortPathNameW's, checked below
    acl = {s for s in binding if s.count("WinDLL") == 1 and "kernel32.GetShortPathNameW(" in s}
    assert binding - acl == {probelogon.SCRIPT, probedesktop.SCRIPT, probenet.WMI}
