"""A fake of the Windows backend's one OS seam (launcher/platform/windows/api.WinApi).

It keeps the state a real machine would (users, sealed passwords, files, DACLs, WFP filters,
firewall rules, jobs, processes, the proxy child), records every call in order, and can fail any
call, or its n-th occurrence, with a WinApiError: what the backend and setup tests judge by.
"""

from __future__ import annotations

import copy
import ntpath
from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.platform.windows import sddl, wfp
from launcher.platform.windows.api import Proc, WinApiError
from launcher.platform.windows.firewall import FirewallRule
from launcher.platform.windows.job import JobLimits
from launcher.platform.windows.wfp import WfpPlan

REAL_SID = "S-1-5-21-1111111111-2222222222-3333333333-1000"
WS, HOME, APPDATA = r"C:\src\proj", r"C:\Users\me", r"C:\Users\me\AppData\Local"
BASE_DACL = "D:AI(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;FA;;;" + REAL_SID + ")"


@dataclass
class Machine:
    """Everything the fake's effects change; `snapshot()` compares before and after."""

    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (sid, password)
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    dacls: dict[str, str] = field(default_factory=dict)  # every existing path has one
    filters: set[str] = field(default_factory=set)  # installed WFP filter keys
    rules: dict[str, FirewallRule] = field(default_factory=dict)
    jobs: set[int] = field(default_factory=set)
    procs: dict[int, str] = field(default_factory=dict)  # pid -> suspended/running/exited/killed/terminated
    in_job: dict[int, int] = field(default_factory=dict)  # pid -> job
    proxies: set[int] = field(default_factory=set)


def workspace() -> Machine:
    """A workspace with a git repository, a home with ~/.ssh, and sandgate's folder in LOCALAPPDATA."""
    m = Machine()
    for path in (
        WS,
        WS + r"\.git",
        WS + r"\.git\config",
        WS + r"\.git\hooks",
        WS + r"\.vscode",
        HOME,
        HOME + r"\.ssh",
        APPDATA,
    ):
        m.dacls[path] = BASE_DACL
    m.dirs |= {WS, WS + r"\.git", WS + r"\.git\hooks", WS + r"\.vscode", HOME, HOME + r"\.ssh", APPDATA}
    return m


class FakeWinApi:
    """WinApi over a Machine. `fail = ("set_dacl", 2)`: the second set_dacl raises."""

    def __init__(self, machine: Machine | None = None, *, admin: bool = True, exit_code: int = 7) -> None:
        self.m = machine or workspace()
        self.admin, self.exit_code = admin, exit_code
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.fail: tuple[str, int] | None = None
        self.alive: set[int] = {4242}  # our own pid, and any other live run
        self.env: dict[str, str] = {"PATH": r"C:\Windows", "AWS_SECRET_ACCESS_KEY": "x" * 40, "LANG": "C"}
        self._next = 1000
        self.violations: list[str] = []  # things the backend must never do

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
        self.m.users.pop(name, None)

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
        return all(str(f.key) in self.m.filters for f in plan.filters)

    def wfp_install(self, plan: WfpPlan) -> None:
        self._hit("wfp_install")
        keys = {str(f.key) for f in plan.filters}
        if keys & self.m.filters:
            raise WinApiError("FWP_E_ALREADY_EXISTS")  # as the real transaction would
        self.m.filters |= keys

    def wfp_remove(self, plan: WfpPlan) -> None:
        self._hit("wfp_remove")
        self.m.filters -= {str(f.key) for f in plan.filters}

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

    def append_line(self, path: str, line: str) -> None:
        self._hit("append_line", path, line)
        self._parent(path)
        self.m.files[path] = self.m.files.get(path, b"") + line.encode() + b"\n"

    def remove_file(self, path: str) -> None:
        self._hit("remove_file", path)
        self.m.files.pop(path, None)

    def list_dir(self, path: str) -> list[str]:
        self._hit("list_dir", path)
        return [ntpath.basename(p) for p in self.m.files if ntpath.dirname(p) == path]

    def make_dir(self, path: str) -> None:
        self._hit("make_dir", path)
        self._parent(path)
        if path not in self.m.dirs:
            self.m.dirs.add(path)
            self.m.dacls[path] = BASE_DACL

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

    def set_dacl(self, path: str, text: str) -> None:
        self._hit("set_dacl", path, text)
        sddl.split_dacl(text)  # a malformed DACL would be refused by Windows too
        self.m.dacls[path] = text

    # processes
    def pid_alive(self, pid: int) -> bool:
        self._hit("pid_alive", pid)
        return pid in self.alive

    def own_pid(self) -> int:
        return 4242

    def create_job(self, limits: JobLimits) -> int:
        self._hit("create_job")
        job = self._id()
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

    def start_suspended(
        self, user: str, password: str, argv: tuple[str, ...], cwd: str, env: Mapping[str, str]
    ) -> Proc:
        self._hit("start_suspended", user, argv, cwd, dict(env))
        if self.m.users.get(user, ("", ""))[1] != password:
            raise WinApiError("ERROR_LOGON_FAILURE")
        pid = self._id()
        self.m.procs[pid] = "suspended"
        return Proc(pid, pid + 1, pid + 2)

    def assign(self, job: int, proc: Proc) -> None:
        self._hit("assign", job)
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
        self.m.procs[proc.pid] = "exited"
        return self.exit_code

    def close_process(self, proc: Proc) -> None:
        self._hit("close_process")
        if self.m.procs.get(proc.pid) not in ("suspended", "running"):  # a closed handle kills nothing
            self.m.procs.pop(proc.pid, None)

    def start_proxy(self, argv: tuple[str, ...]) -> Proc:
        self._hit("start_proxy", argv)
        pid = self._id()
        self.m.proxies.add(pid)
        return Proc(pid, 0)

    def await_proxy(self, proc: Proc, timeout: float) -> None:
        self._hit("await_proxy")

    def stop_proxy(self, proc: Proc) -> None:
        self._hit("stop_proxy")
        self.m.proxies.discard(proc.pid)


def set_up(api: FakeWinApi) -> None:
    """A machine after `sandgate setup` (through the real setup code), calls forgotten."""
    from launcher.platform.windows import setup

    setup.setup(api, lambda _: None)
    api.calls.clear()


def sandbox_sid(api: FakeWinApi) -> str:
    (sid, _), *_ = api.m.users.values()
    return sid


def filter_count(sid: str) -> int:
    return len(wfp.plan_filters(sid, (3128,)).filters)
