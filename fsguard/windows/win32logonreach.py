"""logonreach.py's deny ACEs put on the objects: sandgate's window station and desktop, its processes.

Opened by name (station, desktop) or pid (process) with READ_CONTROL | WRITE_DAC: the handles
GetProcessWindowStation and GetThreadDesktop return are not to be closed and carry whatever access
the session gave. The real user may rewrite these DACLs: the interactive station's logon-SID ACE
holds STANDARD_RIGHTS_REQUIRED (WRITE_DAC), and a process's default DACL gives its user all access.
Every call goes through win32.fn (tested against fake DLL functions). Windows never ran this.
"""

from __future__ import annotations

import threading

from fsguard.windows import sddl
from fsguard.windows.logonreach import ReachDenial
from fsguard.windows.win32proc import READ_CONTROL, WRITE_DAC, object_name, set_window_dacl, window_dacl
from sgbase.windows.win32 import Win32Error, check, fn

SE_KERNEL_OBJECT, SE_WINDOW_OBJECT = 6, 7  # accctrl.h SE_OBJECT_TYPE


def _deny(handle: int, ace: str, kind: int, what: str) -> bool:
    """`ace` in the object's DACL (added unless there already); True when added now."""
    dacl = window_dacl(handle, kind)
    try:
        wanted = sddl.with_ace(dacl, ace)
    except sddl.SddlError as e:  # a NULL DACL: a deny alone would lock everyone else out; leave it
        raise Win32Error(0, f"cannot deny the sandbox user {what}: {e}") from None
    if wanted == dacl:
        return False
    set_window_dacl(handle, wanted, kind)
    return True


def _own_names() -> tuple[str, str]:
    station = fn("GetProcessWindowStation")()
    check("GetProcessWindowStation", station)
    desk = fn("GetThreadDesktop")(threading.get_native_id())  # GetCurrentThreadId's value on Windows
    check("GetThreadDesktop", desk)
    return object_name(int(station)), object_name(int(desk))


def deny_reach(sandbox_sid: str, pids: tuple[int, ...]) -> int:
    """The sandbox SID denied sandgate's window station, its thread's desktop and the processes
    `pids` (sandgate, the proxy); how many ACEs were added now (0: all there already)."""
    deny = ReachDenial(sandbox_sid)
    station_name, desktop_name = _own_names()  # OpenDesktopW opens in our station: the one named here
    added = 0
    station = fn("OpenWindowStationW")(station_name, 0, READ_CONTROL | WRITE_DAC)
    check("OpenWindowStationW", station)
    try:
        added += _deny(int(station), deny.station, SE_WINDOW_OBJECT, f"the window station {station_name}")
    finally:
        fn("CloseWindowStation")(station)
    desk = fn("OpenDesktopW")(desktop_name, 0, 0, READ_CONTROL | WRITE_DAC)
    check("OpenDesktopW", desk)
    try:
        added += _deny(int(desk), deny.desktop, SE_WINDOW_OBJECT, f"the desktop {desktop_name}")
    finally:
        fn("CloseDesktop")(desk)
    for pid in pids:
        process = fn("OpenProcess")(READ_CONTROL | WRITE_DAC, 0, pid)
        check("OpenProcess", process)
        try:
            added += _deny(int(process), deny.process, SE_KERNEL_OBJECT, f"process {pid}")
        finally:
            fn("CloseHandle")(process)
    return added
