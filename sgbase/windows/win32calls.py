"""The table of every Windows function sandgate binds: DLL, name, argument types, documentation page.

Apart from win32.py for the 400-line limit. A test checks that every `fn("...")` call in the
binding modules names an entry here, so no call goes out without argtypes and its page; the
Windows CI resolves every entry in its DLL. Nothing here calls anything.
"""

from __future__ import annotations

from ctypes import POINTER, c_int32, c_uint8, c_uint32, c_uint64, c_void_p, c_wchar_p
from dataclasses import dataclass
from typing import Any

DOCS = "https://learn.microsoft.com/en-us/windows/win32/api/"


@dataclass(frozen=True)
class Call:
    dll: str
    name: str
    doc: str  # the page this binding follows
    argtypes: tuple[Any, ...]
    restype: Any


HANDLE, DWORD, BOOL, LPVOID = c_void_p, c_uint32, c_int32, c_void_p
SEC = DOCS + "securitybaseapi/"
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
    # the sandbox user (sandgate setup): accounts, SIDs, elevation
    Call(
        "netapi32",
        "NetUserAdd",
        DOCS + "lmaccess/nf-lmaccess-netuseradd",
        (c_wchar_p, DWORD, LPVOID, POINTER(DWORD)),
        DWORD,
    ),
    Call("netapi32", "NetUserDel", DOCS + "lmaccess/nf-lmaccess-netuserdel", (c_wchar_p, c_wchar_p), DWORD),
    # the sandbox user's logon rights: no batch/service/network/RDP logon (H3: scheduled tasks)
    Call(
        "advapi32",
        "LsaOpenPolicy",
        DOCS + "ntsecapi/nf-ntsecapi-lsaopenpolicy",
        (LPVOID, LPVOID, DWORD, POINTER(HANDLE)),
        DWORD,
    ),
    Call(
        "advapi32",
        "LsaAddAccountRights",
        DOCS + "ntsecapi/nf-ntsecapi-lsaaddaccountrights",
        (HANDLE, LPVOID, LPVOID, DWORD),
        DWORD,
    ),
    Call(
        "advapi32",
        "LsaRemoveAccountRights",
        DOCS + "ntsecapi/nf-ntsecapi-lsaremoveaccountrights",
        (HANDLE, LPVOID, c_uint8, LPVOID, DWORD),
        DWORD,
    ),
    Call("advapi32", "LsaClose", DOCS + "ntsecapi/nf-ntsecapi-lsaclose", (HANDLE,), DWORD),
    Call("advapi32", "LsaNtStatusToWinError", DOCS + "ntsecapi/nf-ntsecapi-lsantstatustowinerror", (DWORD,), DWORD),
    Call(
        "advapi32",
        "ConvertStringSidToSidW",
        DOCS + "sddl/nf-sddl-convertstringsidtosidw",
        (c_wchar_p, POINTER(LPVOID)),
        BOOL,
    ),
    # this terminal session's user (setup's check that it is not elevated as someone else, M13)
    Call(
        "wtsapi32",
        "WTSQuerySessionInformationW",
        DOCS + "wtsapi32/nf-wtsapi32-wtsquerysessioninformationw",
        (HANDLE, DWORD, c_int32, POINTER(c_wchar_p), POINTER(DWORD)),
        BOOL,
    ),
    Call("wtsapi32", "WTSFreeMemory", DOCS + "wtsapi32/nf-wtsapi32-wtsfreememory", (LPVOID,), None),
    # the sandbox user's profile, which NetUserDel leaves behind (M10)
    Call(
        "userenv",
        "DeleteProfileW",
        DOCS + "userenv/nf-userenv-deleteprofilew",
        (c_wchar_p, c_wchar_p, c_wchar_p),
        BOOL,
    ),
    Call(
        "netapi32",
        "NetUserSetInfo",
        DOCS + "lmaccess/nf-lmaccess-netusersetinfo",
        (c_wchar_p, c_wchar_p, DWORD, LPVOID, POINTER(DWORD)),
        DWORD,
    ),
    Call(
        "advapi32",
        "LookupAccountNameW",
        DOCS + "winbase/nf-winbase-lookupaccountnamew",
        (c_wchar_p, c_wchar_p, LPVOID, POINTER(DWORD), c_wchar_p, POINTER(DWORD), POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "advapi32",
        "ConvertSidToStringSidW",
        DOCS + "sddl/nf-sddl-convertsidtostringsidw",
        (LPVOID, POINTER(c_wchar_p)),
        BOOL,
    ),
    Call("shell32", "IsUserAnAdmin", DOCS + "shlobj_core/nf-shlobj_core-isuseranadmin", (), BOOL),
    # WFP: is a persistent filter there (every run checks before it touches anything)
    Call(
        "fwpuclnt",
        "FwpmFilterGetByKey0",
        DOCS + "fwpmu/nf-fwpmu-fwpmfiltergetbykey0",
        (HANDLE, LPVOID, POINTER(LPVOID)),
        DWORD,
    ),
    # void FwpmFreeMemory0(void **p): no result to read (M1)
    Call("fwpuclnt", "FwpmFreeMemory0", DOCS + "fwpmu/nf-fwpmu-fwpmfreememory0", (POINTER(LPVOID),), None),
    # WFP: does an installed filter carry the read grant (an older setup's did not: W2)
    Call(
        "fwpuclnt",
        "FwpmFilterGetSecurityInfoByKey0",
        DOCS + "fwpmu/nf-fwpmu-fwpmfiltergetsecurityinfobykey0",
        (HANDLE, LPVOID, DWORD, POINTER(LPVOID), POINTER(LPVOID), POINTER(LPVOID), POINTER(LPVOID), POINTER(LPVOID)),
        DWORD,
    ),
    # CMD's std handles (W6) and its private window station and desktop (H1): win32proc.py
    Call(
        "kernel32",
        "CreatePipe",
        DOCS + "namedpipeapi/nf-namedpipeapi-createpipe",
        (LPVOID, LPVOID, LPVOID, DWORD),
        BOOL,
    ),
    Call(
        "kernel32",
        "SetHandleInformation",
        DOCS + "handleapi/nf-handleapi-sethandleinformation",
        (HANDLE, DWORD, DWORD),
        BOOL,
    ),
    Call(
        "user32",
        "CreateWindowStationW",
        DOCS + "winuser/nf-winuser-createwindowstationw",
        (c_wchar_p, DWORD, DWORD, LPVOID),
        HANDLE,
    ),
    Call("user32", "GetProcessWindowStation", DOCS + "winuser/nf-winuser-getprocesswindowstation", (), HANDLE),
    Call("user32", "SetProcessWindowStation", DOCS + "winuser/nf-winuser-setprocesswindowstation", (HANDLE,), BOOL),
    Call(
        "user32",
        "CreateDesktopW",
        DOCS + "winuser/nf-winuser-createdesktopw",
        (c_wchar_p, c_wchar_p, LPVOID, DWORD, DWORD, LPVOID),
        HANDLE,
    ),
    Call("user32", "CloseDesktop", DOCS + "winuser/nf-winuser-closedesktop", (HANDLE,), BOOL),
    Call("user32", "CloseWindowStation", DOCS + "winuser/nf-winuser-closewindowstation", (HANDLE,), BOOL),
    # the teardown sweep as the sandbox user (fsguard/windows/win32sweep.py, win32tasks.py; H3)
    Call(
        "advapi32",
        "LogonUserW",
        DOCS + "winbase/nf-winbase-logonuserw",
        (c_wchar_p, c_wchar_p, c_wchar_p, DWORD, DWORD, POINTER(HANDLE)),
        BOOL,
    ),
    Call("advapi32", "ImpersonateLoggedOnUser", SEC + "nf-securitybaseapi-impersonateloggedonuser", (HANDLE,), BOOL),
    Call("advapi32", "RevertToSelf", SEC + "nf-securitybaseapi-reverttoself", (), BOOL),
    Call(
        "advapi32",
        "OpenProcessToken",
        DOCS + "processthreadsapi/nf-processthreadsapi-openprocesstoken",
        (HANDLE, DWORD, POINTER(HANDLE)),
        BOOL,
    ),
    Call(
        "advapi32",
        "GetTokenInformation",
        SEC + "nf-securitybaseapi-gettokeninformation",
        (HANDLE, c_int32, LPVOID, DWORD, POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "kernel32",
        "CreateToolhelp32Snapshot",
        DOCS + "tlhelp32/nf-tlhelp32-createtoolhelp32snapshot",
        (DWORD, DWORD),
        HANDLE,
    ),
    Call("kernel32", "Process32FirstW", DOCS + "tlhelp32/nf-tlhelp32-process32firstw", (HANDLE, LPVOID), BOOL),
    Call("kernel32", "Process32NextW", DOCS + "tlhelp32/nf-tlhelp32-process32nextw", (HANDLE, LPVOID), BOOL),
    Call("ole32", "CoInitializeEx", DOCS + "combaseapi/nf-combaseapi-coinitializeex", (LPVOID, DWORD), c_int32),
    Call("ole32", "CoUninitialize", DOCS + "combaseapi/nf-combaseapi-couninitialize", (), None),
    Call(
        "ole32",
        "CoCreateInstance",
        DOCS + "combaseapi/nf-combaseapi-cocreateinstance",
        (LPVOID, LPVOID, DWORD, LPVOID, POINTER(LPVOID)),
        c_int32,
    ),
    Call("oleaut32", "SysAllocString", DOCS + "oleauto/nf-oleauto-sysallocstring", (c_wchar_p,), LPVOID),
    Call("oleaut32", "SysFreeString", DOCS + "oleauto/nf-oleauto-sysfreestring", (LPVOID,), None),
    # the transparent loop: SeDebugPrivilege in sandgate's own token (launcher/run/windows/win32debug.py)
    Call(
        "advapi32",
        "LookupPrivilegeValueW",
        DOCS + "winbase/nf-winbase-lookupprivilegevaluew",
        (c_wchar_p, c_wchar_p, LPVOID),
        BOOL,
    ),
    Call(
        "advapi32",
        "AdjustTokenPrivileges",
        SEC + "nf-securitybaseapi-adjusttokenprivileges",
        (HANDLE, BOOL, LPVOID, DWORD, LPVOID, POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "kernel32",
        "GetCurrentProcess",
        DOCS + "processthreadsapi/nf-processthreadsapi-getcurrentprocess",
        (),
        HANDLE,
    ),
    # the run's window station when Windows names it (unelevated): its name, its DACL (win32proc.py)
    Call(
        "user32",
        "GetUserObjectInformationW",
        DOCS + "winuser/nf-winuser-getuserobjectinformationw",
        (HANDLE, c_int32, LPVOID, DWORD, POINTER(DWORD)),
        BOOL,
    ),
    Call(
        "advapi32",
        "GetSecurityInfo",
        DOCS + "aclapi/nf-aclapi-getsecurityinfo",
        (HANDLE, c_int32, DWORD, LPVOID, LPVOID, LPVOID, LPVOID, POINTER(LPVOID)),
        DWORD,
    ),
    Call(
        "advapi32",
        "SetSecurityInfo",
        DOCS + "aclapi/nf-aclapi-setsecurityinfo",
        (HANDLE, c_int32, DWORD, LPVOID, LPVOID, LPVOID, LPVOID),
        DWORD,
    ),
    Call(
        "user32", "OpenWindowStationW", DOCS + "winuser/nf-winuser-openwindowstationw", (c_wchar_p, BOOL, DWORD), HANDLE
    ),
    Call("user32", "OpenDesktopW", DOCS + "winuser/nf-winuser-opendesktopw", (c_wchar_p, DWORD, BOOL, DWORD), HANDLE),
    Call("user32", "GetThreadDesktop", DOCS + "winuser/nf-winuser-getthreaddesktop", (DWORD,), HANDLE),
    # a DACL whose inheritable ACEs do not change, written without walking the tree (win32.set_dacl_sddl)
    Call("advapi32", "SetFileSecurityW", SEC + "nf-securitybaseapi-setfilesecurityw", (c_wchar_p, DWORD, LPVOID), BOOL),
)
BY_NAME = {c.name: c for c in CALLS}
