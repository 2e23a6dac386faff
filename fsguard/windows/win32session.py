"""Who owns this terminal session (`sandgate setup`'s M13 check): one binding, no decision.

Why: setup binds the sandbox user, its sealed password and the filters' read grant to the account
whose token runs it; elevated with another administrator's credentials (over-the-shoulder UAC),
that is not the person at this desktop. WTSQuerySessionInformationW names the session's user:
https://learn.microsoft.com/en-us/windows/win32/api/wtsapi32/nf-wtsapi32-wtsquerysessioninformationw
"""

from __future__ import annotations

import ctypes
from ctypes import c_uint32, c_void_p, c_wchar_p

from sgbase.windows.win32 import Win32Error, fn

WTS_CURRENT_SESSION = 0xFFFFFFFF
WTSUserName, WTSDomainName = 5, 7


def _query(info: int) -> str:
    buf, size = c_wchar_p(), c_uint32()
    if not fn("WTSQuerySessionInformationW")(None, WTS_CURRENT_SESSION, info, ctypes.byref(buf), ctypes.byref(size)):
        raise Win32Error(getattr(ctypes, "get_last_error", lambda: 0)(), "WTSQuerySessionInformationW failed")
    try:
        return buf.value or ""
    finally:
        fn("WTSFreeMemory")(ctypes.cast(buf, c_void_p))


def session_user() -> str | None:
    """`DOMAIN\\name` of this session's user; None in a session without one (services, CI agents)."""
    name = _query(WTSUserName)
    return f"{_query(WTSDomainName)}\\{name}" if name else None
