"""The Windows bindings against the SDK's own headers (mingw-w64), checked by a compiler (issue 28).

tests/support/winsdk.py turns every structure, call and constant the Windows backend declares into
`static_assert`s over the SDK's declarations; x86_64-w64-mingw32-g++ checks them. `.ci/setup --test`
installs the compiler: without it these tests fail and say so (a skipped check would pass silently).
What mingw's headers lack cannot be checked here; `MINGW_LACKS` names it, with where the value was taken.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from ctypes import POINTER, Structure, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p, c_wchar, c_wchar_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import winsdk

GXX = "x86_64-w64-mingw32-g++"
PACKAGES = ("launcher", "netguard", "fsguard", "sgbase", "selftest")
#: Constants mingw-w64's headers do not define (its fwpmtypes.h stops short of these; DESKTOP_ALL_ACCESS is
#: no SDK macro at all): their values follow the Microsoft documentation pages named beside them in the code.
MINGW_LACKS = frozenset(
    {
        "FWPM_ACTRL_READ",
        "FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT",
        "FWPM_FILTER_FLAG_PERSISTENT",
        "FWPM_PROVIDER_FLAG_PERSISTENT",
        "FWPM_SESSION_FLAG_DYNAMIC",
        "FWPM_SUBLAYER_FLAG_PERSISTENT",
        "DESKTOP_ALL_ACCESS",
    }
)
#: Prefixes of names that are the SDK's, not ours: such a constant must be found in the headers.
SDK_PREFIXES = ("FWP", "NERR_", "STATUS_", "ERROR_", "JOB_OBJECT_", "CREATE_", "LOGON_", "STARTF_", "PROCESS_", "DESKTOP_", "WINSTA_", "GENERIC_", "FILE_", "SE_", "TOKEN_", "HANDLE_FLAG")  # fmt: skip
#: Fields our structures name otherwise than the SDK: anonymous unions (no name in C to check by).
ANONYMOUS = frozenset({"FWPM_FILTER0.context", "FWP_VALUE0.u"})


@dataclass
class Compiled:
    ours: set[str]  # names the SDK does not declare
    failed: list[str]  # static_assert messages that failed
    unnamed: set[str]  # STRUCT.field the SDK's structure does not have


def _gxx() -> str:
    path = shutil.which(GXX)
    assert path, f"{GXX} is missing: run `.ci/setup --test` (it installs g++-mingw-w64-x86-64)"
    return path


def _compile(source: str, tmp: Path) -> str:
    src = tmp / "sdkcheck.cpp"
    src.write_text(source)
    cmd = [_gxx(), *winsdk.DEFINES, "-std=c++20", "-fsyntax-only", "-fmax-errors=0", "-Wno-invalid-offsetof", str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"})
    return r.stderr


def _check(b: winsdk.Bindings, tmp: Path, coverage: bool = True) -> Compiled:
    ours: set[str] = set()
    for _ in range(3):  # our own names out, then the real check
        err = _compile(winsdk.translation_unit(b, ours, coverage), tmp)
        new = winsdk.undeclared(err) - ours
        if not new:
            break
        ours |= new
    failed = winsdk.failed_asserts(err)
    unnamed = {f.split(":", 1)[1] for f in failed if f.startswith("unnamed:")}
    other = [line for line in err.splitlines() if " error: " in line and "static assertion failed" not in line]
    assert not other, "the generated checks do not compile:\n" + "\n".join(other[:20])
    return Compiled(ours, [f for f in failed if not f.startswith("unnamed:")], unnamed)


@pytest.fixture(scope="module")
def bindings() -> winsdk.Bindings:
    return winsdk.collect(winsdk.windows_modules(tuple(p for p in PACKAGES if _importable(p))))


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def test_every_binding_matches_the_sdk(bindings: winsdk.Bindings, tmp_path: Path) -> None:
    assert len(bindings.structs) >= 15 and len(bindings.calls) >= 50, "the binding modules were not found"
    got = _check(bindings, tmp_path)
    assert got.failed == [], "declarations differ from the SDK:\n" + "\n".join(got.failed)
    missing = {c.name for c in bindings.calls} & got.ours
    assert not missing, f"functions the SDK does not declare: {sorted(missing)}"
    assert not set(bindings.structs) & got.ours, "structures the SDK does not declare"
    sdkish = {n for n in got.ours if n.startswith(SDK_PREFIXES)} - MINGW_LACKS
    assert not sdkish, f"SDK-looking constants the headers do not define (misspelt?): {sorted(sdkish)}"
    assert got.unnamed <= ANONYMOUS, f"fields named otherwise than in the SDK: {sorted(got.unnamed - ANONYMOUS)}"
    checked = set(bindings.constants) - got.ours
    assert len(checked) >= 40, f"only {len(checked)} constants were compared"


class _Info(Structure):  # PROCESS_INFORMATION with dwProcessId one size too wide: a layout slip
    _fields_ = [("hProcess", c_void_p), ("hThread", c_void_p), ("dwProcessId", c_uint64), ("dwThreadId", c_uint32)]


@dataclass(frozen=True)
class _Call:
    dll: str
    name: str
    doc: str
    argtypes: tuple[Any, ...]
    restype: Any


def test_the_check_catches_each_kind_of_slip(tmp_path: Path) -> None:
    """Each check can fail: a wrong field width, an argument missing, a pointer for an integer, a wrong value."""
    b = winsdk.Bindings()
    b.structs["PROCESS_INFORMATION"] = _Info
    b.calls = [
        _Call("kernel32", "CloseHandle", "", (), c_uint32),  # one argument missing
        _Call("kernel32", "ResumeThread", "", (c_void_p,), c_void_p),  # DWORD result taken as a pointer
    ]
    b.constants = {"JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE": (0x2001, "slip"), "NERR_SUCCESS": (0, "alias")}
    got = _check(b, tmp_path, coverage=False)
    text = "\n".join(got.failed)
    assert "struct PROCESS_INFORMATION: size 32" in text  # ours: 8 + 8 + 8 + 4 + pad; the SDK: 24
    assert "field dwThreadId at offset 24" in text
    assert "CloseHandle: 0 arguments" in text
    assert "ResumeThread: result is 8 bytes, pointer" in text
    assert "constant JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2001" in text
    assert "NERR_SUCCESS" not in text  # the SDK's NERR_Success is 0: the alias is compared, and matches


def test_layout_is_windows_x64_not_linux() -> None:
    """ctypes on Linux would say 4 for c_wchar and 8 for c_long: the layout here is LLP64's."""

    class Path260(Structure):
        _fields_ = [("flags", c_uint16), ("name", c_wchar * 260), ("next", POINTER(c_uint8)), ("tail", c_uint8)]

    lay = winsdk.layout(Path260)
    assert lay.offsets == (("flags", 0), ("name", 2), ("next", 528), ("tail", 536))
    assert (lay.size, lay.align) == (544, 8)
    assert winsdk.layout(c_wchar_p).kind == 1 and winsdk.layout(None).kind == 9

    class Packed(Structure):
        _pack_ = 1
        _fields_ = [("a", c_uint8), ("b", c_uint32)]

    assert winsdk.layout(Packed).offsets == (("a", 0), ("b", 1)) and winsdk.layout(Packed).size == 5
    with pytest.raises(TypeError):
        winsdk.layout(ctypes.py_object)


