"""CMD's start, wait and desktop as Win32 calls (apart from win32.py for the 400-line limit).

Every field comes from launch.Launch, decided and checked by the backend: this module only
marshals. Each choice answers a documented CreateProcessWithLogonW behaviour (issue 28):
lpApplicationName always set (W5), lpDesktop the run's own (H1), STARTF_USESTDHANDLES with
sandgate's pipes (W6), the block as exact UTF-16 bytes (M2), the wait in slices so Ctrl+C reaches
Python between them (M5), and a failed start named with what to do (M14). Session 38: lpCommandLine
within CreateProcessWithLogonW's 1024 characters (R1), and the window station named by Windows when
an unelevated caller may not name it, lpDesktop read back (R16).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from ctypes import Structure, c_int32, c_uint32, c_void_p, c_wchar_p
from dataclasses import dataclass

from fsguard.windows import desktop, envblock, job, launch, sddl
from sgbase.windows.win32 import (
    DACL_SECURITY_INFORMATION,
    PROCESS_INFORMATION,
    SDDL_REVISION_1,
    STARTUPINFOW,
    Win32Error,
    check,
    fn,
)

HANDLE_FLAG_INHERIT = 0x1
SE_WINDOW_OBJECT, UOI_NAME, ERROR_ACCESS_DENIED = 7, 2, 5  # accctrl.h, winuser.h, winerror.h
READ_CONTROL, WRITE_DAC = 0x00020000, 0x00040000
#: CreateWindowStationW: fail if the name exists. Without it an existing station of that name is opened
#: and the security attributes are not applied (another process's station, with its DACL).
CWF_CREATE_ONLY = 0x1
WAIT_OBJECT_0, WAIT_TIMEOUT = 0, 0x102
#: The wait's slice: a ctypes call is not interrupted by a signal; Python runs the Ctrl+C handler
#: between two calls, so an INFINITE wait would make the run unstoppable (M5).
WAIT_SLICE_MS = 100
#: Handle values looked at before CMD starts (r4-run N3): Windows hands them out in steps of 4, and an
#: inherited handle keeps its value, so the shell chain's reach well past a fresh process's few hundred.
HANDLE_SCAN = range(4, 1 << 18, 4)


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


def uninherit_all() -> int:
    """Every inheritable handle of sandgate's made non-inheritable; how many (r4-run N3). CPWL copies the
    std handle values "unchanged to the child process" (its lpStartupInfo), so CMD inherits from
    sandgate, and inheritance takes every inheritable handle: pip's launcher hands python.exe inheritable
    copies of its std handles, the real user's console (WriteConsoleInputW types into their shell).
    Python makes none itself (PEP 446); subprocess passes its own duplicates. Refused if one stays."""
    get, put = getattr(os, "get_handle_inheritable", None), getattr(os, "set_handle_inheritable", None)
    if get is None or put is None:
        return 0  # not Windows: no handle table to look at
    done = 0
    for h in HANDLE_SCAN:
        try:
            if not get(h):
                continue
        except OSError:
            continue  # no such handle
        try:
            put(h, False)
        except OSError as e:  # an inherited handle CMD would get: never start it then
            if not _still_inheritable(get, h):
                continue  # r5-new: closed by another of sandgate's threads meanwhile (a proxy pipe, an accept)
            raise Win32Error(
                e.errno or 0, f"cannot make handle {h} non-inheritable, so the command would get it"
            ) from None
        done += 1
    return done


def _still_inheritable(get: Callable[[int], bool], h: int) -> bool:
    """Whether `h` is still an inheritable handle: sandgate's other threads (the proxy's drain, the
    transparent resolver's accept) open and close handles while the scan runs, and a handle closed
    between the look and the change is refused with ERROR_INVALID_HANDLE: no reason to refuse the run."""
    try:
        return bool(get(h))
    except OSError:
        return False


def create_suspended(how: launch.Launch) -> Started:
    """CMD as the sandbox user, suspended (CREATE_SUSPENDED): not one instruction runs until the
    backend has put it in the job and resumes it (windowsbackend.py: assign, or terminate, then resume)."""
    launch.check_cmdline(how.cmdline, how.argv[0] if how.argv else how.application)  # CPWL's bound: before any handle
    plan, block = job.plan_create(), envblock.utf16(envblock.build(how.env))
    uninherit_all()  # N3: CMD inherits its three pipe ends below, nothing else of sandgate's
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


def _attributes(text: str) -> tuple[SECURITY_ATTRIBUTES, c_void_p]:
    sd = c_void_p()
    ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(text, SDDL_REVISION_1, ctypes.byref(sd), None)
    check("ConvertStringSecurityDescriptorToSecurityDescriptorW", ok)
    return SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), sd, 0), sd


def create_desktop(plan: desktop.DesktopPlan) -> tuple[int, int, str]:
    """(window station, desktop, lpDesktop): held until the run ends (the objects die with them).
    CreateDesktopW makes a desktop in the caller's window station, so sandgate switches to the
    new one for that call only, and back whatever happens."""
    sa, sd = _attributes(plan.sddl)
    try:
        station, name = _station(plan, sa)
        own = fn("GetProcessWindowStation")()
        try:
            check("GetProcessWindowStation", own)
            check("SetProcessWindowStation", fn("SetProcessWindowStation")(station))
            desk = fn("CreateDesktopW")(plan.desktop, None, None, 0, desktop.DESKTOP_ALL_ACCESS, ctypes.byref(sa))
            check("CreateDesktopW", desk)
        except BaseException:
            if own:
                fn("SetProcessWindowStation")(own)
            fn("CloseWindowStation")(station)
            raise
        check("SetProcessWindowStation", fn("SetProcessWindowStation")(own))
        return station, int(desk), f"{name}\\{plan.desktop}"
    finally:
        fn("LocalFree")(sd)


def _station(plan: desktop.DesktopPlan, sa: SECURITY_ATTRIBUTES) -> tuple[int, str]:
    """The run's window station and its name. Named (CWF_CREATE_ONLY: never someone else's) where
    Windows lets us; else (access denied: "Only members of the Administrators group are allowed to
    specify a name") the one Windows names after the logon session, which may exist already with
    another DACL: then the sandbox user's ACE is added to it (desktop.DesktopPlan.station_grant)."""
    station = fn("CreateWindowStationW")(plan.station, CWF_CREATE_ONLY, desktop.WINSTA_ALL_ACCESS, ctypes.byref(sa))
    if station:
        return int(station), plan.station
    if getattr(ctypes, "get_last_error", lambda: 0)() != ERROR_ACCESS_DENIED:
        check("CreateWindowStationW", station)
    station = fn("CreateWindowStationW")(
        None, 0, desktop.WINSTA_ALL_ACCESS | READ_CONTROL | WRITE_DAC, ctypes.byref(sa)
    )
    check("CreateWindowStationW", station)
    try:
        dacl = window_dacl(station)
        # a station that was there before us (sa not applied) and that does not let everyone in
        if f";;;{plan.sandbox_sid})" not in dacl and "NO_ACCESS_CONTROL" not in dacl:
            set_window_dacl(station, sddl.with_ace(dacl, plan.station_grant))
        return int(station), object_name(station)
    except BaseException:
        fn("CloseWindowStation")(station)
        raise


def object_name(handle: int) -> str:
    buf, needed = ctypes.create_unicode_buffer(256), c_uint32()
    ok = fn("GetUserObjectInformationW")(handle, UOI_NAME, buf, ctypes.sizeof(buf), ctypes.byref(needed))
    check("GetUserObjectInformationW", ok)
    if not buf.value:  # never an empty lpDesktop: that is the user's own desktop
        raise Win32Error(0, "GetUserObjectInformationW gave the window station no name")
    return buf.value


def window_dacl(handle: int, kind: int = SE_WINDOW_OBJECT) -> str:
    """The object's DACL as SDDL (`kind`: SE_WINDOW_OBJECT for stations and desktops, SE_KERNEL_OBJECT)."""
    sd, text = c_void_p(), c_wchar_p()
    info = DACL_SECURITY_INFORMATION
    err = fn("GetSecurityInfo")(handle, kind, info, None, None, None, None, ctypes.byref(sd))
    if err:
        raise Win32Error(err, f"GetSecurityInfo failed (error {err})")
    try:
        to_text = fn("ConvertSecurityDescriptorToStringSecurityDescriptorW")
        check(
            "ConvertSecurityDescriptorToStringSecurityDescriptorW",
            to_text(sd, SDDL_REVISION_1, info, ctypes.byref(text), None),
        )
        value = text.value or ""
        fn("LocalFree")(text)
        return value
    finally:
        fn("LocalFree")(sd)


def set_window_dacl(handle: int, text: str, kind: int = SE_WINDOW_OBJECT) -> None:
    sd, present, dacl, defaulted = c_void_p(), c_int32(), c_void_p(), c_int32()
    ok = fn("ConvertStringSecurityDescriptorToSecurityDescriptorW")(text, SDDL_REVISION_1, ctypes.byref(sd), None)
    check("ConvertStringSecurityDescriptorToSecurityDescriptorW", ok)
    try:
        ok = fn("GetSecurityDescriptorDacl")(sd, ctypes.byref(present), ctypes.byref(dacl), ctypes.byref(defaulted))
        check("GetSecurityDescriptorDacl", ok)
        err = fn("SetSecurityInfo")(handle, kind, DACL_SECURITY_INFORMATION, None, None, dacl, None)
        if err:
            raise Win32Error(err, f"SetSecurityInfo failed (error {err})")
    finally:
        fn("LocalFree")(sd)


def close_desktop(station: int, desk: int) -> None:
    try:
        check("CloseDesktop", fn("CloseDesktop")(desk))
    finally:
        check("CloseWindowStation", fn("CloseWindowStation")(station))
