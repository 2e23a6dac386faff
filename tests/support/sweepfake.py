r"""The fake WinApi's teardown-sweep effects (fsguard/windows/sweep.py), with the documented
contracts enforced: processes outside any job and scheduled tasks, on the fake Machine.

Mixed into winfake.FakeWinApi (which supplies `_hit`, `m`, `violations`). Contracts:
- LogonUserW needs the account's password and a logon type it is not denied (interactive here).
  https://learn.microsoft.com/en-us/windows/win32/api/winbase/nf-winbase-logonuserw
- The process list is readable by every user ("All users have read access to the list of
  processes"); OpenProcess is an access check against the process's DACL, which a token's default
  DACL makes: its user and SYSTEM (a process may carry a wider one: `grants`). A handle opened
  with PROCESS_TERMINATE ends the process; the token user is read through the handle.
  https://learn.microsoft.com/en-us/windows/win32/procthread/process-enumeration
  https://learn.microsoft.com/en-us/windows/win32/procthread/process-security-and-access-rights
- Task registration ([MS-TSCH] 3.2.5.1.1): a non-administrator registers an interactive-token task
  for itself without a password; for anyone else it needs their password (not modelled: refused).
  A task's security descriptor grants its registrant (the principal's "Allow" ACE), SYSTEM and
  Administrators; enumeration skips tasks the caller cannot read (SchRpcEnumTasks); deletion
  needs delete access, else E_ACCESSDENIED (SchRpcDelete).
  https://learn.microsoft.com/en-us/openspecs/windows_protocols/ms-tsch/360bb9b1-dd2a-4b36-83ee-21f12cb97cff
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fsguard.windows.sweep import Opened, TaskSeen
from sgbase.windows.api import WinApiError

SYSTEM, ADMINS, EVERYONE = "S-1-5-18", "S-1-5-32-544", "S-1-1-0"


@dataclass
class Running:
    """A process outside every job (escaped, or another user's)."""

    user: str  # its token user SID
    grants: tuple[str, ...]  # SIDs its DACL grants PROCESS_TERMINATE | QUERY_LIMITED | SYNCHRONIZE
    alive: bool = True


@dataclass
class Task:
    principal: str  # the UserId as registered: a SID or an account name
    owner: str  # the registrant (the security descriptor's owner)
    readers: tuple[str, ...]
    deleters: tuple[str, ...]
    logon: str = "interactive"


class SweepFake:
    """LogonUserW tokens, the process list and the task store over `self.m.running` / `self.m.tasks`."""

    m: Any
    violations: list[str]
    next_handle = 90000

    def _hit(self, name: str, *args: object) -> None:  # pragma: no cover - FakeWinApi's
        raise NotImplementedError

    def _tokens(self) -> dict[int, str]:
        return self.__dict__.setdefault("_sweep_tokens", {})  # type: ignore[no-any-return]

    def _handles(self) -> dict[int, int]:
        return self.__dict__.setdefault("_sweep_handles", {})  # type: ignore[no-any-return]

    def _sid(self, token: int) -> str:
        if token not in self._tokens():
            raise WinApiError("ERROR_INVALID_HANDLE: not a token")
        return self._tokens()[token]

    # the machine's other side: what the tests' programs do
    def spawn_outside(self, user: str, grants: tuple[str, ...] | None = None) -> int:
        """A process of `user` in no job (its default DACL: its user and SYSTEM, unless `grants`)."""
        self.next_handle += 4
        pid = self.next_handle
        self.m.running[pid] = Running(user, grants if grants is not None else (user, SYSTEM))
        return pid

    def register_task(self, sid: str, path: str, principal: str | None = None, *, admin: bool = False) -> None:
        """ITaskFolder::RegisterTaskDefinition by `sid` for `principal` (default: itself), interactive token."""
        who = principal or sid
        if not admin and who not in (sid, self._name_of(sid)):
            raise WinApiError("E_ACCESSDENIED: another user's task needs that user's password")
        self.m.tasks[path] = Task(who, sid, (sid, SYSTEM, ADMINS), (sid, SYSTEM, ADMINS))

    def _name_of(self, sid: str) -> str:
        return next((n for n, (s, _) in self.m.users.items() if s == sid), "")

    def live(self, user: str) -> list[int]:
        return sorted(pid for pid, p in self.m.running.items() if p.alive and p.user == user)

    # the WinApi side (sweep.SweepApi)
    def sweep_logon(self, user: str, password: str) -> int:
        self._hit("sweep_logon", user)
        if self.m.users.get(user, ("", None))[1] != password:
            raise WinApiError("LogonUserW: ERROR_LOGON_FAILURE")
        sid = self.m.users[user][0]
        if "SeDenyInteractiveLogonRight" in self.m.denied_rights.get(sid, set()):
            raise WinApiError("LogonUserW: ERROR_LOGON_TYPE_NOT_GRANTED")
        self.next_handle += 4
        self._tokens()[self.next_handle] = sid
        return self.next_handle

    def sweep_end(self, token: int) -> None:
        self._hit("sweep_end")
        self._tokens().pop(token, None)

    def sweep_pids(self) -> list[int]:
        self._hit("sweep_pids")
        cmd = [pid for pid, state in self.m.procs.items() if state in ("suspended", "running")]
        return sorted({4242, *cmd, *(pid for pid, p in self.m.running.items() if p.alive)})

    def _process(self, pid: int) -> Running | None:
        if pid in self.m.running:
            p: Running = self.m.running[pid]
            return p if p.alive else None
        if self.m.procs.get(pid) in ("suspended", "running"):  # CMD itself: still in its job
            launches: dict[int, Any] = self.launches  # type: ignore[attr-defined]
            user = self.m.users[launches[pid][0].user][0]
            return Running(user, (user, SYSTEM))
        return None

    def sweep_open(self, token: int, pid: int) -> Opened | None:
        self._hit("sweep_open", pid)
        sid = self._sid(token)
        p = self._process(pid)
        if p is None:
            return None  # gone, or sandgate's own (the real user's: refused)
        if sid not in p.grants and EVERYONE not in p.grants:
            return None  # ERROR_ACCESS_DENIED: the DACL grants this token nothing
        self.next_handle += 4
        self._handles()[self.next_handle] = pid
        return Opened(self.next_handle, p.user)

    def sweep_terminate(self, token: int, handle: int) -> None:
        self._hit("sweep_terminate")
        self._sid(token)
        pid = self._handles().get(handle)
        if pid is None:
            raise WinApiError("TerminateProcess: ERROR_INVALID_HANDLE")
        if pid in self.m.running:
            self.m.running[pid].alive = False
        else:
            self.m.procs[pid] = "terminated"

    def sweep_close(self, handle: int) -> None:
        self._hit("sweep_close")
        if self._handles().pop(handle, None) is None:
            self.violations.append(f"closed handle {handle} twice or never opened")

    def sweep_tasks(self, token: int) -> list[TaskSeen]:
        self._hit("sweep_tasks")
        sid = self._sid(token)
        seen = []
        for path, t in sorted(self.m.tasks.items()):
            if sid in t.readers or EVERYONE in t.readers:
                resolved = t.principal if t.principal.startswith("S-1-") else self.m.users.get(t.principal, ("",))[0]
                seen.append(TaskSeen(path, resolved, t.owner))
        return seen

    def sweep_delete_task(self, token: int, path: str) -> None:
        self._hit("sweep_delete_task", path)
        sid = self._sid(token)
        t = self.m.tasks.get(path)
        if t is None:
            raise WinApiError("DeleteTask: ERROR_FILE_NOT_FOUND")
        if sid not in t.deleters and EVERYONE not in t.deleters:
            raise WinApiError("DeleteTask: E_ACCESSDENIED")
        del self.m.tasks[path]

    def sweep_leaks(self) -> list[str]:
        """Tokens or process handles the sweep left open."""
        return [f"token {t}" for t in self._tokens()] + [f"process handle {h}" for h in self._handles()]