def test_no_binding_module_names_a_type_whose_width_differs() -> None:
    """c_long, c_ulong and ctypes.wintypes are 4 bytes on Windows and 8 here: layouts computed here would lie."""
    mods = winsdk.windows_modules(tuple(p for p in PACKAGES if _importable(p)))
    assert winsdk.ambiguous_types(mods) == []


def test_com_vtable_slots_are_checked_and_a_slip_fails(bindings: winsdk.Bindings, tmp_path: Path) -> None:
    """The sweep's Task Scheduler calls go by vtable slot (win32tasks.METHODS): each slot, arity and
    argument is compared with mingw-w64's C vtables (taskschd.h under CINTERFACE); a wrong slot or
    a missing argument fails."""
    from fsguard.windows import win32tasks

    assert len(bindings.methods) >= 15 and {"PROCESSENTRY32W", "VARIANT"} <= set(bindings.structs)
    b = winsdk.Bindings()
    slips = (
        win32tasks.Method("ITaskFolder", "DeleteTask", 14, (c_void_p, ctypes.c_int32)),  # GetTasks' slot
        win32tasks.Method("ITaskService", "Connect", 10, (win32tasks.VARIANT,) * 3),  # one VARIANT missing
        win32tasks.Method("IPrincipal", "get_UserId", 11, (c_uint32,)),  # a BSTR* taken as a DWORD
    )
    b.methods = [*slips, win32tasks.METHODS[-1]]
    failed = _check(b, tmp_path, coverage=False).failed
    text = "\n".join(failed)
    assert "ITaskFolder::DeleteTask: vtable slot 14" in text
    assert "ITaskService::Connect: 3 arguments" in text
    assert "IPrincipal::get_UserId: argument 1 is 4 bytes, integer" in text
    assert len(set(failed)) == 3  # the right record (the table's last) passes
