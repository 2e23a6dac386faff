"""The one module that calls Windows: thin ctypes bindings, each to the documented function.

Nothing here runs at import (it imports on Linux, where the unit tests check the table); the DLL
is loaded on the first call. Every plan it applies was computed and checked by the pure modules
(job.check_job, wfp.plan_filters, acl.plan_acls), so this file holds no decision, only calls.
Each binding names the Microsoft documentation page it follows; .github/workflows/windows.yml is
where they run. Status: the job, process, DPAPI and security-descriptor wrappers are written
(never run); the WFP structures are laid out in win32wfp.py (apart only for the size limit),
also never run.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from ctypes import POINTER, Structure, c_int32, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p, c_wchar_p
from dataclasses import dataclass
from typing import Any

from launcher.platform.windows import envblock, job

DOCS = "https://learn.microsoft.com/en-us/windows/win32/api/"


@dataclass(frozen=True)
class Call:
    dll: str
    name: str
    doc: str  # the page this binding follows
    argtypes: tuple[Any, ...]
    restype: Any


HANDLE, DWORD, BOOL, LPVOID = c_void_p, c_uint32, c_int32, c_void_p
CALLS: tuple[Call, ...] = (
    # the job object: the tree dies with sandgate and cannot leave
    Call("kernel32", "CreateJobObjectW", DOCS + "jobapi2/nf-jobapi2-createjobobjectw", (LPVOID, c_wchar_p), HANDLE),
    Call(
        "kernel32",
        "SetInformationJobObject",
        DOCS + "jobapi2/nf-jobapi2-setinformationjobobject",
        (HANDLE, c_int32, LPVOID, DWORD),
        BOOL,
    ),
    Call(
        "kernel32",
        "AssignProcessToJobObject",
        DOCS + "jobapi2/nf-jobapi2-assignprocesstojobobject",
        (HANDLE, HANDLE),
        BOOL,
    ),
    Call("kernel32", "IsProcessInJob", DOCS + "jobapi/nf-jobapi-isprocessinjob", (HANDLE, HANDLE, POINTER(BOOL)), BOOL),
    Call(
        "kernel32",
        "QueryInformationJobObject",
        DOCS + "jobapi2/nf-jobapi2-queryinformationjobobject",
        (HANDLE, c_int32, LPVOID, DWORD, POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "kernel32",
        "OpenProcess",
        DOCS + "processthreadsapi/nf-processthreadsapi-openprocess",
        (DWORD, BOOL, DWORD),
        HANDLE,
    ),
    Call("kernel32", "ResumeThread", DOCS + "processthreadsapi/nf-processthreadsapi-resumethread", (HANDLE,), DWORD),
    Call(
        "kernel32",
        "TerminateProcess",
        DOCS + "processthreadsapi/nf-processthreadsapi-terminateprocess",
        (HANDLE, c_uint32),
        BOOL,
    ),
    Call("kernel32", "TerminateJobObject", DOCS + "jobapi2/nf-jobapi2-terminatejobobject", (HANDLE, c_uint32), BOOL),
    Call("kernel32", "WaitForSingleObject", DOCS + "synchapi/nf-synchapi-waitforsingleobject", (HANDLE, DWORD), DWORD),
    Call(
        "kernel32",
        "GetExitCodeProcess",
        DOCS + "processthreadsapi/nf-processthreadsapi-getexitcodeprocess",
        (HANDLE, POINTER(DWORD)),
        BOOL,
    ),
    Call("kernel32", "CloseHandle", DOCS + "handleapi/nf-handleapi-closehandle", (HANDLE,), BOOL),
    Call("kernel32", "LocalFree", DOCS + "winbase/nf-winbase-localfree", (LPVOID,), LPVOID),
    # the sandbox user's process, started suspended
    Call(
        "advapi32",
        "CreateProcessWithLogonW",
        DOCS + "winbase/nf-winbase-createprocesswithlogonw",
        (c_wchar_p, c_wchar_p, c_wchar_p, DWORD, c_wchar_p, c_wchar_p, DWORD, LPVOID, c_wchar_p, LPVOID, LPVOID),
        BOOL,
    ),
    # the sandbox user's password, readable only by the real user on this machine (DPAPI)
    Call(
        "crypt32",
        "CryptProtectData",
        DOCS + "dpapi/nf-dpapi-cryptprotectdata",
        (LPVOID, c_wchar_p, LPVOID, LPVOID, LPVOID, DWORD, LPVOID),
        BOOL,
    ),
    Call(
        "crypt32",
        "CryptUnprotectData",
        DOCS + "dpapi/nf-dpapi-cryptunprotectdata",
        (LPVOID, LPVOID, LPVOID, LPVOID, LPVOID, DWORD, LPVOID),
        BOOL,
    ),
    # DACLs: read (to journal), write (to apply and restore)
    Call(
        "advapi32",
        "GetNamedSecurityInfoW",
        DOCS + "aclapi/nf-aclapi-getnamedsecurityinfow",
        (c_wchar_p, c_int32, DWORD, LPVOID, LPVOID, LPVOID, LPVOID, LPVOID),
        DWORD,
    ),
    Call(
        "advapi32",
        "SetNamedSecurityInfoW",
        DOCS + "aclapi/nf-aclapi-setnamedsecurityinfow",
        (c_wchar_p, c_int32, DWORD, LPVOID, LPVOID, LPVOID, LPVOID),
        DWORD,
    ),
    Call(
        "advapi32",
        "ConvertSecurityDescriptorToStringSecurityDescriptorW",
        DOCS + "sddl/nf-sddl-convertsecuritydescriptortostringsecuritydescriptorw",
        (LPVOID, DWORD, DWORD, POINTER(c_wchar_p), POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "advapi32",
        "ConvertStringSecurityDescriptorToSecurityDescriptorW",
        DOCS + "sddl/nf-sddl-convertstringsecuritydescriptortosecuritydescriptorw",
        (c_wchar_p, DWORD, POINTER(LPVOID), POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "advapi32",
        "GetSecurityDescriptorDacl",
        DOCS + "securitybaseapi/nf-securitybaseapi-getsecuritydescriptordacl",
        (LPVOID, POINTER(BOOL), POINTER(LPVOID), POINTER(BOOL)),
        BOOL,
    ),
    # WFP: persistent filters (setup) and the redirect loop's dynamic session
    Call(
        "fwpuclnt",
        "FwpmEngineOpen0",
        DOCS + "fwpmu/nf-fwpmu-fwpmengineopen0",
        (c_wchar_p, DWORD, LPVOID, LPVOID, POINTER(HANDLE)),
        DWORD,
    ),
    Call("fwpuclnt", "FwpmTransactionBegin0", DOCS + "fwpmu/nf-fwpmu-fwpmtransactionbegin0", (HANDLE, DWORD), DWORD),
    Call("fwpuclnt", "FwpmTransactionCommit0", DOCS + "fwpmu/nf-fwpmu-fwpmtransactioncommit0", (HANDLE,), DWORD),
    Call(
        "fwpuclnt",
        "FwpmFilterAdd0",
        DOCS + "fwpmu/nf-fwpmu-fwpmfilteradd0",
        (HANDLE, LPVOID, LPVOID, POINTER(c_uint64)),
        DWORD,
    ),
    Call("fwpuclnt", "FwpmTransactionAbort0", DOCS + "fwpmu/nf-fwpmu-fwpmtransactionabort0", (HANDLE,), DWORD),
    Call("fwpuclnt", "FwpmProviderAdd0", DOCS + "fwpmu/nf-fwpmu-fwpmprovideradd0", (HANDLE, LPVOID, LPVOID), DWORD),
    Call("fwpuclnt", "FwpmSubLayerAdd0", DOCS + "fwpmu/nf-fwpmu-fwpmsublayeradd0", (HANDLE, LPVOID, LPVOID), DWORD),
    Call(
        "fwpuclnt",
        "FwpmSubLayerDeleteByKey0",
        DOCS + "fwpmu/nf-fwpmu-fwpmsublayerdeletebykey0",
        (HANDLE, LPVOID),
        DWORD,
    ),
    Call(
        "fwpuclnt",
        "FwpmProviderDeleteByKey0",
        DOCS + "fwpmu/nf-fwpmu-fwpmproviderdeletebykey0",
        (HANDLE, LPVOID),
        DWORD,
    ),
    Call("fwpuclnt", "FwpmFilterDeleteByKey0", DOCS + "fwpmu/nf-fwpmu-fwpmfilterdeletebykey0", (HANDLE, LPVOID), DWORD),
    Call("fwpuclnt", "FwpmEngineClose0", DOCS + "fwpmu/nf-fwpmu-fwpmengineclose0", (HANDLE,), DWORD),
)
BY_NAME = {c.name: c for c in CALLS}

JobObjectBasicUIRestrictions, JobObjectExtendedLimitInformation = 4, 9  # JOBOBJECTINFOCLASS
SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, SDDL_REVISION_1 = 1, 0x4, 1
INFINITE = 0xFFFFFFFF
CRYPTPROTECT_UI_FORBIDDEN = 0x1


class Win32Error(OSError):
    """A failed call, with the function's name and Windows' error code."""


def fn(name: str) -> Any:
    """The bound function, loading its DLL on first use (so this module imports on Linux)."""
    call = BY_NAME[name]
    loader = getattr(ctypes, "WinDLL", None)
    if loader is None:
        raise Win32Error(f"{name}: not on Windows")
    f = getattr(loader(call.dll, use_last_error=True), name)
    f.argtypes, f.restype = list(call.argtypes), call.restype
    return f


def _check(name: str, ok: object) -> None:
    if not ok:
        err = getattr(ctypes, "get_last_error", lambda: 0)()
        raise Win32Error(err, f"{name} failed (error {err}); see {BY_NAME[name].doc}")


class IO_COUNTERS(Structure):
    _fields_ = [(n, c_uint64) for n in ("r", "w", "o", "rb", "wb", "ob")]


class JOBOBJECT_BASIC_LIMIT_INFORMATION(Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", c_uint64),
        ("PerJobUserTimeLimit", c_uint64),
        ("LimitFlags", DWORD),
        ("MinimumWorkingSetSize", c_size_t),
        ("MaximumWorkingSetSize", c_size_t),
        ("ActiveProcessLimit", DWORD),
        ("Affinity", c_size_t),
        ("PriorityClass", DWORD),
        ("SchedulingClass", DWORD),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", c_size_t),
        ("JobMemoryLimit", c_size_t),
        ("PeakProcessMemoryUsed", c_size_t),
        ("PeakJobMemoryUsed", c_size_t),
    ]


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


def make_job(limits: job.JobLimits) -> int:
    """A job with the checked limits (kill on close, no breakaway) and UI restrictions set."""
    limits = job.check_job(limits)
    h = fn("CreateJobObjectW")(None, None)
    _check("CreateJobObjectW", h)
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    info.BasicLimitInformation.LimitFlags = limits.limit_flags
    info.BasicLimitInformation.ActiveProcessLimit = limits.active_process_limit
    ok = fn("SetInformationJobObject")(h, JobObjectExtendedLimitInformation, ctypes.byref(info), ctypes.sizeof(info))
    _check("SetInformationJobObject", ok)
    ui = DWORD(limits.ui_restrictions)
    _check(
        "SetInformationJobObject", fn("SetInformationJobObject")(h, JobObjectBasicUIRestrictions, ctypes.byref(ui), 4)
    )
    return int(h)


def start_suspended_in_job(
    user: str, password: str, cmdline: str, cwd: str, env: Mapping[str, str], job_handle: int
) -> PROCESS_INFORMATION:
    """CMD as the sandbox user, suspended; in the job; only then resumed (no instruction runs outside).
    If the job cannot take it, the process is terminated (it is already in no job of ours, so by
    its handle), never resumed."""
    plan, env_block = job.plan_create(), envblock.build(env)
    si, pi = STARTUPINFOW(), PROCESS_INFORMATION()
    si.cb = ctypes.sizeof(si)
    # lpCommandLine is [in, out] (the call may write to it): a buffer, never an immutable str;
    # the block holds NULs, so it goes as a buffer of its full length too.
    line = ctypes.create_unicode_buffer(cmdline)
    block = ctypes.create_unicode_buffer(env_block, len(env_block))
    args = (user, ".", password, plan.logon_flags, None, line, plan.creation_flags, block, cwd)
    _check("CreateProcessWithLogonW", fn("CreateProcessWithLogonW")(*args, ctypes.byref(si), ctypes.byref(pi)))
    try:
        _check("AssignProcessToJobObject", fn("AssignProcessToJobObject")(job_handle, pi.hProcess))
    except Win32Error:
        fn("TerminateProcess")(pi.hProcess, 1)
        raise
    fn("ResumeThread")(pi.hThread)
    return pi


class DATA_BLOB(Structure):
    _fields_ = [("cbData", DWORD), ("pbData", POINTER(ctypes.c_char))]


def _dpapi(name: str, data: bytes) -> bytes:
    """CryptProtectData / CryptUnprotectData in user scope: only the real user, on this machine,
    can read the sandbox user's password back (CRYPTPROTECT_UI_FORBIDDEN: never a prompt)."""
    buf = ctypes.create_string_buffer(data, len(data))
    blob_in, blob_out = DATA_BLOB(len(data), ctypes.cast(buf, POINTER(ctypes.c_char))), DATA_BLOB()
    args = (ctypes.byref(blob_in), None, None, None, None, CRYPTPROTECT_UI_FORBIDDEN, ctypes.byref(blob_out))
    _check(name, fn(name)(*args))
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
        _check("ConvertSecurityDescriptorToStringSecurityDescriptorW", ok)
        value = text.value or ""
        fn("LocalFree")(text)
        return value
    finally:
        fn("LocalFree")(sd)


def set_dacl_sddl(path: str, sddl: str) -> None:
    """Set a path's DACL from SDDL (applying a plan, restoring a journal entry)."""
    sd, present, dacl, defaulted = LPVOID(), BOOL(), LPVOID(), BOOL()
    ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(sddl, SDDL_REVISION_1, ctypes.byref(sd), None)
    _check("ConvertStringSecurityDescriptorToSecurityDescriptorW", ok)
    try:
        ok = fn("GetSecurityDescriptorDacl")(sd, ctypes.byref(present), ctypes.byref(dacl), ctypes.byref(defaulted))
        _check("GetSecurityDescriptorDacl", ok)
        err = fn("SetNamedSecurityInfoW")(path, SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, None, None, dacl, None)
        if err:
            raise Win32Error(err, f"SetNamedSecurityInfoW({path!r}) failed (error {err})")
    finally:
        fn("LocalFree")(sd)
