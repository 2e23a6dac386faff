"""Every wrapper that calls Win32, through ctypes' own argument conversion and through each call's
documented failure (r3-sdk; tests/support/winmarshal.py).

For each wrapper: one run where every call succeeds (each argument converted by a ctypes prototype
of its table entry, integers checked against their width, handles above 2**32), then one run per
call in which that call alone fails the documented way (FALSE / NULL / INVALID_HANDLE_VALUE with
GetLastError 5, a status 5, E_ACCESSDENIED, STATUS_ACCESS_DENIED). The wrapper must then raise an
OSError carrying that 5 (read through use_last_error, or the status itself), unless the call is
one whose failure the wrapper documents it tolerates (a cleanup, a sizing call, an answer such as
"refused: not ours"). What each byref or array pointed at is compiled against the SDK's pointee.
"""

from __future__ import annotations

import ctypes
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsguard.windows import (
    desktop,
    job,
    win32dcom,
    win32fileowner,
    win32job,
    win32logonreach,
    win32lsa,
    win32proc,
    win32profile,
    win32session,
    win32sweep,
)
from launcher.run.windows import realapi, realowner, win32debug, win32owner
from sgbase.windows import win32, win32calls
from sgbase.windows.api import WinApiError
from tests.support import winmarshal, winsdkcalls

MODULES = (
    win32,
    win32dcom,
    win32fileowner,
    win32job,
    win32logonreach,
    win32lsa,
    win32proc,
    win32profile,
    win32session,
    win32sweep,
    win32debug,
    win32owner,
)
SID = winmarshal.SID
H = 0x1_0000_0040  # a handle above 2**32: a c_int32 on its way would cut it
CLEANUP = frozenset(
    {"CloseHandle", "CloseWindowStation", "CloseDesktop", "LocalFree", "RevertToSelf", "WTSFreeMemory", "LsaClose"}
    | {"GetCurrentProcess", "SysFreeString"}
)
HRESULT_DENIED = 0x80070005
NO_SDK = "mingw-w64's SDK and compiler are the Linux suite's; on Windows the real DLLs are loaded instead"


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Path], object]
    tolerated: frozenset[str] = frozenset()  # calls whose failure the wrapper answers without raising
    other_error: frozenset[str] = frozenset()  # calls whose failure it reports with its own code


class _Reg:
    """winreg as win32dcom uses it: one REG_BINARY value."""

    HKEY_LOCAL_MACHINE, KEY_READ, KEY_SET_VALUE, REG_BINARY = 1, 2, 3, 3

    def OpenKey(self, *a: Any) -> Any:
        import contextlib

        return contextlib.nullcontext(7)

    def QueryValueEx(self, key: int, value: str) -> tuple[bytes, int]:
        return b"\x01\x00\x04\x80" + bytes(16), self.REG_BINARY

    def SetValueEx(self, *a: Any) -> None:
        pass


def _file(tmp: Path) -> str:
    p = tmp / "f"
    p.write_text("x")
    return str(p)


