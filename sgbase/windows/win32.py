"""The one module that calls Windows: thin ctypes bindings, each to the documented function.

Nothing here runs at import (it imports on Linux, where the unit tests check the table); the DLL
is loaded on the first call. Every plan it applies was computed and checked by the pure modules
(job.check_job, wfp.plan_filters, acl.plan_acls), so this file holds no decision, only calls.
Each binding names the Microsoft documentation page it follows; .github/workflows/windows.yml is
where they run. CMD's own start, wait and desktop are in win32proc.py. Status: the job, process,
DPAPI and security-descriptor wrappers are written
(never run); the WFP structures are laid out in win32wfp.py (apart only for the size limit),
also never run.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_int32, c_uint16, c_uint32, c_void_p, c_wchar_p
from typing import Any

from sgbase.windows.win32calls import BY_NAME as BY_NAME
from sgbase.windows.win32calls import CALLS as CALLS
from sgbase.windows.win32calls import DOCS as DOCS

HANDLE, DWORD, BOOL, LPVOID = c_void_p, c_uint32, c_int32, c_void_p
#: c_uint64 stands for ULONG_PTR and VARIANT is laid out 24 bytes: right on x64 only (r3-sdk H1)
POINTER_SIZE = ctypes.sizeof(c_void_p)


SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, SDDL_REVISION_1 = 1, 0x4, 1
CRYPTPROTECT_UI_FORBIDDEN = 0x1


class Win32Error(OSError):
    """A failed call, with the function's name and Windows' error code."""


def fn(name: str) -> Any:
    """The bound function, loading its DLL on first use (so this module imports on Linux)."""
    call = BY_NAME[name]
    loader = getattr(ctypes, "WinDLL", None)
    if loader is None:
        raise Win32Error(f"{name}: not on Windows")
    if POINTER_SIZE != 8:  # every layout here is x64's (checked against the SDK as x64): never marshal x86
        raise Win32Error(f"{name}: sandgate on Windows needs a 64-bit Python (this one is 32-bit)")
    f = getattr(loader(call.dll, use_last_error=True), name)
    f.argtypes, f.restype = list(call.argtypes), call.restype
    return f


def check(name: str, ok: object) -> None:
    if not ok:
        err = getattr(ctypes, "get_last_error", lambda: 0)()
        raise Win32Error(err, f"{name} failed (error {err}); see {BY_NAME[name].doc}")


class STARTUPINFOW(Structure):
    _fields_ = [
        ("cb", DWORD),
        ("lpReserved", c_wchar_p),
        ("lpDesktop", c_wchar_p),
        ("lpTitle", c_wchar_p),
        *(
            (n, DWORD)
            for n in (
                "dwX",
                "dwY",
                "dwXSize",
                "dwYSize",
                "dwXCountChars",
                "dwYCountChars",
                "dwFillAttribute",
                "dwFlags",
            )
        ),
        ("wShowWindow", c_uint16),
        ("cbReserved2", c_uint16),
        ("lpReserved2", LPVOID),
        ("hStdInput", HANDLE),
        ("hStdOutput", HANDLE),
        ("hStdError", HANDLE),
    ]


class PROCESS_INFORMATION(Structure):
    _fields_ = [("hProcess", HANDLE), ("hThread", HANDLE), ("dwProcessId", DWORD), ("dwThreadId", DWORD)]


def resume(thread: int) -> None:
    if fn("ResumeThread")(thread) == 0xFFFFFFFF:  # (DWORD)-1: the thread stays suspended
        check("ResumeThread", False)


def terminate(process: int, code: int = 1) -> None:
    check("TerminateProcess", fn("TerminateProcess")(process, code))


def close(handle: int) -> None:
    if handle:
        fn("CloseHandle")(handle)


class DATA_BLOB(Structure):
    _fields_ = [("cbData", DWORD), ("pbData", POINTER(ctypes.c_char))]


def _dpapi(name: str, data: bytes) -> bytes:
    """CryptProtectData / CryptUnprotectData in user scope: only the real user, on this machine,
    can read the sandbox user's password back (CRYPTPROTECT_UI_FORBIDDEN: never a prompt)."""
    buf = ctypes.create_string_buffer(data, len(data))
    blob_in, blob_out = DATA_BLOB(len(data), ctypes.cast(buf, POINTER(ctypes.c_char))), DATA_BLOB()
    args = (ctypes.byref(blob_in), None, None, None, None, CRYPTPROTECT_UI_FORBIDDEN, ctypes.byref(blob_out))
    check(name, fn(name)(*args))
    try:
        return ctypes.string_at(blob_out.pbData, blob_out.cbData)
    finally:
        fn("LocalFree")(blob_out.pbData)


def protect(secret: bytes) -> bytes:
    return _dpapi("CryptProtectData", secret)


def unprotect(sealed: bytes) -> bytes:
    return _dpapi("CryptUnprotectData", sealed)


def dacl_sddl(path: str) -> str:
    """A path's DACL as SDDL (what the journal records before anything changes)."""
    sd = LPVOID()
    err = fn("GetNamedSecurityInfoW")(
        path, SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, None, None, None, None, ctypes.byref(sd)
    )
    if err:
        raise Win32Error(err, f"GetNamedSecurityInfoW({path!r}) failed (error {err})")
    try:
        text = c_wchar_p()
        ok = fn("ConvertSecurityDescriptorToStringSecurityDescriptorW")(
            sd, SDDL_REVISION_1, DACL_SECURITY_INFORMATION, ctypes.byref(text), None
        )
        check("ConvertSecurityDescriptorToStringSecurityDescriptorW", ok)
        value = text.value or ""
        fn("LocalFree")(text)
        return value
    finally:
        fn("LocalFree")(sd)


