"""A DLL-level fake for every binding module: each call through ctypes' own argument conversion first.

`Dlls.fn` replaces sgbase.windows.win32.fn (and the name each binding module imported). Every call:
1. its arguments go through a ctypes prototype of the call table's entry (argtypes, restype), so a
   wrong pointer type, a str for a buffer, a Structure passed without byref raise ArgumentError as
   on Windows; each integer must fit its declared width (ctypes truncates silently: a 64-bit HANDLE
   through a c_int32 would lose its upper half, so every handle this fake makes is above 2**32);
2. what a byref or an array points at is recorded (winsdkcalls.Passed), for the compiled pointee check;
3. it answers by the call's documented convention (CONVENTIONS): success, or, for the call numbered
   `fail_at`, the documented failure value with GetLastError 5 (ERROR_ACCESS_DENIED) where the
   convention reads it there, the error itself where the result is the status (STATUS 5, HRESULT
   E_ACCESSDENIED, NTSTATUS STATUS_ACCESS_DENIED that LsaNtStatusToWinError maps to 5).
Output parameters a wrapper reads are filled as the page says (`_fill`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sgbase.windows import win32calls
from tests.support import winsdkcalls

B, H, S, V, N, R, F, X = "BOOL", "HANDLE", "STATUS", "VOID", "NTSTATUS", "HRESULT", "FREED", "VALUE"
#: How the product reads each call's result (winsdkcalls.TYPES); a new call needs its line here.
CONVENTIONS = {
    "CreateJobObjectW": H, "SetInformationJobObject": B, "AssignProcessToJobObject": B, "IsProcessInJob": B,
    "QueryInformationJobObject": B, "OpenProcess": H, "ResumeThread": X, "TerminateProcess": B,
    "TerminateJobObject": B, "WaitForSingleObject": X, "GetExitCodeProcess": B, "CloseHandle": B, "LocalFree": F,
    "CreateProcessWithLogonW": B, "CryptProtectData": B, "CryptUnprotectData": B,
    "GetNamedSecurityInfoW": S, "SetNamedSecurityInfoW": S, "SetFileSecurityW": B,
    "ConvertSecurityDescriptorToStringSecurityDescriptorW": B,
    "ConvertStringSecurityDescriptorToSecurityDescriptorW": B, "GetSecurityDescriptorDacl": B,
    "FwpmEngineOpen0": S, "FwpmTransactionBegin0": S, "FwpmTransactionCommit0": S, "FwpmFilterAdd0": S,
    "FwpmTransactionAbort0": S, "FwpmProviderAdd0": S, "FwpmSubLayerAdd0": S, "FwpmSubLayerDeleteByKey0": S,
    "FwpmProviderDeleteByKey0": S, "FwpmFilterDeleteByKey0": S, "FwpmEngineClose0": S,
    "NetUserAdd": S, "NetUserDel": S, "NetUserSetInfo": S,
    "LsaOpenPolicy": N, "LsaAddAccountRights": N, "LsaRemoveAccountRights": N, "LsaClose": N,
    "LsaNtStatusToWinError": X, "ConvertStringSidToSidW": B, "WTSQuerySessionInformationW": B, "WTSFreeMemory": V,
    "DeleteProfileW": B, "LookupAccountNameW": B, "ConvertSidToStringSidW": B, "IsUserAnAdmin": B,
    "FwpmFilterGetByKey0": S, "FwpmFreeMemory0": V, "FwpmFilterGetSecurityInfoByKey0": S,
    "CreatePipe": B, "SetHandleInformation": B, "CreateWindowStationW": H, "GetProcessWindowStation": H,
    "SetProcessWindowStation": B, "CreateDesktopW": H, "CloseDesktop": B, "CloseWindowStation": B,
    "LogonUserW": B, "ImpersonateLoggedOnUser": B, "RevertToSelf": B, "OpenProcessToken": B,
    "GetTokenInformation": B, "CreateToolhelp32Snapshot": H, "Process32FirstW": B, "Process32NextW": B,
    "CoInitializeEx": R, "CoUninitialize": V, "CoCreateInstance": R, "SysAllocString": H, "SysFreeString": V,
    "LookupPrivilegeValueW": B, "AdjustTokenPrivileges": B, "GetCurrentProcess": H,
    "GetUserObjectInformationW": B, "GetSecurityInfo": S, "SetSecurityInfo": S,
    "OpenWindowStationW": H, "OpenDesktopW": H, "GetThreadDesktop": H,
}  # fmt: skip
DENIED = 5
E_ACCESSDENIED = -0x7FF8FFFB  # 0x80070005 as the HRESULT (a LONG) ctypes returns
STATUS_ACCESS_DENIED = 0xC0000022
ERROR_INSUFFICIENT_BUFFER, ERROR_NO_MORE_FILES = 122, 18
INVALID_HANDLE_VALUE = (1 << 64) - 1
SID = "S-1-5-21-1-2-3-1001"
_KEEP: list[Any] = []  # buffers handed out as "Windows-allocated" memory, alive for the test run


def _integer(t: Any) -> bool:
    return isinstance(getattr(t, "_type_", None), str) and t._type_ in "bBhHiIlLqQ"


@dataclass
class Dlls:
    fail_at: int | None = None
    calls: list[str] = field(default_factory=list)
    passed: list[winsdkcalls.Passed] = field(default_factory=list)
    last_error: int = 0
    _handle: int = 1 << 32

    def fn(self, name: str) -> Callable[..., Any]:
        call = win32calls.BY_NAME[name]
        proto = ctypes.CFUNCTYPE(call.restype, *call.argtypes)(lambda *_: None if call.restype is None else 0)

        def run(*args: Any) -> Any:
            proto(*args)  # ctypes' own conversion: a wrong type raises ctypes.ArgumentError
            for i, (t, v) in enumerate(zip(call.argtypes, args, strict=True)):
                if _integer(t) and isinstance(v, int):
                    assert winsdkcalls.int_fits(t, v), f"{name}: argument {i + 1} = {v:#x} does not fit {t.__name__}"
            self.passed += winsdkcalls.passed(name, args)
            index = len(self.calls)
            self.calls.append(name)
            if index == self.fail_at:
                return self._failure(name)
            self.last_error = 0
            return self._success(name, args)

        return run

    def get_last_error(self) -> int:
        return self.last_error

    def _failure(self, name: str) -> Any:
        conv = CONVENTIONS[name]
        self.last_error = DENIED
        if name == "CreateToolhelp32Snapshot":
            return INVALID_HANDLE_VALUE  # its documented failure value
        return {B: 0, H: None, S: DENIED, R: E_ACCESSDENIED, N: STATUS_ACCESS_DENIED, X: 0xFFFFFFFF}.get(conv)

    def _success(self, name: str, args: tuple[Any, ...]) -> Any:
        conv = CONVENTIONS[name]
        fill = _FILL.get(name)
        if fill is not None:
            got = fill(self, args)
            if got is not None:
                return got
        if conv == H:
            self._handle += 8
            return self._handle
        if name == "LsaNtStatusToWinError":
            return DENIED if args[0] == STATUS_ACCESS_DENIED else 317  # ERROR_MR_MID_NOT_FOUND
        return {B: 1, S: 0, R: 0, N: 0, X: 0}.get(conv)


def _out(arg: Any) -> Any:
    return arg._obj  # what byref(x) points at


def _text(arg: Any, value: str) -> None:
    buf = ctypes.create_unicode_buffer(value)
    _KEEP.append(buf)
    _out(arg).value = ctypes.cast(buf, ctypes.c_void_p).value


def _sizing(d: Dlls, sized: Any, size: int) -> int | None:
    """The documented first call with no buffer: FALSE, ERROR_INSUFFICIENT_BUFFER, the size needed."""
    _out(sized).value = size
    d.last_error = ERROR_INSUFFICIENT_BUFFER
    return 0


def _account(d: Dlls, a: tuple[Any, ...]) -> int | None:
    if a[2] is None:
        _out(a[5]).value = 8
        return _sizing(d, a[3], 28)
    return None


def _token(d: Dlls, a: tuple[Any, ...]) -> int | None:
    return _sizing(d, a[4], 16) if a[2] is None else None


def _blob(d: Dlls, a: tuple[Any, ...]) -> None:
    buf = ctypes.create_string_buffer(b"sealed", 6)
    _KEEP.append(buf)
    blob = _out(a[6])
    blob.cbData, blob.pbData = 6, ctypes.cast(buf, type(blob.pbData))


def _name(d: Dlls, a: tuple[Any, ...]) -> None:
    a[2].value = "Service-0x0-3e7$"


def _more(d: Dlls, a: tuple[Any, ...]) -> int:
    d.last_error = ERROR_NO_MORE_FILES  # the end of the snapshot: FALSE, ERROR_NO_MORE_FILES
    return 0


def _sid_text(d: Dlls, a: tuple[Any, ...]) -> None:
    _text(a[1], SID)


def _sd_text(d: Dlls, a: tuple[Any, ...]) -> None:
    _text(a[3], "D:(A;;GA;;;WD)" if a[2] == 4 else "O:BAD:(A;;GA;;;WD)")  # only what SecurityInformation asked


def _exit_code(d: Dlls, a: tuple[Any, ...]) -> None:
    _out(a[1]).value = 259  # STILL_ACTIVE


def _session(d: Dlls, a: tuple[Any, ...]) -> None:
    _text(a[3], "user")


def _sd(d: Dlls, a: tuple[Any, ...]) -> None:
    """A LocalAlloc'd self-relative descriptor and, when asked, its size."""
    buf = ctypes.create_string_buffer(20)
    _KEEP.append(buf)
    _out(a[2]).value = ctypes.addressof(buf)
    if a[3] is not None:
        _out(a[3]).value = 20


_FILL: dict[str, Callable[[Dlls, tuple[Any, ...]], Any]] = {
    "LookupAccountNameW": _account,
    "GetTokenInformation": _token,
    "CryptProtectData": _blob,
    "CryptUnprotectData": _blob,
    "GetUserObjectInformationW": _name,
    "Process32NextW": _more,
    "ConvertSidToStringSidW": _sid_text,
    "ConvertSecurityDescriptorToStringSecurityDescriptorW": _sd_text,
    "GetExitCodeProcess": _exit_code,
    "WTSQuerySessionInformationW": _session,
    "ConvertStringSecurityDescriptorToSecurityDescriptorW": _sd,
}
