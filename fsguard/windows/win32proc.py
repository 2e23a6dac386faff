"""CMD's start, wait and desktop as Win32 calls (apart from win32.py for the 400-line limit).

Every field comes from launch.Launch, decided and checked by the backend: this module only
marshals. Each choice answers a documented CreateProcessWithLogonW behaviour (issue 28):
lpApplicationName always set (W5), lpDesktop the run's own (H1), STARTF_USESTDHANDLES with
sandgate's pipes (W6), the block as exact UTF-16 bytes (M2), the wait in slices so Ctrl+C reaches
Python between them (M5), and a failed start named with what to do (M14).
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_uint32, c_void_p
from dataclasses import dataclass

from fsguard.windows import desktop, envblock, job, launch
from sgbase.windows.win32 import (
    PROCESS_INFORMATION,
    SDDL_REVISION_1,
    STARTUPINFOW,
    Win32Error,
    check,
    fn,
)

HANDLE_FLAG_INHERIT = 0x1
WAIT_OBJECT_0, WAIT_TIMEOUT = 0, 0x102
#: The wait's slice: a ctypes call is not interrupted by a signal; Python runs the Ctrl+C handler
#: between two calls, so an INFINITE wait would make the run unstoppable (M5).
WAIT_SLICE_MS = 100


class SECURITY_ATTRIBUTES(Structure):
    _fields_ = [("nLength", c_uint32), ("lpSecurityDescriptor", c_void_p), ("bInheritHandle", c_uint32)]


@dataclass(frozen=True)
class Started:
    info: PROCESS_INFORMATION
    stdin: int  # sandgate's ends of CMD's pipes (0: none)
    stdout: int
    stderr: int


def _pipe(child_reads: bool) -> tuple[int, int]:
    """(child's end, sandgate's end): the child's inheritable, sandgate's not (a child holding the
    other end would keep the pipe open forever)."""
    r, w = c_void_p(), c_void_p()
    sa = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), None, 1)
    check("CreatePipe", fn("CreatePipe")(ctypes.byref(r), ctypes.byref(w), ctypes.byref(sa), 0))
    child, ours = (r, w) if child_reads else (w, r)
    check("SetHandleInformation", fn("SetHandleInformation")(ours, HANDLE_FLAG_INHERIT, 0))
    return int(child.value or 0), int(ours.value or 0)


def create_suspended(how: launch.Launch) -> Started:
    """CMD as the sandbox user, suspended (CREATE_SUSPENDED): not one instruction runs until the
    backend has put it in the job and resumes it (windowsbackend.py: assign, or terminate, then resume)."""
    plan, block = job.plan_create(), envblock.utf16(envblock.build(how.env))
    si, pi = STARTUPINFOW(), PROCESS_INFORMATION()
    si.cb, si.lpDesktop = ctypes.sizeof(si), how.desktop  # never NULL: that is the user's desktop
    pipes = [_pipe(True), _pipe(False), _pipe(False)] if how.stdio else []
    if pipes:
        si.dwFlags |= job.STARTF_USESTDHANDLES
        si.hStdInput, si.hStdOutput, si.hStdError = (p[0] for p in pipes)
    # lpCommandLine is [in, out] (the call may write to it): a buffer, never an immutable str; the
    # block holds NULs and UTF-16 surrogate pairs: its exact bytes, not a size in Python characters.
    line = ctypes.create_unicode_buffer(how.cmdline)
    env = ctypes.create_string_buffer(block, len(block))
    args = (how.user, ".", how.password, plan.logon_flags, how.application, line, plan.creation_flags, env, how.cwd)
    try:
        if not fn("CreateProcessWithLogonW")(*args, ctypes.byref(si), ctypes.byref(pi)):
            err = getattr(ctypes, "get_last_error", lambda: 0)()
            raise Win32Error(err, launch.hint(err, how.argv[0] if how.argv else how.application))
    except BaseException:
        for _, mine in pipes:
            close(mine)
        raise
    finally:
        for child, _ in pipes:
            close(child)  # the child has its own copies now
    ours = [p[1] for p in pipes] or [0, 0, 0]
    return Started(pi, ours[0], ours[1], ours[2])


def wait_exit(process: int) -> int:
    """CMD's exit code, waited for in slices (M5: Ctrl+C raises KeyboardInterrupt between them)."""
    while (got := fn("WaitForSingleObject")(process, WAIT_SLICE_MS)) == WAIT_TIMEOUT:
        pass
    if got != WAIT_OBJECT_0:
        check("WaitForSingleObject", False)
    code = c_uint32()
    check("GetExitCodeProcess", fn("GetExitCodeProcess")(process, ctypes.byref(code)))
    return int(code.value)


def close(handle: int) -> None:
    if handle:
        fn("CloseHandle")(handle)


def _attributes(sddl: str) -> tuple[SECURITY_ATTRIBUTES, c_void_p]:
    sd = c_void_p()
    ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(sddl, SDDL_REVISION_1, ctypes.byref(sd), None)
    check("ConvertStringSecurityDescriptorToSecurityDescriptorW", ok)
    return SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), sd, 0), sd


def create_desktop(plan: desktop.DesktopPlan) -> tuple[int, int]:
    """(window station, desktop) handles: held until the run ends (the objects die with them).
    CreateDesktopW makes a desktop in the caller's window station, so sandgate switches to the
    new one for that call only, and back whatever happens."""
    sa, sd = _attributes(plan.sddl)
    try:
        station = fn("CreateWindowStationW")(plan.station, 0, desktop.WINSTA_ALL_ACCESS, ctypes.byref(sa))
        check("CreateWindowStationW", station)
        own = fn("GetProcessWindowStation")()
        check("GetProcessWindowStation", own)
        try:
            check("SetProcessWindowStation", fn("SetProcessWindowStation")(station))
            desk = fn("CreateDesktopW")(plan.desktop, None, None, 0, desktop.DESKTOP_ALL_ACCESS, ctypes.byref(sa))
            check("CreateDesktopW", desk)
        except BaseException:
            fn("SetProcessWindowStation")(own)
            fn("CloseWindowStation")(station)
            raise
        check("SetProcessWindowStation", fn("SetProcessWindowStation")(own))
        return int(station), int(desk)
    finally:
        fn("LocalFree")(sd)


def close_desktop(station: int, desk: int) -> None:
    try:
        check("CloseDesktop", fn("CloseDesktop")(desk))
    finally:
        check("CloseWindowStation", fn("CloseWindowStation")(station))