CASES = (
    Case("resume", lambda t: win32.resume(H)),
    Case("terminate", lambda t: win32.terminate(H)),
    Case("protect", lambda t: win32.protect(b"pw")),
    Case("unprotect", lambda t: win32.unprotect(b"sealed")),
    Case("dacl_sddl", lambda t: win32.dacl_sddl(r"C:\w")),
    Case("set_dacl_sddl", lambda t: win32.set_dacl_sddl(r"C:\w", "D:(A;;GA;;;WD)")),
    Case("account_sid", lambda t: win32.account_sid("sandgate-u")),
    Case("add_user", lambda t: win32.add_user("sandgate-u", "pw")),
    Case("set_password", lambda t: win32.set_password("sandgate-u", "pw")),
    Case("delete_user", lambda t: win32.delete_user("sandgate-u")),
    Case("is_admin", lambda t: win32.is_admin(), frozenset({"IsUserAnAdmin"})),  # FALSE: not an admin
    # OpenProcess refused: "exists, not ours" (alive); GetExitCodeProcess failing reads as gone (MINOR, r3-sdk S3)
    Case("pid_alive", lambda t: win32.pid_alive(42), frozenset({"OpenProcess", "GetExitCodeProcess"})),
    Case("make_job", lambda t: win32job.make_job(job.plan_job())),
    Case("assign", lambda t: win32job.assign(H, H + 8)),
    Case("close_job", lambda t: win32job.close_job(H)),
    Case("lsa_deny", lambda t: win32lsa.deny(SID, ("SeBatchLogonRight", "SeServiceLogonRight"))),
    Case("lsa_undeny", lambda t: win32lsa.undeny(SID, ("SeBatchLogonRight",))),
    Case("delete_profile", lambda t: win32profile.delete_profile(SID)),
    Case("session_user", lambda t: win32session.session_user()),
    Case("logon", lambda t: win32sweep.logon("sandgate-u", "pw")),
    Case("as_user", lambda t: win32sweep.as_user(H, lambda: 1)),
    Case("pids", lambda t: win32sweep.pids()),
    # every failure is "not known to be ours" (None): the sweep leaves what it cannot prove is the sandbox user's
    Case(
        "open_process",
        lambda t: win32sweep.open_process(42),
        frozenset({"OpenProcess", "GetExitCodeProcess", "OpenProcessToken", "GetTokenInformation"})
        | {"ConvertSidToStringSidW"},
    ),
    Case("token_user", lambda t: win32sweep.token_user(H), frozenset({"GetTokenInformation"})),  # the sizing call
    # WAIT_FAILED reported as ERROR_TIMEOUT (MINOR, r3-sdk S2)
    Case("sweep_terminate", lambda t: win32sweep.terminate(H), other_error=frozenset({"WaitForSingleObject"})),
    Case(
        "open_owner",
        lambda t: win32owner.open_owner(42),
        frozenset({"OpenProcess", "OpenProcessToken", "GetTokenInformation", "ConvertSidToStringSidW"}),
    ),
    Case("job_pids", lambda t: win32owner.job_pids(H)),
    Case("set_debug", lambda t: win32debug.set_debug(True)),
    Case("owner_sid", lambda t: win32fileowner.owner_sid(_file(t))),
    Case("dcom_get", lambda t: win32dcom.get_sd("MachineLaunchRestriction")),
    Case("dcom_set", lambda t: win32dcom.set_sd("MachineLaunchRestriction", "O:BAD:(A;;GA;;;WD)")),
    Case("object_name", lambda t: win32proc.object_name(H)),
    Case("window_dacl", lambda t: win32proc.window_dacl(H)),
    Case("set_window_dacl", lambda t: win32proc.set_window_dacl(H, "D:(A;;GA;;;WD)")),
    Case("wait_exit", lambda t: win32proc.wait_exit(H)),
    Case("close_desktop", lambda t: win32proc.close_desktop(H, H + 8)),
    # the named station refused (access denied): the unnamed one Windows names, documented (R16)
    Case(
        "create_desktop",
        lambda t: win32proc.create_desktop(desktop.plan_desktop("t1", "S-1-5-21-1-2-3-1000", SID)),
        frozenset({"CreateWindowStationW"}),
    ),
    Case("deny_reach", lambda t: win32logonreach.deny_reach(SID, (42,))),
    Case("own_sid", lambda t: realapi._own_sid(), frozenset({"GetTokenInformation"})),  # the sizing call
)


def _install(monkeypatch: pytest.MonkeyPatch, dlls: winmarshal.Dlls) -> None:
    for mod in MODULES:
        monkeypatch.setattr(mod, "fn", dlls.fn)
    monkeypatch.setattr(ctypes, "get_last_error", dlls.get_last_error, raising=False)
    monkeypatch.setattr(win32dcom, "_winreg", lambda: _Reg())


