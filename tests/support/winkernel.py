"""The Microsoft contracts behind issue 28's process findings, enforced for the tests' fakes.

Two levels: `check_*` are used by the WinApi fake (winfake.py) on the backend's Launch record;
`FakeKernel` stands in for the DLL functions `win32.fn` returns, so win32proc.py's real ctypes
marshalling (STARTUPINFOW, the UTF-16 block, the pipes, the wait) is what gets checked. Each check
cites the page it follows. None of this is Windows evidence: it is what the pages say, made strict.
"""

from __future__ import annotations

import ctypes
import ntpath
import os
from collections.abc import Callable, Mapping
from typing import Any

from fsguard.windows import job, launch, win32job, win32proc
from sgbase.windows.api import WinApiError

CPWL = "https://learn.microsoft.com/windows/win32/api/winbase/nf-winbase-createprocesswithlogonw"
CREATE_PROCESS = "https://learn.microsoft.com/windows/win32/api/processthreadsapi/nf-processthreadsapi-createprocessw"
ASSIGN = "https://learn.microsoft.com/windows/win32/api/jobapi2/nf-jobapi2-assignprocesstojobobject"
NESTED = "https://learn.microsoft.com/windows/win32/procthread/nested-jobs"
#: The Secondary Logon service's PATH: what it searches when lpApplicationName is NULL (CPWL).
SERVICE_PATH = (r"C:\Windows\system32", r"C:\Windows")
USER_DESKTOP = "WinSta0\\Default"
CREATE_ONLY = 0x1  # CreateWindowStationW: CWF_CREATE_ONLY (winuser.h)
LOGON_STATION = "Service-0x0-5a1c$"  # what Windows names an unnamed station: after the logon session
PROFILE_VARS = ("USERPROFILE", "APPDATA", "LOCALAPPDATA", "TEMP", "TMP", "HOMEPATH", "HOME")


def check_environment(env: Mapping[str, str], real_home: str) -> None:
    """Names are case-insensitive on Windows, one variable per name (CREATE_PROCESS, lpEnvironment;
    "Changing Environment Variables": the block is sorted without regard to case). The profile
    variables must be the sandbox user's: another user's profile is unreadable to it (W7)."""
    seen: set[str] = set()
    for name in env:
        if not name or "=" in name or name.casefold() in seen:
            raise WinApiError(
                f"CreateProcessWithLogonW: environment name {name!r} twice or malformed ({CREATE_PROCESS})"
            )
        seen.add(name.casefold())
    home = ntpath.normcase(real_home)
    for name, value in env.items():
        if name.upper() in PROFILE_VARS and ntpath.normcase(value).startswith(home):
            raise WinApiError(f"the sandbox user cannot read {value} ({name}): the real user's profile")


#: CreateProcessWithLogonW, lpCommandLine: "The maximum length of this string is 1024 characters" (CPWL).
CPWL_CMDLINE_MAX = 1024


def check_command_line(how: launch.Launch) -> None:
    """A longer command line is refused (`python -c <a probe body>` was: every verify row, D5)."""
    if len(how.cmdline) > CPWL_CMDLINE_MAX:
        raise WinApiError(
            f"CreateProcessWithLogonW: error 87, a command line of {len(how.cmdline)} characters "
            f"(at most {CPWL_CMDLINE_MAX}, {CPWL})"
        )


def check_application(how: launch.Launch, exists: Callable[[str], bool], files: Mapping[str, bytes]) -> None:
    """lpApplicationName: a full name with its extension, never searched; NULL: the first word of
    the command line is searched with the Secondary Logon service's PATH (CPWL). Batch files are
    not images: CreateProcess runs them only as cmd.exe /c (CREATE_PROCESS, Remarks)."""
    if not how.application:
        word = how.cmdline.split()[0].strip('"') if how.cmdline else ""
        names = [word] if ntpath.splitext(word)[1] else [word + ".exe"]
        if not any(exists(ntpath.join(d, n)) for d in SERVICE_PATH for n in names):
            raise WinApiError(f"CreateProcessWithLogonW: error 2, {word} not on the service's PATH ({CPWL})")
        return
    ext = ntpath.splitext(how.application)[1].lower()
    if not ntpath.isabs(how.application) or not exists(how.application):
        raise WinApiError(f"CreateProcessWithLogonW: error 2, no file {how.application} ({CPWL})")
    if ext not in (".exe", ".com"):
        raise WinApiError(f"CreateProcessWithLogonW: error 193, {how.application} is not an image ({CREATE_PROCESS})")


