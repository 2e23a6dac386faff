"""A fake of the Windows backend's one OS seam (launcher/run/windows/winapi.WinApi; its file part sgbase/windows/api.FileApi).

It keeps the state a real machine would (users, sealed passwords, files, DACLs, WFP filters,
firewall rules, jobs, processes, the proxy child), records every call in order, and can fail any
call, or its n-th occurrence, with a WinApiError: what the backend and setup tests judge by.
"""

from __future__ import annotations

import copy
import ntpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsguard.windows import sddl
from fsguard.windows.desktop import DesktopPlan
from fsguard.windows.job import JobLimits
from fsguard.windows.launch import Launch
from fsguard.windows.reparse import Link
from netguard.windows import wfp

if TYPE_CHECKING:
    from pytest import MonkeyPatch
from netguard.windows.firewall import FirewallRule
from netguard.windows.wfp import WfpPlan
from sgbase.windows.api import Proc, WinApiError
from tests.support import ntfsmodel, winkernel
from tests.support.servicesdfake import ServiceSdFake, default_sds
from tests.support.sweepfake import Running, SweepFake, Task
from tests.support.windivertfake import DivertFake

REAL_SID = "S-1-5-21-1111111111-2222222222-3333333333-1000"
WS, HOME, APPDATA = r"C:\src\proj", r"C:\Users\me", r"C:\Users\me\AppData\Local"
TOOL = r"C:\Tools\tool.exe"
FAKE_ROOT = "-----BEGIN CERTIFICATE-----\nRkFLRVJPT1Q=\n-----END CERTIFICATE-----\n"  # the machine's store
FAKE_CA = "-----BEGIN CERTIFICATE-----\nRkFLRUNB\n-----END CERTIFICATE-----\n"  # a run's inspection CA
BASE_DACL = "D:AI(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;FA;;;" + REAL_SID + ")"


@dataclass
class Machine:
    """Everything the fake's effects change; `snapshot()` compares before and after."""

    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (sid, password)
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    dacls: dict[str, str] = field(default_factory=dict)  # every existing path has one
    filters: set[str] = field(default_factory=set)  # installed WFP filter keys
    filter_readers: dict[str, str | None] = field(default_factory=dict)  # key -> SID granted FWPM_ACTRL_READ
    rules: dict[str, FirewallRule] = field(default_factory=dict)
    jobs: set[int] = field(default_factory=set)
    procs: dict[int, str] = field(default_factory=dict)  # pid -> suspended/running/exited/killed/terminated
    in_job: dict[int, int] = field(default_factory=dict)  # pid -> job
    proxies: set[int] = field(default_factory=set)
    profiles: set[str] = field(default_factory=set)  # SIDs with a profile (made at their first logon)
    denied_rights: dict[str, set[str]] = field(default_factory=dict)  # SID -> LSA deny rights held
    desktops: dict[int, str] = field(default_factory=dict)  # open private desktops: handle -> "station\\desktop"
    sds: dict[str, str] = field(default_factory=default_sds)  # WMI namespaces, DCOM limits (H3)
    running: dict[int, Running] = field(default_factory=dict)  # processes in no job (sweepfake.py)
    tasks: dict[str, Task] = field(default_factory=dict)  # the Task Scheduler's store: path -> task
    owners: dict[str, str] = field(default_factory=dict)  # path -> owner SID; absent: the real user
    links: dict[str, str] = field(default_factory=dict)  # junction -> its target (r4-run N1)


def workspace() -> Machine:
    """A workspace with a git repository, a home with ~/.ssh, and sandgate's folder in LOCALAPPDATA."""
    m = Machine()
    for path in (
        WS,
        WS + r"\.git",
        WS + r"\.git\config",
        WS + r"\.git\HEAD",  # what makes .git a git directory (acl._is_gitdir), not a `gitdir:` file
        WS + r"\.git\hooks",
        WS + r"\.vscode",
        HOME,
        HOME + r"\.ssh",
        APPDATA,
    ):
        m.dacls[path] = BASE_DACL
    m.files[TOOL] = b"MZ"  # the command the tests run, on the user's PATH (not the service's)
    m.dirs |= {WS, WS + r"\.git", WS + r"\.git\hooks", WS + r"\.vscode", HOME, HOME + r"\.ssh", APPDATA}
    return m


