"""The real WinApi: each method one call into win32.py / win32wfp.py, the file system, or a child.

Holds no decision (the order and every check are windowsbackend.py's and setup.py's, tested on Linux
against a fake). Never run yet: .github/workflows/windows.yml is where it first will be. Imports
on Linux (ctypes' Windows parts load on the first call), so mypy and the import test cover it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any

from fsguard.windows import (
    win32dcom,
    win32job,
    win32lsa,
    win32proc,
    win32profile,
    win32session,
    win32stdio,
    win32sweep,
    win32wmi,
)
from fsguard.windows.desktop import DesktopPlan
from fsguard.windows.job import JobLimits
from fsguard.windows.launch import Launch
from fsguard.windows.win32selfprotect import RealCodeDirs
from launcher.run.windows import win32debug, win32owner, win32proxyjob
from launcher.run.windows.realowner import RealOwnerApi
from launcher.run.windows.realreparse import RealReparseApi
from launcher.run.windows.realsweep import RealSweepApi
from launcher.run.windows.win32runsession import RealSessionApi
from netguard.windows import firewall, win32divert, win32wfp
from netguard.windows.divertfilter import DivertFilters
from netguard.windows.firewall import FirewallRule
from netguard.windows.owners import Opened
from netguard.windows.wfp import WfpFilter, WfpPlan
from sgbase.windows import systools, win32
from sgbase.windows.api import Proc, WinApiError

CREATE_NO_WINDOW = 0x08000000


def _call(what: str, f: Callable[..., Any], *args: object) -> Any:
    """Run one effect; an OSError (Win32Error is one) becomes the one-line WinApiError."""
    try:
        return f(*args)
    except OSError as e:
        raise WinApiError(f"{what}: {e.strerror or e}") from None
    except ValueError as e:  # a refused plan (envblock, job.check_job): one line, never a traceback (W1)
        raise WinApiError(f"{what}: {e}") from None


def _own_sid() -> str:
    """The SID of this process's token user (GetCurrentProcess: a pseudo-handle, nothing to close)."""
    return win32sweep.token_user(win32.fn("GetCurrentProcess")())