def check_desktop(
    how: launch.Launch, desktops: set[str], sddl: Mapping[str, str], users: Mapping[str, tuple[str, str]]
) -> str:
    """lpDesktop NULL or empty: the parent's window station and desktop, with access granted to the
    new user (CPWL): the real user's desktop. A named one must exist and grant the user access."""
    if not how.desktop:
        return USER_DESKTOP
    sid = users[how.user][0]
    if how.desktop not in desktops or f";;;{sid})" not in sddl.get(how.desktop, ""):
        raise WinApiError(f"CreateProcessWithLogonW: error 5, no access to desktop {how.desktop} ({CPWL})")
    return how.desktop


class Unstoppable(AssertionError):
    """A wait Python cannot interrupt: Ctrl+C would do nothing until the command ends (M5)."""


class FakeKernel:
    """The DLL functions win32proc.py calls, over Python state. `fn(name)` replaces win32.fn."""

    def __init__(self, service_path_files: tuple[str, ...] = (), interrupt_after: int = 0) -> None:
        self.files = set(service_path_files)  # what exists (executables)
        self.error = 0
        self.next = 100
        self.pipes: dict[int, bool] = {}  # handle -> inheritable
        self.open: set[int] = set()
        self.started: list[dict[str, Any]] = []
        self.waits: list[int] = []
        self.interrupt_after = interrupt_after  # a Ctrl+C arrives after this many wait calls (0: never)
        self.station = 1
        self.stations: set[int] = set()
        self.desktops: dict[int, tuple[int, str]] = {}
        self.jobs: dict[int, int] = {}  # job handle -> its UI restrictions
        self.admin = False  # sandgate runs unelevated; `--transparent` runs elevated
        self.sds: dict[int, str] = {}  # security descriptor "pointer" -> its SDDL
        self.station_dacl: dict[int, str] = {}  # station handle -> its object's DACL

    def fn(self, name: str) -> Callable[..., Any]:
        f: Callable[..., Any] = getattr(self, name)
        return f

    def last_error(self) -> int:
        return self.error

    def _handle(self) -> int:
        self.next += 4
        self.open.add(self.next)
        return self.next

    def _fail(self, code: int) -> int:
        self.error = code
        return 0

    # pipes
    def CreatePipe(self, r: Any, w: Any, sa: Any, size: int) -> int:
        inherit = bool(sa._obj.bInheritHandle)
        r._obj.value, w._obj.value = self._handle(), self._handle()
        self.pipes[r._obj.value] = self.pipes[w._obj.value] = inherit
        return 1

    def SetHandleInformation(self, h: Any, mask: int, flags: int) -> int:
        self.pipes[int(h.value if hasattr(h, "value") else h)] = bool(flags & mask)
        return 1

    def get_handle_inheritable(self, h: int) -> bool:  # os.get_handle_inheritable (GetHandleInformation)
        if h not in self.open:
            raise OSError(6, "The handle is invalid")  # ERROR_INVALID_HANDLE
        return self.pipes.get(h, False)

    def set_handle_inheritable(self, h: int, inheritable: bool) -> None:
        self.get_handle_inheritable(h)
        self.pipes[h] = inheritable

    def CloseHandle(self, h: int) -> int:
        self.open.discard(int(h))
        return 1

    def CreateProcessWithLogonW(self, *a: Any) -> int:
        user, _dom, _pw, _logon, app, line, flags, env, cwd, psi, ppi = a
        si = psi._obj
        raw = bytes(env)
        block = raw.decode("utf-16-le")
        if not block.endswith("\0\0"):  # the block's terminator (CREATE_PROCESS, lpEnvironment)
            return self._fail(87)
        names = [e.split("=", 1)[0] for e in block[:-2].split("\0") if e] if block != "\0\0" else []
        # "sorted alphabetically by name, case-insensitive, Unicode order" (Changing Environment
        # Variables): Windows compares upcased names (RtlCompareUnicodeString), so HTTPS_PROXY sorts
        # before HTTP_PROXY ('S' < '_'); casefold would put them the other way round.
        if len({n.casefold() for n in names}) != len(names) or names != sorted(names, key=str.upper):
            return self._fail(87)
        # lpCommandLine: "The maximum length of this string is 1024 characters" (CPWL).
        if len(line.value.encode("utf-16-le", "surrogatepass")) // 2 > CPWL_CMDLINE_MAX:
            return self._fail(87)
        if app is None:  # searched with the service's PATH, not the caller's (CPWL)
            word = line.value.split()[0].strip('"')
            if not any(ntpath.join(d, word) in self.files for d in SERVICE_PATH):
                return self._fail(launch.ERROR_FILE_NOT_FOUND)
        elif app not in self.files:
            return self._fail(launch.ERROR_FILE_NOT_FOUND)
        stdio = bool(si.dwFlags & job.STARTF_USESTDHANDLES)
        handles = (si.hStdInput, si.hStdOutput, si.hStdError)
        if stdio and not all(h and self.pipes.get(int(h)) for h in handles):
            return self._fail(6)  # ERROR_INVALID_HANDLE: std handles must be inheritable handles
        self.started.append(
            {
                "app": app,
                "line": line.value,
                "flags": flags,
                "desktop": si.lpDesktop or USER_DESKTOP,  # NULL: the caller's own (CPWL)
                "console": "pipes" if stdio else "new console, output lost",  # CPWL, Remarks
                "env": dict(e.split("=", 1) for e in block[:-2].split("\0") if e),
                "user": user,
                "cwd": cwd,
                # CPWL copies the std handle values "unchanged": they are inherited, with every other
                # inheritable handle of the caller (r4-run N3)
                "inherited": sorted(h for h, i in self.pipes.items() if i and h in self.open),
            }
        )
        pi = ppi._obj
        pi.hProcess, pi.hThread, pi.dwProcessId = self._handle(), self._handle(), 4321
        return 1

    def WaitForSingleObject(self, h: Any, ms: int) -> int:
        if ms == 0xFFFFFFFF:
            raise Unstoppable("WaitForSingleObject(INFINITE): a blocked ctypes call never sees Ctrl+C")
        self.waits.append(ms)
        if self.interrupt_after and len(self.waits) >= self.interrupt_after:
            raise KeyboardInterrupt  # what Python raises between two calls once Ctrl+C arrived
        return win32proc.WAIT_TIMEOUT if len(self.waits) < 3 else win32proc.WAIT_OBJECT_0

    def GetExitCodeProcess(self, h: Any, code: Any) -> int:
        code._obj.value = 3
        return 1

    # jobs (W4): CMD arrives already in the Secondary Logon service's job
    def CreateJobObjectW(self, sa: Any, name: Any) -> int:
        h = self._handle()
        self.jobs[h] = 0
        return h

    def SetInformationJobObject(self, h: int, cls: int, info: Any, size: int) -> int:
        if cls == 4:  # JobObjectBasicUIRestrictions
            self.jobs[h] = int(info._obj.value)
        return 1

    def AssignProcessToJobObject(self, h: int, process: int) -> int:
        # A process already in a job joins only a job without UI limits (ASSIGN; NESTED).
        if self.jobs.get(h):
            return self._fail(launch.ERROR_ACCESS_DENIED)
        return 1

    # window stations and desktops (H1)
    def ConvertStringSecurityDescriptorToSecurityDescriptorW(self, sddl: str, rev: int, psd: Any, size: Any) -> int:
        psd._obj.value = self._handle()
        self.sddl = sddl
        self.sds[psd._obj.value] = sddl
        return 1

    def LocalFree(self, p: Any) -> None:
        value = p.value if hasattr(p, "value") else p
        if isinstance(value, int):  # a c_wchar_p's value is its text: nothing tracked to discard
            self.open.discard(value)

    def CreateWindowStationW(self, name: str | None, flags: int, access: int, sa: Any) -> int:
        # "Only members of the Administrators group are allowed to specify a name. If lpwinsta is NULL
        # or an empty string, the system forms a window station name using the logon session
        # identifier" (learn.microsoft.com/windows/win32/api/winuser/nf-winuser-createwindowstationw).
        if name and not self.admin:
            return self._fail(5)  # ERROR_ACCESS_DENIED
        name = name or LOGON_STATION
        # An existing name: without CWF_CREATE_ONLY "the function succeeds and returns a new handle to
        # the existing window station" (its own DACL, not `sa`'s); with it, the call fails.
        existing = [h for h, n in getattr(self, "station_names", {}).items() if n == name and h in self.stations]
        if existing and flags & CREATE_ONLY:
            return self._fail(183)  # ERROR_ALREADY_EXISTS
        h = self._handle()
        if existing:
            self.reopened = name
            self.station_dacl[h] = self.station_dacl[existing[0]]
        else:
            self.station_dacl[h] = self.sds.get(sa._obj.lpSecurityDescriptor or 0, "D:(A;;GA;;;WD)") if sa else ""
        self.stations.add(h)
        self.station_names = {**getattr(self, "station_names", {}), h: name}
        return h

    def GetUserObjectInformationW(self, h: int, index: int, buf: Any, size: int, needed: Any) -> int:
        buf.value = self.station_names[h] if index == 2 else ""  # UOI_NAME
        return 1

    def GetSecurityInfo(self, h: int, kind: int, info: int, o: Any, g: Any, d: Any, s: Any, psd: Any) -> int:
        psd._obj.value = self._handle()
        self.sds[psd._obj.value] = self.station_dacl[h]
        return 0

    def ConvertSecurityDescriptorToStringSecurityDescriptorW(
        self, sd: Any, rev: int, info: int, text: Any, n: Any
    ) -> int:
        text._obj.value = self.sds[int(sd.value)]
        return 1

    def GetSecurityDescriptorDacl(self, sd: Any, present: Any, dacl: Any, defaulted: Any) -> int:
        present._obj.value, dacl._obj.value = 1, sd.value
        return 1

    def SetSecurityInfo(self, h: int, kind: int, info: int, o: Any, g: Any, dacl: Any, s: Any) -> int:
        text = self.sds[int(dacl.value)]
        for other, name in self.station_names.items():  # one object, every handle to it
            if name == self.station_names[h]:
                self.station_dacl[other] = text
        return 0

    def GetProcessWindowStation(self) -> int:
        return self.station

    def SetProcessWindowStation(self, h: int) -> int:
        self.station = h
        return 1

    def CreateDesktopW(self, name: str, dev: Any, mode: Any, flags: int, access: int, sa: Any) -> int:
        h = self._handle()
        self.desktops[h] = (self.station, name)  # created in the caller's current window station
        return h

    def CloseDesktop(self, h: int) -> int:
        self.desktops.pop(h, None)
        self.open.discard(h)
        return 1

    def CloseWindowStation(self, h: int) -> int:
        self.stations.discard(h)
        self.open.discard(h)
        return 1


