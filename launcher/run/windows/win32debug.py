"""SeDebugPrivilege in sandgate's own process token while the transparent loop runs (marshals only;
transparent.py decides when).

Why: the elevated loop opens each connecting process to read its token user (win32owner.py), and
OpenProcess is an access check against that process's DACL. The default DACL of another user's
process grants that user and SYSTEM, not Administrators; only "if the caller has enabled the
SeDebugPrivilege privilege, the requested access is granted regardless of the contents of the
security descriptor" (OpenProcess docs). An elevated administrator's token holds the privilege,
disabled; AdjustTokenPrivileges enables it. That call also "succeeds" when the token does not hold
the privilege, with GetLastError() == ERROR_NOT_ALL_ASSIGNED (AdjustTokenPrivileges docs): checked,
so a privilege that is not enabled is said, never assumed. PreviousState tells whether the call
changed anything ("If the PrivilegeCount member ... is zero, then no privileges have been changed"),
so the caller can leave a privilege that was enabled before as it found it.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_int32, c_uint32, c_void_p

from sgbase.windows.win32 import Win32Error, check, close, fn

SE_DEBUG_NAME = "SeDebugPrivilege"
SE_PRIVILEGE_ENABLED = 0x00000002
TOKEN_ADJUST_PRIVILEGES, TOKEN_QUERY = 0x0020, 0x0008
ERROR_NOT_ALL_ASSIGNED = 1300


class LUID(Structure):
    _fields_ = [("LowPart", c_uint32), ("HighPart", c_int32)]


class LUID_AND_ATTRIBUTES(Structure):
    _fields_ = [("Luid", LUID), ("Attributes", c_uint32)]


class TOKEN_PRIVILEGES(Structure):  # Privileges[ANYSIZE_ARRAY]: one is all this sets
    _fields_ = [("PrivilegeCount", c_uint32), ("Privileges", LUID_AND_ATTRIBUTES * 1)]


def _last_error() -> int:
    return int(getattr(ctypes, "get_last_error", lambda: 0)())


def set_debug(enable: bool) -> bool:
    """Enable (or disable) SeDebugPrivilege in this process's token; whether it was enabled before.
    Win32Error(ERROR_NOT_ALL_ASSIGNED) when the token does not hold it (not elevated, or the account
    lacks "Debug programs")."""
    luid = LUID()
    check("LookupPrivilegeValueW", fn("LookupPrivilegeValueW")(None, SE_DEBUG_NAME, ctypes.byref(luid)))
    token = c_void_p()
    access = TOKEN_ADJUST_PRIVILEGES | TOKEN_QUERY
    check("OpenProcessToken", fn("OpenProcessToken")(fn("GetCurrentProcess")(), access, ctypes.byref(token)))
    try:
        new = TOKEN_PRIVILEGES(1)
        new.Privileges[0] = LUID_AND_ATTRIBUTES(luid, SE_PRIVILEGE_ENABLED if enable else 0)
        old, size = TOKEN_PRIVILEGES(), c_uint32()
        ok = fn("AdjustTokenPrivileges")(
            token, False, ctypes.byref(new), ctypes.sizeof(old), ctypes.byref(old), ctypes.byref(size)
        )
        check("AdjustTokenPrivileges", ok)
        if _last_error() == ERROR_NOT_ALL_ASSIGNED:  # "succeeded", but the token does not hold it
            raise Win32Error(
                ERROR_NOT_ALL_ASSIGNED, "this token does not hold SeDebugPrivilege (ERROR_NOT_ALL_ASSIGNED)"
            )
        changed = old.PrivilegeCount > 0
        return changed if not enable else not changed
    finally:
        close(int(token.value or 0))
