"""`sandgate verify` on Windows: what the real user's logon SID would open to CMD (r2-user U3, R9).

CreateProcessWithLogonW "uses the logon SID in the caller token" (its Remarks): CMD's token very
likely holds the real user's logon SID, which the interactive window station and desktop grant, and
which the real user's default DACL commonly grants read on their processes. Blocked, each judged on
ERROR_ACCESS_DENIED only (another error proves nothing): OpenProcess(PROCESS_VM_READ |
PROCESS_QUERY_INFORMATION) on sandgate's own process (a process of the real user; its pid handed
over in a file by `prepare`), and WinSta0 itself (the run denies the station: its clipboard and
global atoms are the station's, not a desktop's), then its Default desktop (OpenWindowStationW,
SetProcessWindowStation, OpenDesktopW, SetThreadDesktop in a fresh thread). Permitted, in the same
run: the same OpenProcess on CMD's own process, and the same desktop open + SetThreadDesktop on
CMD's own desktop, so a probe that cannot run never passes.
"""

from __future__ import annotations

import json
import ntpath
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from selftest.windows.probebody import RESULT, ProbeBody, Verdict

if TYPE_CHECKING:
    from launcher.run.windows.winapi import WinApi

PID_FILE = "sandgate-probe-pid.json"  # {"pid": sandgate's own pid}, beside the script
ERROR_ACCESS_DENIED = 5

SCRIPT = f"""
import ctypes, json, threading
from ctypes import wintypes as w
u, k = ctypes.WinDLL("user32", use_last_error=True), ctypes.WinDLL("kernel32", use_last_error=True)
H = w.HANDLE
for f, a in (("OpenWindowStationW", (w.LPCWSTR, w.BOOL, w.DWORD)), ("OpenDesktopW", (w.LPCWSTR, w.DWORD, w.BOOL, w.DWORD)),
             ("GetThreadDesktop", (w.DWORD,)), ("GetProcessWindowStation", ())):
    getattr(u, f).restype, getattr(u, f).argtypes = H, a
u.SetThreadDesktop.argtypes = u.SetProcessWindowStation.argtypes = (H,)
u.GetUserObjectInformationW.argtypes = (H, ctypes.c_int, ctypes.c_void_p, w.DWORD, ctypes.POINTER(w.DWORD))
k.OpenProcess.restype, k.OpenProcess.argtypes = H, (w.DWORD, w.BOOL, w.DWORD)
k.CloseHandle.argtypes = (H,)
READ = 0x0010 | 0x0400  # PROCESS_VM_READ | PROCESS_QUERY_INFORMATION
STATION = 0x0001 | 0x0002  # WINSTA_ENUMDESKTOPS | WINSTA_READATTRIBUTES
DESK = 0x0001 | 0x0002 | 0x0008  # DESKTOP_READOBJECTS | CREATEWINDOW | HOOKCONTROL: hooks, windows
def step(h):
    err = ctypes.get_last_error()
    return {{"ok": bool(h), "error": 0 if h else err}}, h
def name(h):
    buf, n = ctypes.create_unicode_buffer(256), w.DWORD()
    u.GetUserObjectInformationW(h, 2, buf, ctypes.sizeof(buf), ctypes.byref(n))
    return buf.value
def attach(desk):
    got = {{}}
    def run():
        ok = u.SetThreadDesktop(desk)
        got.update(ok=bool(ok), error=0 if ok else ctypes.get_last_error())
    t = threading.Thread(target=run)
    t.start(); t.join()
    return got
def process(pid):
    got, h = step(k.OpenProcess(READ, False, pid))
    if h: k.CloseHandle(h)
    return got
result = {{"real_pid": json.load(open({PID_FILE!r}))["pid"], "own_pid": k.GetCurrentProcessId()}}
result["own_process"] = process(result["own_pid"])
result["real_process"] = process(result["real_pid"])
own_station = u.GetProcessWindowStation()
result["own_desktop"], mine = step(u.OpenDesktopW(name(u.GetThreadDesktop(k.GetCurrentThreadId())), 0, False, DESK))
result["own_attach"] = attach(mine) if mine else None
result["winsta0"], station = step(u.OpenWindowStationW("WinSta0", False, STATION))
result["default"] = result["default_attach"] = None
if station:
    u.SetProcessWindowStation(station)
    result["default"], desk = step(u.OpenDesktopW("Default", 0, False, DESK))
    result["default_attach"] = attach(desk) if desk else None  # a thread's desktop is in the process's station
    u.SetProcessWindowStation(own_station)
json.dump(result, open({RESULT!r}, "w"))
"""


def _refused(step: Any) -> bool:
    return isinstance(step, dict) and not step.get("ok") and step.get("error") == ERROR_ACCESS_DENIED


def _worked(step: Any) -> bool:
    return isinstance(step, dict) and bool(step.get("ok"))


def judge(code: int, got: dict[str, Any] | None) -> Verdict:
    if got is None:
        return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
    if not (_worked(got.get("own_process")) and _worked(got.get("own_desktop")) and _worked(got.get("own_attach"))):
        return Verdict(False, "could not open its own process or attach to its own desktop: the probe proves nothing")
    real = got.get("real_process")
    if _worked(real):
        return Verdict(
            False,
            f"CMD opened sandgate (pid {got.get('real_pid')}) with PROCESS_VM_READ: your logon SID is in its token",
        )
    if not _refused(real):
        return Verdict(False, f"opening sandgate's process failed, but not with access denied: {real}")
    if _worked(got.get("default")):
        return Verdict(False, "CMD opened WinSta0\\Default (hooks, windows): your logon SID is in its token")
    if _worked(got.get("winsta0")):  # the station alone holds the clipboard and the global atoms (r3-new N1)
        return Verdict(False, "CMD opened WinSta0 (your clipboard, global atoms): your logon SID is in its token")
    if not _refused(got.get("winsta0")):
        return Verdict(False, f"WinSta0 failed, but not with access denied: {got.get('winsta0')}")
    return Verdict(True, "sandgate's process and WinSta0 refused (access denied); its own process and desktop opened")


def prepare(api: WinApi, workdir: str) -> Callable[[], None]:
    """sandgate's own pid beside the script: a process of the real user the body must not open."""
    path = ntpath.join(workdir, PID_FILE)
    api.write_file(path, json.dumps({"pid": api.own_pid()}).encode())
    return lambda: api.remove_file(path)


BODIES = (ProbeBody("logon_sid", "process", SCRIPT, judge, prepare),)