def install(monkeypatch: Any, kernel: FakeKernel) -> None:
    """Route win32/win32proc/win32job's `fn` and the last-error read to the fake kernel."""
    from sgbase.windows import win32

    monkeypatch.setattr(win32, "fn", kernel.fn)
    monkeypatch.setattr(win32proc, "fn", kernel.fn)
    monkeypatch.setattr(win32job, "fn", kernel.fn)
    monkeypatch.setattr(ctypes, "get_last_error", kernel.last_error, raising=False)
    monkeypatch.setattr(os, "get_handle_inheritable", kernel.get_handle_inheritable, raising=False)
    monkeypatch.setattr(os, "set_handle_inheritable", kernel.set_handle_inheritable, raising=False)


def marshalled(kernel: FakeKernel) -> Callable[[str], Callable[..., Any]]:
    """`fn` that first hands the arguments to a ctypes prototype of the call table's entry (argtypes,
    restype), so ctypes converts each as the real call would (a wrong type raises ArgumentError),
    then lets the fake kernel act on them."""
    from sgbase.windows import win32calls

    def fn(name: str) -> Callable[..., Any]:
        call = win32calls.BY_NAME[name]
        proto = ctypes.CFUNCTYPE(call.restype, *call.argtypes)(lambda *_: None if call.restype is None else 0)

        def run(*args: Any) -> Any:
            proto(*args)
            return kernel.fn(name)(*args)

        return run

    return fn
