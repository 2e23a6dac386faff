"""The teardown sweep's process calls as the sandbox user (sweep.py decides; this only marshals).

LogonUserW (interactive: the one logon the sandbox user is not denied) gives a token that
sandgate's own threads impersonate; the process is never the sandbox user's, so no survivor can
open it. Each call that needs the sandbox user's rights runs in a short thread of its own that
impersonates and ends: the impersonation "lasts until the thread exits or until it calls
RevertToSelf" (ImpersonateLoggedOnUser docs), so no other sandgate thread ever runs as that user.
A process is opened with terminate + limited query + synchronize; its token user is read through
that handle and the same handle terminates it, so a reused pid cannot be hit by mistake.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from ctypes import Structure, c_int32, c_uint32, c_void_p, c_wchar

from sgbase.windows.win32 import Win32Error, check, close, fn

LOGON32_LOGON_INTERACTIVE, LOGON32_PROVIDER_DEFAULT = 2, 0
TH32CS_SNAPPROCESS = 0x2
PROCESS_TERMINATE, PROCESS_QUERY_LIMITED_INFORMATION, SYNCHRONIZE = 0x0001, 0x1000, 0x00100000
TOKEN_QUERY = 0x0008
INFO_TOKEN_USER = 1  # TOKEN_INFORMATION_CLASS TokenUser
STILL_ACTIVE = 259
ERROR_NO_MORE_FILES = 18
EXIT_WAIT_MS = 2000  # TerminateProcess is asynchronous: the next round must not see it again
SWEPT_EXIT = 1  # the exit code the ended processes get
_INVALID_HANDLE = (1 << 64) - 1  # INVALID_HANDLE_VALUE as c_void_p reads it


class PROCESSENTRY32W(Structure):
    _fields_ = [
        ("dwSize", c_uint32),
        ("cntUsage", c_uint32),
        ("th32ProcessID", c_uint32),
        ("th32DefaultHeapID", c_void_p),
        ("th32ModuleID", c_uint32),
        ("cntThreads", c_uint32),
        ("th32ParentProcessID", c_uint32),
        ("pcPriClassBase", c_int32),
        ("dwFlags", c_uint32),
        ("szExeFile", c_wchar * 260),
    ]


class SID_AND_ATTRIBUTES(Structure):
    _fields_ = [("Sid", c_void_p), ("Attributes", c_uint32)]


def logon(user: str, password: str) -> int:
    """The sandbox user's primary token (LogonUserW, interactive, the local account)."""
    token = c_void_p()
    ok = fn("LogonUserW")(user, ".", password, LOGON32_LOGON_INTERACTIVE, LOGON32_PROVIDER_DEFAULT, ctypes.byref(token))
    check("LogonUserW", ok)
    return int(token.value or 0)


def as_user[T](token: int, work: Callable[[], T]) -> T:
    """`work()` in a thread of its own impersonating `token`; its result, or its exception."""
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            check("ImpersonateLoggedOnUser", fn("ImpersonateLoggedOnUser")(token))
            out.append(work())
        except BaseException as e:  # carried to the caller's thread
            err.append(e)
        finally:
            fn("RevertToSelf")()  # the thread ends next anyway

    t = threading.Thread(target=run, name="sandgate-sweep", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def pids() -> list[int]:
    """Every process id on the machine (a snapshot: "all users have read access to the list")."""
    snap = fn("CreateToolhelp32Snapshot")(TH32CS_SNAPPROCESS, 0)
    if not snap or snap == _INVALID_HANDLE:
        check("CreateToolhelp32Snapshot", False)
    try:
        entry = PROCESSENTRY32W()
        entry.dwSize = ctypes.sizeof(entry)
        found: list[int] = []
        ok = fn("Process32FirstW")(snap, ctypes.byref(entry))
        while ok:
            found.append(int(entry.th32ProcessID))
            ok = fn("Process32NextW")(snap, ctypes.byref(entry))
        if ctypes.get_last_error() not in (0, ERROR_NO_MORE_FILES):  # type: ignore[attr-defined,unused-ignore]
            check("Process32NextW", False)
        return found
    finally:
        close(snap)


def open_process(pid: int) -> tuple[int, str] | None:
    """(handle, token user SID) of a live process the calling (impersonating) thread may end;
    None when refused (another user's), gone, or already exited."""
    h = fn("OpenProcess")(PROCESS_TERMINATE | PROCESS_QUERY_LIMITED_INFORMATION | SYNCHRONIZE, False, pid)
    if not h:
        return None
    user = None
    try:
        code = c_uint32()
        if fn("GetExitCodeProcess")(h, ctypes.byref(code)) and code.value == STILL_ACTIVE:
            user = token_user(h)
    except Win32Error:
        pass  # a token this user may not query (its DACL names its own user): not known to be ours (win-acl A6)
    finally:
        if user is None:
            close(h)
    return None if user is None else (int(h), user)


def token_user(process: int) -> str:
    """The SID of the user `process` (a handle with at least limited query access) runs as."""
    token = c_void_p()
    check("OpenProcessToken", fn("OpenProcessToken")(process, TOKEN_QUERY, ctypes.byref(token)))
    try:
        size = c_uint32()
        fn("GetTokenInformation")(token, INFO_TOKEN_USER, None, 0, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value or 64)
        ok = fn("GetTokenInformation")(token, INFO_TOKEN_USER, buf, ctypes.sizeof(buf), ctypes.byref(size))
        check("GetTokenInformation", ok)
        user = SID_AND_ATTRIBUTES.from_buffer(buf)  # TOKEN_USER is one SID_AND_ATTRIBUTES
        return _sid_text(user.Sid)
    finally:
        close(int(token.value or 0))


def _sid_text(psid: int | None) -> str:
    from ctypes import c_wchar_p

    text = c_wchar_p()
    check("ConvertSidToStringSidW", fn("ConvertSidToStringSidW")(psid, ctypes.byref(text)))
    try:
        return text.value or ""
    finally:
        fn("LocalFree")(text)


def terminate(handle: int) -> None:
    """End the process and wait briefly for it to be gone (TerminateProcess only starts it)."""
    check("TerminateProcess", fn("TerminateProcess")(handle, SWEPT_EXIT))
    if fn("WaitForSingleObject")(handle, EXIT_WAIT_MS) != 0:
        raise Win32Error(1460, "the process did not exit after TerminateProcess")  # ERROR_TIMEOUT


__all__ = ["as_user", "close", "logon", "open_process", "pids", "terminate", "token_user"]
