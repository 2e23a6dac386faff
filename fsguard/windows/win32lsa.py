"""The LSA calls that deny the sandbox user logon rights (logonrights.DENIED; issue 28, H3).

Only bindings: which rights is logonrights.py's decision. Elevated only (setup): LsaOpenPolicy
with POLICY_CREATE_ACCOUNT | POLICY_LOOKUP_NAMES, as LsaAddAccountRights documents.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_uint16, c_uint32, c_void_p, c_wchar_p
from typing import Any

from sgbase.windows.win32 import Win32Error, fn

POLICY_CREATE_ACCOUNT, POLICY_LOOKUP_NAMES = 0x00000010, 0x00000800
#: LsaRemoveAccountRights on a SID that holds no rights at all: nothing to remove.
STATUS_OBJECT_NAME_NOT_FOUND = 0xC0000034


class LSA_UNICODE_STRING(Structure):
    _fields_ = [("Length", c_uint16), ("MaximumLength", c_uint16), ("Buffer", c_wchar_p)]


class LSA_OBJECT_ATTRIBUTES(Structure):
    _fields_ = [
        ("Length", c_uint32),
        ("RootDirectory", c_void_p),
        ("ObjectName", c_void_p),
        ("Attributes", c_uint32),
        ("SecurityDescriptor", c_void_p),
        ("SecurityQualityOfService", c_void_p),
    ]


def _ok(name: str, status: int) -> None:
    if status:
        err = int(fn("LsaNtStatusToWinError")(status))
        raise Win32Error(err, f"{name} failed (error {err})")


def _strings(rights: tuple[str, ...]) -> Any:
    arr = (LSA_UNICODE_STRING * len(rights))()
    for item, right in zip(arr, rights, strict=True):  # lengths in bytes, without the NUL
        item.Length, item.MaximumLength, item.Buffer = 2 * len(right), 2 * len(right) + 2, right
    return arr


def _change(sid: str, rights: tuple[str, ...], *, add: bool) -> None:
    psid = c_void_p()
    if not fn("ConvertStringSidToSidW")(sid, ctypes.byref(psid)):
        raise Win32Error(getattr(ctypes, "get_last_error", lambda: 0)(), f"bad SID {sid}")
    policy = c_void_p()
    try:
        attrs = LSA_OBJECT_ATTRIBUTES()
        attrs.Length = ctypes.sizeof(attrs)
        access = POLICY_CREATE_ACCOUNT | POLICY_LOOKUP_NAMES
        _ok("LsaOpenPolicy", fn("LsaOpenPolicy")(None, ctypes.byref(attrs), access, ctypes.byref(policy)))
        names = _strings(rights)
        if add:
            _ok("LsaAddAccountRights", fn("LsaAddAccountRights")(policy, psid, names, len(rights)))
        else:
            status = int(fn("LsaRemoveAccountRights")(policy, psid, 0, names, len(rights))) & 0xFFFFFFFF
            if status != STATUS_OBJECT_NAME_NOT_FOUND:
                _ok("LsaRemoveAccountRights", status)
    finally:
        if policy.value:
            fn("LsaClose")(policy)
        fn("LocalFree")(psid)


def deny(sid: str, rights: tuple[str, ...]) -> None:
    """Add the deny rights (idempotent: rights already held are kept once)."""
    _change(sid, rights, add=True)


def undeny(sid: str, rights: tuple[str, ...]) -> None:
    """Take them out again (`setup --remove`); a SID holding none is fine."""
    _change(sid, rights, add=False)
