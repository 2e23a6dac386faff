r"""DCOM's machine-wide limits, HKLM\SOFTWARE\Microsoft\Ole MachineLaunchRestriction and
MachineAccessRestriction (REG_BINARY self-relative security descriptors; issue 28, H3).

Only the calls: which ACE is servicedeny.py's decision. HKLM needs an elevated writer (setup).
https://learn.microsoft.com/en-us/windows/win32/com/machinelaunchrestriction
https://learn.microsoft.com/en-us/windows/win32/com/machineaccessrestriction
"""

from __future__ import annotations

import ctypes
import importlib
from ctypes import c_uint32, c_void_p, c_wchar_p
from typing import Any

from sgbase.windows.win32 import Win32Error, fn

OLE = r"SOFTWARE\Microsoft\Ole"
SDDL_REVISION_1 = 1
OWNER_GROUP_DACL = 0x1 | 0x2 | 0x4  # OWNER_, GROUP_, DACL_SECURITY_INFORMATION


def _winreg() -> Any:
    return importlib.import_module("winreg")  # Windows only: loaded on the first call


def get_sd(value: str) -> str | None:
    """The value as SDDL; None when it is absent (then DCOM's built-in default applies)."""
    reg = _winreg()
    try:
        with reg.OpenKey(reg.HKEY_LOCAL_MACHINE, OLE, 0, reg.KEY_READ) as key:
            data, kind = reg.QueryValueEx(key, value)
    except FileNotFoundError:
        return None
    if kind != reg.REG_BINARY:
        raise Win32Error(13, f"{OLE}\\{value} is not REG_BINARY")
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    text = c_wchar_p()
    ok = fn("ConvertSecurityDescriptorToStringSecurityDescriptorW")(
        ctypes.cast(buf, c_void_p), SDDL_REVISION_1, OWNER_GROUP_DACL, ctypes.byref(text), None
    )
    if not ok:
        raise Win32Error(ctypes.get_last_error(), f"cannot read {OLE}\\{value} as a security descriptor")  # type: ignore[attr-defined,unused-ignore]
    out = text.value or ""
    fn("LocalFree")(text)
    return out


def set_sd(value: str, sddl_text: str) -> None:
    """Write the value from SDDL, as the self-relative binary SD DCOM reads."""
    reg = _winreg()
    sd, size = c_void_p(), c_uint32()
    ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(
        sddl_text, SDDL_REVISION_1, ctypes.byref(sd), ctypes.byref(size)
    )
    if not ok:
        raise Win32Error(ctypes.get_last_error(), f"bad security descriptor for {value}")  # type: ignore[attr-defined,unused-ignore]
    try:
        data = ctypes.string_at(sd.value or 0, size.value)
    finally:
        fn("LocalFree")(sd)
    with reg.OpenKey(reg.HKEY_LOCAL_MACHINE, OLE, 0, reg.KEY_SET_VALUE) as key:
        reg.SetValueEx(key, value, 0, reg.REG_BINARY, data)