def set_dacl_sddl(path: str, sddl: str, walk: bool = True) -> None:
    r"""Set a path's DACL from SDDL (applying a plan, restoring a journal entry). `walk`: with
    SetNamedSecurityInfoW, which "imposes the current inheritance model on the ACLs of all objects in
    the hierarchy below the target object" (learn.microsoft.com/windows/win32/secauthz/automatic-
    propagation-of-inheritable-aces): a tree's worth of writes. Without: SetFileSecurityW, this object
    only, for a DACL whose inheritable ACEs do not change (sddl.same_inheritable), where the walk
    would rewrite every object below for nothing (the guard on C:\hostedtoolcache: the whole cache)."""
    sd, present, dacl, defaulted = LPVOID(), BOOL(), LPVOID(), BOOL()
    ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(sddl, SDDL_REVISION_1, ctypes.byref(sd), None)
    check("ConvertStringSecurityDescriptorToSecurityDescriptorW", ok)
    try:
        if not walk:
            check("SetFileSecurityW", fn("SetFileSecurityW")(path, DACL_SECURITY_INFORMATION, sd))
            return
        ok = fn("GetSecurityDescriptorDacl")(sd, ctypes.byref(present), ctypes.byref(dacl), ctypes.byref(defaulted))
        check("GetSecurityDescriptorDacl", ok)
        err = fn("SetNamedSecurityInfoW")(path, SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, None, None, dacl, None)
        if err:
            raise Win32Error(err, f"SetNamedSecurityInfoW({path!r}) failed (error {err})")
    finally:
        fn("LocalFree")(sd)


# ---- the sandbox user: accounts, SIDs, elevation (sandgate setup) ------------------------------

NERR_SUCCESS, NERR_USER_NOT_FOUND, ERROR_NONE_MAPPED, ERROR_ACCESS_DENIED = 0, 2221, 1332, 5
USER_PRIV_USER = 1
# UF_SCRIPT (required) | UF_PASSWD_CANT_CHANGE | UF_DONT_EXPIRE_PASSWD: a password only sandgate knows
UF_FLAGS = 0x0001 | 0x0040 | 0x10000
PROCESS_QUERY_LIMITED_INFORMATION, STILL_ACTIVE = 0x1000, 259


class USER_INFO_1(Structure):
    _fields_ = [
        ("usri1_name", c_wchar_p),
        ("usri1_password", c_wchar_p),
        ("usri1_password_age", DWORD),
        ("usri1_priv", DWORD),
        ("usri1_home_dir", c_wchar_p),
        ("usri1_comment", c_wchar_p),
        ("usri1_flags", DWORD),
        ("usri1_script_path", c_wchar_p),
    ]


class USER_INFO_1003(Structure):
    _fields_ = [("usri1003_password", c_wchar_p)]


def _net(name: str, err: int) -> None:
    if err != NERR_SUCCESS:
        raise Win32Error(err, f"{name} failed (error {err}); see {BY_NAME[name].doc}")


def is_admin() -> bool:
    return bool(fn("IsUserAnAdmin")())


def account_sid(name: str) -> str | None:
    """The SID of a local account as text (S-1-5-21-...); None: no such account."""
    size, dom_size, use = DWORD(0), DWORD(0), DWORD(0)
    fn("LookupAccountNameW")(None, name, None, ctypes.byref(size), None, ctypes.byref(dom_size), ctypes.byref(use))
    if not size.value:
        err = getattr(ctypes, "get_last_error", lambda: 0)()
        if err == ERROR_NONE_MAPPED:
            return None
        raise Win32Error(err, f"LookupAccountNameW({name!r}) failed (error {err})")
    sid, dom = ctypes.create_string_buffer(size.value), ctypes.create_unicode_buffer(dom_size.value)
    ok = fn("LookupAccountNameW")(None, name, sid, ctypes.byref(size), dom, ctypes.byref(dom_size), ctypes.byref(use))
    check("LookupAccountNameW", ok)
    text = c_wchar_p()
    check("ConvertSidToStringSidW", fn("ConvertSidToStringSidW")(sid, ctypes.byref(text)))
    try:
        return text.value or None
    finally:
        fn("LocalFree")(text)


def add_user(name: str, password: str) -> None:
    """A local standard user (USER_PRIV_USER): no administrator rights, a password it cannot change."""
    info = USER_INFO_1(name, password, 0, USER_PRIV_USER, None, "sandgate sandbox user (sandgate setup)", UF_FLAGS)
    _net("NetUserAdd", fn("NetUserAdd")(None, 1, ctypes.byref(info), None))


def set_password(name: str, password: str) -> None:
    info = USER_INFO_1003(password)
    _net("NetUserSetInfo", fn("NetUserSetInfo")(None, name, 1003, ctypes.byref(info), None))


def delete_user(name: str) -> None:
    err = fn("NetUserDel")(None, name)
    if err not in (NERR_SUCCESS, NERR_USER_NOT_FOUND):  # already gone is what --remove wants
        _net("NetUserDel", err)


def pid_alive(pid: int) -> bool:
    """Is a process with this id running (a journal's run still alive: never replay it)?"""
    h = fn("OpenProcess")(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not h:
        return getattr(ctypes, "get_last_error", lambda: 0)() == ERROR_ACCESS_DENIED  # exists, not ours
    try:
        code = DWORD()
        if not fn("GetExitCodeProcess")(h, ctypes.byref(code)):
            return True  # unknown is alive: a live run's journal must never be replayed (r3-sdk S3)
        return code.value == STILL_ACTIVE
    finally:
        fn("CloseHandle")(h)