def _as_image(rule: FirewallRule) -> FirewallRule:
    """The rule with the interpreter's process image as its program (S3, session 38): in a venv,
    sys.executable is a redirector that starts the base python.exe as a child (bpo-35797), so the
    proxy's listening socket belongs to sys._base_executable, the image the firewall matches."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    if rule.program is None or os.path.normcase(rule.program) != os.path.normcase(sys.executable):
        return rule
    return dataclasses.replace(rule, program=base)


def _ready_then_drain(stream: IO[bytes] | None, got: list[bytes], line: threading.Event) -> None:
    """The ready line, then every later byte read and dropped until the proxy exits (M9): a pipe
    nobody reads fills up and the proxy blocks on its next write, mid-run."""
    if stream is None:
        line.set()
        return
    got.append(stream.readline())
    line.set()
    while stream.read(65536):
        pass


class RealWinApi(RealSweepApi, RealOwnerApi, RealSessionApi, RealCodeDirs, RealReparseApi):
    """WinApi on Windows. Child processes (the proxy) are kept by pid to stop them later; the
    teardown sweep's effects are RealSweepApi's (realsweep.py)."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._relays: dict[int, win32stdio.Relay] = {}  # CMD's pid -> its std streams' relay (W6)
        self._desktops: dict[int, tuple[int, int]] = {}  # desktop handle -> (station, desktop)

    # who and where
    def is_admin(self) -> bool:
        return bool(_call("IsUserAnAdmin", win32.is_admin))

    def current_user_sid(self) -> str:
        """The user of sandgate's own token. Not USERNAME looked up by name (S2, session 38): a bare
        name misses Entra ID accounts (AzureAD\\name) and, on a domain member, can resolve to a local
        account of the same name, which setup would then grant the filters' read right and the
        proxy-port guard's exception."""
        sid: str = _call("GetTokenInformation(TokenUser)", _own_sid)
        return sid

    def session_user_sid(self) -> str | None:
        who: str | None = _call("WTSQuerySessionInformationW", win32session.session_user)
        if who is None:
            return None
        sid: str | None = _call("LookupAccountNameW", win32.account_sid, who)
        return sid

    def local_appdata(self) -> str:
        value = os.environ.get("LOCALAPPDATA")
        if not value:
            raise WinApiError("LOCALAPPDATA is not set; run sandgate from your own logon session")
        return value

    def home(self) -> str:
        return os.path.expanduser("~")

    def cwd(self) -> str:
        return os.getcwd()

    def environ(self) -> Mapping[str, str]:
        return dict(os.environ)

    def python(self) -> str:
        return sys.executable

    # the sandbox user
    def user_sid(self, name: str) -> str | None:
        sid: str | None = _call("LookupAccountNameW", win32.account_sid, name)
        return sid

    def create_user(self, name: str, password: str) -> str:
        _call("NetUserAdd", win32.add_user, name, password)
        sid = self.user_sid(name)
        if sid is None:
            raise WinApiError(f"the user {name} was created but has no SID")
        return sid

    def set_password(self, name: str, password: str) -> None:
        _call("NetUserSetInfo", win32.set_password, name, password)

    def delete_user(self, name: str) -> None:
        _call("NetUserDel", win32.delete_user, name)

    def delete_profile(self, sid: str) -> None:
        _call("DeleteProfileW", win32profile.delete_profile, sid)

    def deny_logon_rights(self, sid: str, rights: tuple[str, ...]) -> None:
        _call("LsaAddAccountRights", win32lsa.deny, sid, rights)

    def undeny_logon_rights(self, sid: str, rights: tuple[str, ...]) -> None:
        _call("LsaRemoveAccountRights", win32lsa.undeny, sid, rights)

    def wmi_namespace_sd(self, namespace: str) -> str:
        out: str = _call(f"WMI GetSD on {namespace}", win32wmi.get_sd, namespace)
        return out

    def set_wmi_namespace_sd(self, namespace: str, sd: str) -> None:
        _call(f"WMI SetSD on {namespace}", win32wmi.set_sd, namespace, sd)

    def com_restriction_sd(self, value: str) -> str | None:
        out: str | None = _call(f"reading DCOM's {value}", win32dcom.get_sd, value)
        return out

    def set_com_restriction_sd(self, value: str, sd: str) -> None:
        _call(f"writing DCOM's {value}", win32dcom.set_sd, value, sd)

    def protect(self, data: bytes) -> bytes:
        out: bytes = _call("CryptProtectData", win32.protect, data)
        return out

    def unprotect(self, sealed: bytes) -> bytes:
        out: bytes = _call("CryptUnprotectData", win32.unprotect, sealed)
        return out

    # WFP and firewall
    def wfp_installed(self, plan: WfpPlan) -> bool:
        return bool(_call("WFP", win32wfp.installed, plan))

    def wfp_install(self, plan: WfpPlan) -> None:
        _call("WFP install", win32wfp.install, plan)

    def wfp_remove(self, plan: WfpPlan) -> None:
        _call("WFP remove", win32wfp.remove, plan)

    def _powershell(self, command: str) -> str:
        # Stop: a cmdlet's non-terminating error fails the process (S6); errors="replace": PowerShell
        # writes a pipe in the OEM code page, a localized message must not become a traceback (S5)
        script = "$ErrorActionPreference='Stop'; " + command
        # absolute: a bare name is looked for in the current directory first, a workspace (r5-attack A5)
        argv = [systools.powershell(os.environ), "-NoProfile", "-NonInteractive", "-Command", script]
        r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120, check=False)
        if r.returncode != 0:
            raise WinApiError(f"firewall: {(r.stderr.strip().splitlines() or ['PowerShell failed'])[-1]}")
        return r.stdout

    def firewall_has(self, name: str) -> bool:
        return self._powershell(firewall.ps_has(name)).strip() == "1"

    def firewall_add(self, rule: FirewallRule) -> None:
        self._powershell(firewall.ps_add(_as_image(rule)))

    def firewall_remove(self, name: str) -> None:
        self._powershell(firewall.ps_remove(name))

    # files and DACLs
    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def read_file(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise WinApiError(f"cannot read {path}: {e.strerror}") from None

    def write_file(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        try:  # whole or not at all: a torn sealed password would lock the user out
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            raise WinApiError(f"cannot write {path}: {e.strerror}") from None

    def append_line(self, path: str, line: str) -> None:
        try:  # write-ahead: on disk before the change it records
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise WinApiError(f"cannot write the ACL journal {path}: {e.strerror}") from None

    def remove_file(self, path: str) -> None:
        if os.path.lexists(path):
            _call(f"cannot remove {path}", os.remove, path)

    def list_dir(self, path: str) -> list[str]:
        return os.listdir(path) if os.path.isdir(path) else []

    def make_dir(self, path: str) -> None:
        if not os.path.isdir(path):
            _call(f"cannot create {path}", os.mkdir, path)

    def remove_empty_dir(self, path: str) -> bool:
        try:
            os.rmdir(path)
        except OSError:
            return False
        return True

    def dacl(self, path: str) -> str | None:
        if not os.path.lexists(path):
            return None
        out: str = _call(f"cannot read the ACL of {path}", win32.dacl_sddl, path)
        return out

    def set_dacl(self, path: str, sddl: str, walk: bool = True) -> None:
        _call(f"cannot set the ACL of {path}", win32.set_dacl_sddl, path, sddl, walk)

    # processes
    def pid_alive(self, pid: int) -> bool:
        return bool(_call("OpenProcess", win32.pid_alive, pid))

    def own_pid(self) -> int:
        return os.getpid()

    def create_job(self, limits: JobLimits) -> int:
        job: int = _call("CreateJobObjectW", win32job.make_job, limits)
        return job

    def close_job(self, job: int) -> None:
        _call("TerminateJobObject", win32job.close_job, job)

    def create_desktop(self, plan: DesktopPlan) -> tuple[int, str]:
        station, desk, where = _call("CreateDesktopW", win32proc.create_desktop, plan)
        self._desktops[desk] = (station, desk)
        return int(desk), str(where)  # lpDesktop as Windows named it (unelevated: it names the station)

    def close_desktop(self, handle: int) -> None:
        station, desk = self._desktops.pop(handle, (0, 0))
        if desk:
            _call("CloseDesktop", win32proc.close_desktop, station, desk)

    def start_suspended(self, launch: Launch) -> Proc:
        import msvcrt  # Windows only: the pipes' handles as file descriptors for the relay

        got = _call("CreateProcessWithLogonW", win32proc.create_suspended, launch)
        pi = got.info
        if got.stdout:
            fds = (msvcrt.open_osfhandle(h, 0) for h in (got.stdin, got.stdout, got.stderr))  # type: ignore[attr-defined,unused-ignore]
            self._relays[int(pi.dwProcessId)] = win32stdio.Relay(*fds)
        return Proc(int(pi.dwProcessId), int(pi.hProcess or 0), int(pi.hThread or 0))

    def assign(self, job: int, proc: Proc) -> None:
        _call("AssignProcessToJobObject", win32job.assign, job, proc.handle)

    def resume(self, proc: Proc) -> None:
        _call("ResumeThread", win32.resume, proc.thread)

    def terminate(self, proc: Proc) -> None:
        _call("TerminateProcess", win32.terminate, proc.handle)

    def wait(self, proc: Proc) -> int:
        code: int = _call("WaitForSingleObject", win32proc.wait_exit, proc.handle)
        relay = self._relays.pop(proc.pid, None)
        if relay is not None:
            relay.finish()  # CMD's last output before sandgate's own lines
        return code

    def close_process(self, proc: Proc) -> None:
        win32.close(proc.thread)
        win32.close(proc.handle)

    def start_proxy(self, argv: tuple[str, ...]) -> Proc:
        child = win32proxyjob.start(argv)  # in a kill-on-close job: it dies with sandgate (r3-day D2)
        self._children[child.pid] = child
        return Proc(child.pid, 0)

    def await_proxy(self, proc: Proc, timeout: float) -> None:
        """The proxy's one ready line on its stdout (--ready-fd 1), read in a thread: Windows pipes
        cannot be select()ed."""
        child = self._children[proc.pid]
        got: list[bytes] = []
        line = threading.Event()
        reader = threading.Thread(target=_ready_then_drain, args=(child.stdout, got, line), daemon=True)
        reader.start()
        for _ in range(max(1, int(timeout * 10))):  # 0.1 s slices: a lock wait does not see Ctrl+C on Windows
            if line.wait(0.1):
                break
        try:
            ready = bool(got) and json.loads(got[0]).get("ready") is True
        except ValueError:
            ready = False
        if not ready:
            raise WinApiError(f"the proxy did not get ready in {timeout:.0f} s (port in use by another run?)")

    def stop_proxy(self, proc: Proc) -> None:
        child = self._children.pop(proc.pid, None)
        if child is not None:
            win32proxyjob.stop(child)

    # the optional transparent path (win32divert.py): pydivert, the dynamic WFP session, the resolver
    def divert_open(self, filters: DivertFilters) -> tuple[win32divert.Handle, win32divert.Handle]:
        handles: tuple[win32divert.Handle, win32divert.Handle] = _call(
            "WinDivertOpen", win32divert.open_handles, filters
        )
        return handles

    def wfp_open_dynamic(self, plan: WfpPlan, filters: tuple[WfpFilter, ...]) -> int:
        session: int = _call("WFP dynamic session", win32wfp.open_dynamic, plan, filters)
        return session

    def wfp_close_dynamic(self, session: int) -> None:
        _call("FwpmEngineClose0", win32wfp.close_dynamic, session)

    def debug_privilege(self, enable: bool) -> bool:
        was: bool = _call("SeDebugPrivilege", win32debug.set_debug, enable)
        return was

    def owner_open(self, pid: int) -> Opened:
        opened: Opened = _call("the owner of a connect", win32owner.open_owner, pid)  # unreadable: said
        return opened

    def job_pids(self, job: int) -> frozenset[int]:
        pids: frozenset[int] = _call("the job's process list", win32owner.job_pids, job)
        return pids

    def owner_release(self, handle: int) -> None:
        _call("CloseHandle", win32owner.release, handle)

    def serve_resolver(self, path: win32divert.TransparentPath) -> win32divert.ResolverServer:
        server: win32divert.ResolverServer = _call(
            "the transparent resolver on 127.0.0.1:8085 (another run or mitmproxy holds it?)",
            win32divert.ResolverServer,
            path,
        )
        return server
