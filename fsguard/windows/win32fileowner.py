"""A file's owner SID, read and taken back, for the ACL plan's owners (aclapply.take_owners; win-acl A3, r2-fixes F3).

Why it matters: "An object's owner implicitly has WRITE_DAC access to the object" (https://learn.microsoft.com/en-us/windows/win32/secauthz/owner-of-a-new-object),
whatever deny ACE its DACL holds, so a deny on an object the sandbox user owns is no boundary.
Only calls (GetNamedSecurityInfoW / SetNamedSecurityInfoW with OWNER_SECURITY_INFORMATION,
ConvertSidToStringSidW, ConvertStringSidToSidW), all in the documented call table; never run on Windows yet.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import c_void_p, c_wchar_p

from sgbase.windows.win32 import SE_FILE_OBJECT, Win32Error, check, fn

OWNER_SECURITY_INFORMATION = 0x1


def owner_sid(path: str) -> str | None:
    """The owner of `path` as a SID string (S-1-5-21-...); None: no such path; Win32Error when it
    cannot be read."""
    if not os.path.lexists(path):
        return None
    sd, owner = c_void_p(), c_void_p()
    err = fn("GetNamedSecurityInfoW")(
        path, SE_FILE_OBJECT, OWNER_SECURITY_INFORMATION, ctypes.byref(owner), None, None, None, ctypes.byref(sd)
    )
    if err:
        raise Win32Error(err, f"GetNamedSecurityInfoW({path!r}, owner) failed (error {err})")
    try:
        text = c_wchar_p()
        check("ConvertSidToStringSidW", fn("ConvertSidToStringSidW")(owner, ctypes.byref(text)))
        try:
            return text.value or ""
        finally:
            fn("LocalFree")(text)
    finally:
        fn("LocalFree")(sd)  # the owner SID points into this descriptor: freed last