def _trace(case: Case, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> winmarshal.Dlls:
    dlls = winmarshal.Dlls()
    _install(monkeypatch, dlls)
    case.run(tmp)
    assert dlls.calls, f"{case.name} called nothing"
    return dlls


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_wrapper_passes_ctypes_conversion_and_fails_on_each_documented_failure(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _trace(case, tmp_path, monkeypatch).calls
    for k, name in enumerate(calls):
        dlls = winmarshal.Dlls(fail_at=k)
        _install(monkeypatch, dlls)
        try:
            case.run(tmp_path)
        except OSError as e:
            if name not in case.other_error:
                assert e.errno in (winmarshal.DENIED, HRESULT_DENIED), f"{case.name}: {name} failed, raised {e!r}"
            continue
        assert name in CLEANUP | case.tolerated, f"{case.name}: {name} (call {k + 1}) failed and nothing was raised"


@pytest.mark.skipif(os.name == "nt", reason=NO_SDK)
def test_what_each_wrapper_pointed_at_is_the_sdks_pointee(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byref(x) and array the wrappers passed, compiled: x's Windows size is the SDK's pointee's."""
    seen: list[winsdkcalls.Passed] = []
    for case in CASES:
        seen += _trace(case, tmp_path, monkeypatch).passed
    assert len({p.call for p in seen}) >= 25
    assert winsdkcalls.failures(winsdkcalls.recorded_checks(seen), tmp_path) == []


@pytest.mark.skipif(os.name == "nt", reason=NO_SDK)
def test_the_harness_catches_each_kind_of_slip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A str for a pointer-to-handle, a truncated handle, a wrong byref target, an unchecked failure."""
    dlls = winmarshal.Dlls()
    _install(monkeypatch, dlls)
    with pytest.raises(ctypes.ArgumentError):
        dlls.fn("OpenProcessToken")(H, 8, 1.5)
    with pytest.raises(AssertionError, match="does not fit c_uint"):
        dlls.fn("TerminateJobObject")(H, 1 << 33)
    bad = winsdkcalls.passed("OpenProcessToken", (H, 8, ctypes.byref(ctypes.c_uint32())))  # a DWORD for a HANDLE
    assert winsdkcalls.failures(winsdkcalls.recorded_checks(bad), tmp_path) == [
        "OpenProcessToken: argument 3 was passed a c_uint (4 bytes)"
    ]
    unchecked = Case("unchecked", lambda t: win32.fn("TerminateProcess")(H, 1))
    dlls = winmarshal.Dlls(fail_at=0)
    _install(monkeypatch, dlls)
    unchecked.run(tmp_path)  # nothing raised: the parametrized test would name it
    assert dlls.calls == ["TerminateProcess"] and "TerminateProcess" not in CLEANUP


def test_every_module_that_calls_win32_is_driven_here() -> None:
    """A new binding module must join MODULES and CASES (win32wfp and win32tasks have their own r3sdk tests)."""
    from fsguard.windows import win32tasks
    from netguard.windows import win32wfp
    from tests.support import winsdk

    mods = winsdk.windows_modules(("launcher", "netguard", "fsguard", "sgbase"))
    calling = {m.__name__ for m in mods if 'fn("' in Path(m.__file__ or "").read_text(encoding="utf-8")}
    driven = {m.__name__ for m in (*MODULES, win32wfp, win32tasks, realowner, realapi, win32calls)}
    assert calling - driven == set()  # win32calls: its docstring names fn("...")


def test_a_32_bit_python_is_refused_before_any_call(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """r3-sdk H1: the layouts (ULONG_PTR as c_uint64, VARIANT's 24 bytes) and the SDK check are x64's; on a
    32-bit Python they would marshal wrong, so no call is made there, and the refusal is one line."""
    import sys

    # the loader itself, not the unit step's recorder (tests/support/winreach.py) if that wraps it
    real_fn = getattr(sys.modules.get("tests.support.winreach"), "_real_fn", win32.fn)
    monkeypatch.setattr(win32, "fn", real_fn)
    loaded: list[str] = []

    def load(dll: str, use_last_error: bool) -> Any:
        loaded.append(dll)
        return types.SimpleNamespace(CloseHandle=types.SimpleNamespace())

    monkeypatch.setattr(ctypes, "WinDLL", load, raising=False)
    monkeypatch.setattr(win32, "POINTER_SIZE", 4)
    with pytest.raises(win32.Win32Error, match="needs a 64-bit Python"):
        win32.fn("CloseHandle")
    with pytest.raises(WinApiError, match="needs a 64-bit Python"):  # through the real API: one line
        realapi.RealWinApi().pid_alive(42)
    assert loaded == []
    monkeypatch.setattr(win32, "POINTER_SIZE", 8)  # control: on x64 the DLL is loaded and the prototype set
    f = win32.fn("CloseHandle")
    assert loaded == ["kernel32"] and f.argtypes == [ctypes.c_void_p] and f.restype is ctypes.c_int32


def test_a_job_whose_limits_are_refused_is_closed_not_left_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r3-sdk S1: SetInformationJobObject refused -> the job handle closed, the refusal's own error raised."""
    calls = _trace(next(c for c in CASES if c.name == "make_job"), tmp_path, monkeypatch).calls
    dlls = winmarshal.Dlls(fail_at=calls.index("SetInformationJobObject"))
    _install(monkeypatch, dlls)
    with pytest.raises(OSError) as e:
        win32job.make_job(job.plan_job())
    assert e.value.errno == winmarshal.DENIED and dlls.calls[-1] == "CloseHandle"


def test_a_process_whose_exit_code_cannot_be_read_counts_as_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r3-sdk S3: unknown is alive, so a live run's journal is never replayed on a failed read."""
    dlls = winmarshal.Dlls(fail_at=1)  # OpenProcess succeeds, GetExitCodeProcess fails
    _install(monkeypatch, dlls)
    assert win32.pid_alive(42) is True and dlls.calls[:2] == ["OpenProcess", "GetExitCodeProcess"]
