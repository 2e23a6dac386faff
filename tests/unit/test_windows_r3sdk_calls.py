"""The call table's deeper contract against mingw-w64's SDK (r3-sdk; tests/support/winsdkcalls.py).

Beyond test_win_sdk.py's sizes and kinds: what each pointer argument points at (W strings, the
pointee's size), each result's typedef against the failure convention the product reads it with
(CONVENTIONS: BOOL is not a status code), and that the named DLL exports each name. Each check is
also shown to fail on the slip it is for.
"""

from __future__ import annotations

import os
import re
from ctypes import POINTER, c_char_p, c_int32, c_uint32, c_uint64, c_void_p, c_wchar_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsguard.windows import win32tasks
from sgbase.windows import win32calls
from tests.support import winmarshal, winsdk, winsdkcalls

#: mingw-w64's SDK and compiler are the Linux suite's; on Windows the real DLLs are loaded instead
pytestmark = pytest.mark.skipif(os.name == "nt", reason="the SDK check runs where mingw-w64 is (Linux)")

CONVENTIONS = winmarshal.CONVENTIONS


@dataclass(frozen=True)
class _Call:
    dll: str
    name: str
    doc: str
    argtypes: tuple[Any, ...]
    restype: Any


def test_every_call_has_a_convention() -> None:
    assert set(CONVENTIONS) == {c.name for c in win32calls.CALLS}


def test_pointees_and_result_types_match_the_sdk(tmp_path: Path) -> None:
    calls = win32calls.CALLS
    body = winsdkcalls.pointee_checks(calls, set()) + winsdkcalls.result_checks(calls, CONVENTIONS, set())
    assert len(body) >= 150, "the checks were not generated"
    assert winsdkcalls.failures(body, tmp_path) == []


def test_com_methods_point_at_what_the_sdk_says(tmp_path: Path) -> None:
    """COM methods by vtable slot: their out-pointers' pointees (a BSTR*, a LONG*) as taskschd.h's."""
    body = []
    for m in win32tasks.METHODS:
        for i, t in enumerate(m.argtypes):
            if hasattr(t, "_type_") and isinstance(t._type_, type):
                a = f"fn<decltype({m.iface}Vtbl::{m.name})>::arg<{i + 1}>"
                size = winsdk.layout(t._type_).size
                body.append(f'static_assert(points_at<{a}>({size}), "{m.iface}::{m.name}: argument {i + 1}");')
    assert len(body) >= 10
    assert winsdkcalls.failures(body, tmp_path) == []


def test_each_slip_fails(tmp_path: Path) -> None:
    """An A function's string as W, a DWORD* for a PHANDLE, a status read as BOOL, a HANDLE read as BOOL."""
    slips = [
        _Call("advapi32", "LookupPrivilegeValueA", "", (c_wchar_p, c_wchar_p, c_void_p), c_int32),
        _Call("advapi32", "OpenProcessToken", "", (c_void_p, c_uint32, POINTER(c_uint32)), c_int32),
        _Call("advapi32", "LookupAccountNameW", "", (c_char_p,) + (c_void_p,) * 6, c_int32),
    ]
    body = winsdkcalls.pointee_checks(slips, set())
    body += winsdkcalls.result_checks(
        [
            _Call("advapi32", "GetNamedSecurityInfoW", "", (), c_uint32),
            _Call("user32", "OpenDesktopW", "", (), c_void_p),
        ],
        {"GetNamedSecurityInfoW": "BOOL", "OpenDesktopW": "BOOL"},
        set(),
    )
    text = "\n".join(winsdkcalls.failures(body, tmp_path))
    assert "LookupPrivilegeValueA: argument 1 is a wide (W) string" in text
    assert "OpenProcessToken: argument 3 points at 4 bytes" in text
    assert "LookupAccountNameW: argument 1 is a narrow (A) string" in text
    assert "GetNamedSecurityInfoW: the result is read as BOOL" in text
    assert "OpenDesktopW: the result is read as BOOL" in text
    control = winsdkcalls.pointee_checks(
        [_Call("x", "OpenProcessToken", "", (c_void_p, c_uint32, POINTER(c_uint64)), c_int32)], set()
    )
    assert winsdkcalls.failures(control, tmp_path) == []  # a PHANDLE is 8 bytes: passes


def test_each_dll_exports_its_names() -> None:
    """The DLL named beside each call exports it (mingw-w64's import library, made from the DLL's .def)."""
    missing = [(c.dll, c.name) for c in win32calls.CALLS if c.name not in winsdkcalls.exports(c.dll)]
    assert missing == []
    assert "CreateProcessWithLogonW" not in winsdkcalls.exports("kernel32")  # the check can fail
    assert "IsUserAnAdmin" in winsdkcalls.exports("shell32")


def _sdk_guid(header: str, name: str) -> tuple[int, ...]:
    text = (Path("/usr/share/mingw-w64/include") / header).read_text(encoding="utf-8")
    m = re.search(rf"DEFINE_GUID\({name},\s*([^)]*)\)", text)
    assert m, f"{header} does not define {name}"
    return tuple(int(x, 16) for x in m.group(1).replace(" ", "").split(","))


def _ours(g: Any) -> tuple[int, ...]:
    return (g.Data1, g.Data2, g.Data3, *g.Data4)


def test_the_com_class_and_interface_ids_are_taskschd_hs() -> None:
    """CoCreateInstance(CLSID_TaskScheduler, IID_ITaskService): a digit off is REGDB_E_CLASSNOTREG at the sweep."""
    assert _ours(win32tasks.CLSID_TASK_SCHEDULER) == _sdk_guid("taskschd.h", "CLSID_TaskScheduler")
    assert _ours(win32tasks.IID_TASK_SERVICE) == _sdk_guid("taskschd.h", "IID_ITaskService")
    assert _ours(win32tasks.IID_TASK_SERVICE) != _sdk_guid("taskschd.h", "IID_ITaskFolder")  # can fail
