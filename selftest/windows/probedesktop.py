"""`sandgate verify` on Windows: CMD is on a private window station and desktop (issue 28, H1).

Blocked: opening the interactive window station WinSta0 (where the user's windows, clipboard and
input live), judged on ERROR_ACCESS_DENIED only (OpenWindowStationW: "If the function fails, the
return value is NULL. To get extended error information, call GetLastError"), and being on it at all. Permitted, in the same run: creating a window on its own
desktop (so a probe that cannot run does not pass). SendInput's count is reported: on a
non-interactive window station the input reaches no one's windows but the run's own.
"""

from __future__ import annotations

from typing import Any

from selftest.windows.probebody import RESULT, ProbeBody, Verdict

ERROR_ACCESS_DENIED = 5

SCRIPT = f"""
import ctypes, json
from ctypes import wintypes as w
u, k = ctypes.WinDLL("user32", use_last_error=True), ctypes.WinDLL("kernel32")
for f in ("GetProcessWindowStation", "GetThreadDesktop", "OpenWindowStationW", "CreateWindowExW"):
    getattr(u, f).restype = w.HANDLE
u.OpenWindowStationW.argtypes = (w.LPCWSTR, w.BOOL, w.DWORD)
def name(h):
    buf, n = ctypes.create_unicode_buffer(256), w.DWORD()
    u.GetUserObjectInformationW(w.HANDLE(h), 2, buf, ctypes.sizeof(buf), ctypes.byref(n))
    return buf.value
class KI(ctypes.Structure):
    _fields_ = [("vk", w.WORD), ("scan", w.WORD), ("flags", w.DWORD), ("time", w.DWORD), ("extra", ctypes.c_size_t)]
class INPUT(ctypes.Structure):
    _fields_ = [("type", w.DWORD), ("ki", KI), ("pad", ctypes.c_ubyte * 8)]
keys = (INPUT * 2)(INPUT(1, KI(0x87, 0, 0, 0, 0)), INPUT(1, KI(0x87, 0, 2, 0, 0)))  # F24 down/up: harmless
winsta0 = u.OpenWindowStationW("WinSta0", False, 0x0001)  # WINSTA_ENUMDESKTOPS
winsta0_error = 0 if winsta0 else ctypes.get_last_error()  # the reason, read before any other call
result = {{
    "station": name(u.GetProcessWindowStation()),
    "desktop": name(u.GetThreadDesktop(k.GetCurrentThreadId())),
    "winsta0": bool(winsta0),
    "winsta0_error": winsta0_error,
    "own_window": bool(u.CreateWindowExW(0, "STATIC", "sandgate-probe", 0, 0, 0, 1, 1, None, None, None, None)),
    "sendinput": u.SendInput(2, keys, ctypes.sizeof(INPUT)),
}}
json.dump(result, open({RESULT!r}, "w"))
"""


def judge(code: int, got: dict[str, Any] | None) -> Verdict:
    if got is None:
        return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
    station = str(got.get("station", ""))
    if not got.get("own_window"):
        return Verdict(False, "could not create a window on its own desktop: the probe proves nothing")
    if station.casefold() == "winsta0" or got.get("winsta0"):
        return Verdict(False, f"CMD reaches the interactive window station (on {station!r}): the user's desktop")
    if got.get("winsta0_error") != ERROR_ACCESS_DENIED:  # another failure proves nothing about the refusal
        return Verdict(False, f"opening WinSta0 failed, but not with access denied (error {got.get('winsta0_error')})")
    return Verdict(
        True, f"on {station}\\{got.get('desktop')}, WinSta0 refused, SendInput counted {got.get('sendinput')}"
    )


BODIES = (ProbeBody("private_desktop", "process", SCRIPT, judge),)