class FakeWinApi(DivertFake, ServiceSdFake, SweepFake):
    """WinApi over a Machine. `fail = ("set_dacl", 2)`: the second set_dacl raises. The transparent
    path's effects (WinDivert, the dynamic WFP session) are DivertFake's (windivertfake.py)."""

    def __init__(self, machine: Machine | None = None, *, admin: bool = True, exit_code: int = 7) -> None:
        super().__init__()
        self.m = machine or workspace()
        self.admin, self.exit_code = admin, exit_code
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.fail: tuple[str, int] | None = None
        self.alive: set[int] = {4242}  # our own pid, and any other live run
        self.env: dict[str, str] = {"PATH": r"C:\Windows;C:\Tools", "AWS_SECRET_ACCESS_KEY": "x" * 40, "LANG": "C"}
        self._next = 1000
        self.violations: list[str] = []  # things the backend must never do
        self.session_sid: str | None = REAL_SID  # the terminal session's user (WTSQuerySessionInformationW)
        self.desktop_sddl: dict[str, str] = {}
        self.reach_denied: dict[str, set[str]] = {}  # object -> SIDs denied on it (deny_logon_reach, U3)
        self.bound: dict[int, int] = {}  # loopback port -> what binds it (a proxy's pid, a held port: U4)
        self.unready: set[int] = set()  # proxies whose bind failed
        self.job_limits: dict[int, JobLimits] = {}
        self.nested: set[int] = set()  # pids already in another job (the Secondary Logon service's)
        self.launches: dict[int, tuple[Launch, str]] = {}  # pid -> its start, the desktop it runs on
        self.output, self.stdout, self.lost_output = b"fake output\n", list[bytes](), list[bytes]()
        #: What the command does when waited for (verify's probes): returns its exit code.
        self.program: Callable[[FakeWinApi, Launch, str], int] | None = None

    def _hit(self, name: str, *args: object) -> None:
        self.calls.append((name, args))
        if self.fail and self.fail[0] == name and sum(c[0] == name for c in self.calls) == self.fail[1]:
            raise WinApiError(f"fake failure of {name}")

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def snapshot(self) -> Machine:
        return copy.deepcopy(self.m)

    def _id(self) -> int:
        self._next += 4
        return self._next

    # who and where
    def is_admin(self) -> bool:
        self._hit("is_admin")
        return self.admin

    def current_user_sid(self) -> str:
        self._hit("current_user_sid")
        return REAL_SID

    def session_user_sid(self) -> str | None:  # the desktop's owner; another one: elevated as someone else
        self._hit("session_user_sid")
        return self.session_sid

    def local_appdata(self) -> str:
        self._hit("local_appdata")
        return APPDATA

    def home(self) -> str:
        return HOME

    def cwd(self) -> str:
        return WS

    def environ(self) -> Mapping[str, str]:
        return dict(self.env)

    def python(self) -> str:
        return r"C:\Python312\python.exe"

    code: tuple[str, ...] = ()  # sandgate's code folders (selfprotect, r2-ci C3): none unless a test says

    def code_dirs(self) -> tuple[str, ...]:
        return self.code

    # the sandbox user
    def user_sid(self, name: str) -> str | None:
        self._hit("user_sid", name)
        return self.m.users[name][0] if name in self.m.users else None

    def create_user(self, name: str, password: str) -> str:
        self._hit("create_user", name)
        sid = f"S-1-5-21-1111111111-2222222222-3333333333-{1001 + len(self.m.users)}"
        self.m.users[name] = (sid, password)
        return sid

    def set_password(self, name: str, password: str) -> None:
        self._hit("set_password", name)
        self.m.users[name] = (self.m.users[name][0], password)

    def delete_user(self, name: str) -> None:
        self._hit("delete_user", name)
        self.m.users.pop(name, None)  # NetUserDel leaves the profile: only DeleteProfileW removes it

    def delete_profile(self, sid: str) -> None:
        # https://learn.microsoft.com/en-us/windows/win32/api/userenv/nf-userenv-deleteprofilew:
        # "The caller must have administrative privileges to delete a user's profile."
        self._hit("delete_profile", sid)
        if not self.admin:
            raise WinApiError("DeleteProfileW: access denied")
        self.m.profiles.discard(sid)

    # LsaAddAccountRights/LsaRemoveAccountRights: "A system administrator can use the LSA functions"
    # https://learn.microsoft.com/en-us/windows/win32/secauthz/account-rights-constants
    def deny_logon_rights(self, sid: str, rights: tuple[str, ...]) -> None:
        self._hit("deny_logon_rights", sid, rights)
        if not self.admin:
            raise WinApiError("LsaAddAccountRights: access denied")
        self.m.denied_rights.setdefault(sid, set()).update(rights)

    def undeny_logon_rights(self, sid: str, rights: tuple[str, ...]) -> None:
        self._hit("undeny_logon_rights", sid, rights)
        if not self.admin:
            raise WinApiError("LsaRemoveAccountRights: access denied")
        left = self.m.denied_rights.pop(sid, set()) - set(rights)
        if left:
            self.m.denied_rights[sid] = left

    def protect(self, data: bytes) -> bytes:
        self._hit("protect")
        return b"DPAPI:" + data[::-1]

    def unprotect(self, sealed: bytes) -> bytes:
        self._hit("unprotect")
        if not sealed.startswith(b"DPAPI:"):
            raise WinApiError("not sealed by this user")
        return sealed[6:][::-1]

    # WFP and firewall
    def wfp_installed(self, plan: WfpPlan) -> bool:
        self._hit("wfp_installed")
        for f in plan.filters:
            if str(f.key) not in self.m.filters:
                return False
            # FwpmFilterGetByKey0 needs FWPM_ACTRL_READ on the filter; BFE's default security gives
            # Everyone only FWPM_ACTRL_OPEN and FWPM_ACTRL_CLASSIFY, administrators GENERIC_ALL:
            # https://learn.microsoft.com/en-us/windows/win32/api/fwpmu/nf-fwpmu-fwpmfiltergetbykey0
            # https://learn.microsoft.com/en-us/windows/win32/fwp/access-control
            if not self.admin and self.m.filter_readers.get(str(f.key)) != REAL_SID:
                raise WinApiError("WFP: this user may not read sandgate's WFP filters (FWPM_ACTRL_READ)")
            if plan.reader_sid is not None and self.m.filter_readers.get(str(f.key)) != plan.reader_sid:
                return False  # win32wfp.installed reads each filter's SD back: an older setup's is not enough
        return True

    def wfp_install(self, plan: WfpPlan) -> None:
        self._hit("wfp_install")
        if not self.admin:  # FWPM_ACTRL_ADD on the containers: administrators only (access-control page above)
            raise WinApiError("WFP install: access denied")
        keys = {str(f.key) for f in plan.filters}
        if keys & self.m.filters:
            raise WinApiError("FWP_E_ALREADY_EXISTS")  # as the real transaction would
        self.m.filters |= keys
        self.m.filter_readers.update((k, plan.reader_sid) for k in keys)  # FwpmFilterAdd0's sd

    def wfp_remove(self, plan: WfpPlan) -> None:
        self._hit("wfp_remove")
        if not self.admin:  # DELETE on each filter: administrators only (filter_sddl grants nothing more)
            raise WinApiError("WFP remove: access denied")
        self.m.filters -= {str(f.key) for f in plan.filters}
        for f in plan.filters:
            self.m.filter_readers.pop(str(f.key), None)

    def firewall_has(self, name: str) -> bool:
        self._hit("firewall_has", name)
        return name in self.m.rules

    def firewall_add(self, rule: FirewallRule) -> None:
        self._hit("firewall_add", rule.name)
        self.m.rules[rule.name] = rule

    def firewall_remove(self, name: str) -> None:
        self._hit("firewall_remove", name)
        self.m.rules.pop(name, None)

    # files and DACLs
    def exists(self, path: str) -> bool:
        return path in self.m.dacls or path in self.m.files or path in self.m.dirs

    def read_file(self, path: str) -> bytes | None:
        self._hit("read_file", path)
        return self.m.files.get(path)

    def write_file(self, path: str, data: bytes) -> None:
        self._hit("write_file", path)
        self._parent(path)
        self.m.files[path] = data
        self.m.dacls.setdefault(path, BASE_DACL)  # a new file gets its folder's inherited DACL
        self.violations += ntfsmodel.git_layout_errors(self.m.files, self.m.dirs)  # W8: kinds kept

    def append_line(self, path: str, line: str) -> None:
        self._hit("append_line", path, line)
        self._parent(path)
        self.m.files[path] = self.m.files.get(path, b"") + line.encode() + b"\n"

    def remove_file(self, path: str) -> None:
        self._hit("remove_file", path)
        if self.m.files.pop(path, None) is not None:
            self.m.dacls.pop(path, None)

    def list_dir(self, path: str) -> list[str]:
        self._hit("list_dir", path)
        return [ntpath.basename(p) for p in self.m.files if ntpath.dirname(p) == path]

    def make_dir(self, path: str) -> None:
        self._hit("make_dir", path)
        self._parent(path)
        if path not in self.m.dirs:
            self.m.dirs.add(path)
            self.m.dacls[path] = BASE_DACL
            self.violations += ntfsmodel.git_layout_errors(self.m.files, self.m.dirs)  # W8: kinds kept

    def remove_empty_dir(self, path: str) -> bool:
        self._hit("remove_empty_dir", path)
        if any(ntpath.dirname(p) == path for p in (*self.m.files, *self.m.dirs)):
            return False
        self.m.dirs.discard(path)
        self.m.dacls.pop(path, None)
        return True

    def _parent(self, path: str) -> None:
        if ntpath.dirname(path) not in self.m.dirs:
            raise WinApiError(f"no directory {ntpath.dirname(path)}")

    def dacl(self, path: str) -> str | None:
        self._hit("dacl", path)
        return self.m.dacls.get(path)

    def set_dacl(self, path: str, text: str, walk: bool = True) -> None:
        self._hit("set_dacl" if walk else "set_dacl_here", path, text)
        if not walk and path in self.m.dacls and not sddl.same_inheritable(self.m.dacls[path], text):
            # SetFileSecurityW does not propagate: "The SetNamedSecurityInfo and SetSecurityInfo functions
            # support automatic propagation of inheritable ACEs" (learn.microsoft.com/windows/win32/secauthz/
            # automatic-propagation-of-inheritable-aces), it does not; this model inherits dynamically, so an
            # inheritable change written without the walk would look applied below here and is refused instead
            raise AssertionError(f"{path}: an inheritable ACE changed without the walk that propagates it")
        owner = self.m.owners.get(path)
        if owner not in (None, REAL_SID) and not ntfsmodel.Ntfs(self.m, REAL_SID).allowed(path, ntfsmodel.WRITE_DAC):
            # SetNamedSecurityInfoW(DACL_SECURITY_INFORMATION) needs WRITE_DAC: an object another user owns
            # grants it only by an ACE (learn.microsoft.com/windows/win32/secauthz/standard-access-rights)
            raise WinApiError(f"SetNamedSecurityInfoW({path!r}) failed (error 5)")
        sddl.split_dacl(text)  # a malformed DACL would be refused by Windows too
        self.m.dacls[path] = ntfsmodel.windows_spelling(text)  # M4: read back in Windows' own SDDL
        if walk:  # SetFileSecurityW (walk=False) walks nothing
            self._through_links(path, text)

    def _through_links(self, path: str, text: str) -> None:
        """r4-run N1: whether SetNamedSecurityInfoW's propagation enters a junction below `path` is not
        documented (learn.microsoft.com/windows/win32/secauthz/automatic-propagation-of-inheritable-aces):
        the fake takes the worse reading and puts the inheritable ACEs on each junction's target."""
        inheritable = [a for a in sddl.split_dacl(text)[1] if {"OI", "CI"} & sddl.parse_ace(a).flags]
        for link, target in self.m.links.items():
            if link.upper().startswith(path.upper().rstrip("\\") + "\\") and target in self.m.dacls:
                for ace in inheritable:  # as inherited ACEs (ID) on the target
                    self.m.dacls[target] = sddl.with_ace(self.m.dacls[target], ace.replace(";OICI;", ";OICIID;", 1))

    def reparse_points(self, root: str) -> tuple[Link, ...]:
        self._hit("reparse_points", root)
        below = root.upper().rstrip("\\") + "\\"
        return tuple(Link(p, "\\\\?\\" + t) for p, t in self.m.links.items() if p.upper().startswith(below))

    def owner(self, path: str) -> str | None:
        self._hit("owner", path)
        return self.m.owners.get(path, REAL_SID) if self.exists(path) else None

    def pid_alive(self, pid: int) -> bool:
        self._hit("pid_alive", pid)
        return pid in self.alive

    def own_pid(self) -> int:
        return 4242

    def create_job(self, limits: JobLimits) -> int:
        self._hit("create_job")
        job = self._id()
        self.job_limits[job] = limits
        self.m.jobs.add(job)
        return job

    def close_job(self, job: int) -> None:
        self._hit("close_job", job)
        self.m.jobs.discard(job)
        for pid, j in list(self.m.in_job.items()):
            if j == job:
                del self.m.in_job[pid]
                if self.m.procs.get(pid) in ("suspended", "running"):
                    self.m.procs[pid] = "killed"

    def create_desktop(self, plan: DesktopPlan) -> tuple[int, str]:
        self._hit("create_desktop", plan.lp_desktop)
        handle = self._id()
        self.m.desktops[handle] = plan.lp_desktop
        self.desktop_sddl[plan.lp_desktop] = plan.sddl
        return handle, plan.lp_desktop

    def close_desktop(self, handle: int) -> None:
        self._hit("close_desktop", handle)
        self.m.desktops.pop(handle, None)

    def deny_logon_reach(self, sid: str, pids: tuple[int, ...]) -> int:
        """CreateProcessWithLogonW "uses the logon SID in the caller token" (learn.microsoft.com/windows/
        win32/api/winbase/nf-winbase-createprocesswithlogonw, Remarks): modelled as CMD holding the real
        user's logon SID, which the session's station and desktop and the real user's processes grant;
        an explicit deny for `sid` beats that allow (winprobefakes.logon_sid reads `reach_denied`)."""
        self._hit("deny_logon_reach", sid, pids)
        objects = ("WinSta0", "WinSta0\\Default", *(f"pid:{p}" for p in pids))
        added = [o for o in objects if sid not in self.reach_denied.setdefault(o, set())]
        for o in added:
            self.reach_denied[o].add(sid)
        return len(added)

    def start_suspended(self, launch: Launch) -> Proc:
        self._hit("start_suspended", launch.user, launch.argv, launch.cwd, dict(launch.env))
        if self.m.users.get(launch.user, ("", ""))[1] != launch.password:
            raise WinApiError("ERROR_LOGON_FAILURE")
        if "SeDenyInteractiveLogonRight" in self.m.denied_rights.get(self.m.users[launch.user][0], set()):
            raise WinApiError("ERROR_LOGON_TYPE_NOT_GRANTED")  # CreateProcessWithLogonW: an interactive logon
        winkernel.check_environment(launch.env, HOME)
        winkernel.check_command_line(launch)
        winkernel.check_application(launch, self.exists, self.m.files)
        desk = winkernel.check_desktop(launch, set(self.m.desktops.values()), self.desktop_sddl, self.m.users)
        pid = self._id()
        self.m.procs[pid] = "suspended"
        self.m.profiles.add(self.m.users[launch.user][0])  # LOGON_WITH_PROFILE loads (first: creates) it
        self.launches[pid] = (launch, desk)
        self.nested.add(pid)  # the Secondary Logon service's own job holds it already (job.py, W4)
        return Proc(pid, pid + 1, pid + 2)

    def assign(self, job: int, proc: Proc) -> None:
        self._hit("assign", job)
        if proc.pid in self.nested and self.job_limits[job].ui_restrictions:
            # AssignProcessToJobObject: a process already in a job only joins one without UI limits:
            # https://learn.microsoft.com/windows/win32/api/jobapi2/nf-jobapi2-assignprocesstojobobject
            raise WinApiError("AssignProcessToJobObject: access denied (error 5)")
        self.m.in_job[proc.pid] = job

    def resume(self, proc: Proc) -> None:
        self._hit("resume")
        if proc.pid not in self.m.in_job:
            self.violations.append("resumed a process outside the job")
        self.m.procs[proc.pid] = "running"

    def terminate(self, proc: Proc) -> None:
        self._hit("terminate")
        self.m.procs[proc.pid] = "terminated"

    def wait(self, proc: Proc) -> int:
        self._hit("wait")
        launch, desk = self.launches[proc.pid]
        code = self.program(self, launch, desk) if self.program else self.exit_code  # it runs, then exits
        self.m.procs[proc.pid] = "exited"
        # Without STARTF_USESTDHANDLES the command wrote to a console of its own (W6):
        # https://learn.microsoft.com/windows/win32/api/winbase/nf-winbase-createprocesswithlogonw
        (self.stdout if launch.stdio else self.lost_output).append(self.output)
        return code

    def close_process(self, proc: Proc) -> None:
        self._hit("close_process")
        if self.m.procs.get(proc.pid) not in ("suspended", "running"):  # a closed handle kills nothing
            self.m.procs.pop(proc.pid, None)

    def start_proxy(self, argv: tuple[str, ...]) -> Proc:
        self._hit("start_proxy", argv)
        pid = self._id()
        self.m.proxies.add(pid)
        port = int(argv[argv.index("--listen") + 1].rsplit(":", 1)[1]) if "--listen" in argv else 0
        if port in self.bound:  # its bind fails (WSAEADDRINUSE) and it exits before its ready line
            self.unready.add(pid)
        elif port:
            self.bound[port] = pid
        if "--ca-cert" in argv:  # an inspecting proxy writes its CA certificate there (launcher/run/proxy.py)
            self.m.files[argv[argv.index("--ca-cert") + 1]] = FAKE_CA.encode()
        return Proc(pid, 0)

    def system_roots(self) -> tuple[str, ...]:
        self._hit("system_roots")
        return (FAKE_ROOT,)

    def await_proxy(self, proc: Proc, timeout: float) -> None:
        self._hit("await_proxy")
        if proc.pid in self.unready:
            raise WinApiError(f"the proxy did not get ready in {timeout:.0f} s (port in use by another run?)")

    def stop_proxy(self, proc: Proc) -> None:
        self._hit("stop_proxy")
        self.m.proxies.discard(proc.pid)
        self.bound = {port: who for port, who in self.bound.items() if who != proc.pid}

    def hold_port(self, port: int) -> int:
        """One holder per loopback port: a second bind fails (SO_EXCLUSIVEADDRUSE, learn.microsoft.com/
        windows/win32/winsock/using-so-reuseaddr-and-so-exclusiveaddruse)."""
        self._hit("hold_port", port)
        if port in self.bound:
            raise WinApiError(f"127.0.0.1:{port} is in use (WSAEADDRINUSE)")
        self.bound[port] = handle = self._id()
        return handle

    def release_port(self, handle: int) -> None:
        self._hit("release_port", handle)
        self.bound = {port: who for port, who in self.bound.items() if who != handle}


def set_up(api: FakeWinApi) -> None:
    """A machine after `sandgate setup` (through the real setup code), calls forgotten."""
    from launcher.run.windows import setup

    setup.setup(api, lambda _: None)
    # as after its first run: the sandbox user's profile, made at its first logon, outlives every run
    api.m.profiles |= {sid for sid, _ in api.m.users.values()}
    api.calls.clear()


def installed(monkeypatch: MonkeyPatch, fake: FakeWinApi | None = None) -> FakeWinApi:
    """A set-up machine (`fake`, or a new one) as the Windows entry points' WinApi, with sys.platform =
    "win32": what `sandgate run/setup/cleanup` on Windows see in the tests that drive them through the CLI."""
    from launcher.run.windows import runner

    fake = fake or FakeWinApi()
    set_up(fake)
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    return fake


def sandbox_sid(api: FakeWinApi) -> str:
    (sid, _), *_ = api.m.users.values()
    return sid


def filter_count(sid: str) -> int:
    return len(wfp.plan_filters(sid, (3128,), owner=REAL_SID).filters)
