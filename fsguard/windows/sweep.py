r"""The teardown sweep (issue 28, H3): what the sandbox user left outside the run's job, ended.

Threat: a process of the sandbox user that is not in the job (a scheduled task's action, a process
a service started for it, anything that escaped) survives KILL_ON_JOB_CLOSE, and an interactive-token
task it registered (`schtasks /create` without /ru) runs again later. Both keep the sandbox
user's WFP filters and ACLs (they are per SID), but they outlive the run and share the next run's
grants. After the job is closed, the backend sweeps as the sandbox user: every task it can see whose
principal or owner is the sandbox SID is deleted, every process whose token user is the sandbox SID
is terminated, round after round until one finds nothing (or ROUNDS is reached: what is left is
reported, never ignored). Another user's process or task is never touched: a process is ended
only through a handle whose token user was read as the sandbox SID; a task only if its principal
resolves to, or its owner is, the sandbox SID.

Why as the sandbox user: the real user cannot open another user's processes (a process's default
DACL grants its own user and SYSTEM), nor see its tasks (MS-TSCH: enumeration skips tasks the
caller cannot read; deletion needs delete access). Why impersonated in sandgate's own threads and
not a process started as the sandbox user: any surviving process of that user could open such a
process (same user), kill it, inject into it or forge its output; sandgate's own process is the
real user's, out of their reach. The token comes from LogonUserW with the sealed password
("a process ... created the token using explicit credentials through LogonUser": no privilege needed,
ImpersonateLoggedOnUser docs).

A run marks the sweep pending before CMD starts (a file named like its journal, `.sweep`): a
sandgate killed mid-run leaves it, and the next run or `sandgate cleanup` sweeps first. While
another run of the sandbox user is live, nothing is swept (its processes are that run's command).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sgbase.windows import state
from sgbase.windows.api import FileApi, WinApiError

#: Sweep rounds before what is left is reported: a task firing or a process spawning between two
#: rounds is caught by the next; one that keeps coming back is a survivor, said in one line.
ROUNDS = 5
MARK = ".sweep"


@dataclass(frozen=True)
class Opened:
    """A process the sandbox user's token could open (terminate, query, synchronize)."""

    handle: int
    sid: str  # its token's user (GetTokenInformation TokenUser), read through this handle


@dataclass(frozen=True)
class TaskSeen:
    """A scheduled task the sandbox user can read."""

    path: str  # "\\folder\\name"
    user_sid: str  # its principal's UserId resolved to a SID ("": none, or not resolvable)
    owner: str  # its security descriptor's owner SID: the registrant ("": unknown)


@dataclass(frozen=True)
class Swept:
    killed: tuple[int, ...] = ()
    deleted: tuple[str, ...] = ()
    survivors: tuple[int, ...] = ()
    tasks_left: tuple[str, ...] = ()
    error: str | None = None  # the sweep could not run, or could not look (logon, enumeration)
    skipped: bool = False  # another run of the sandbox user is live: nothing looked at

    @property
    def clean(self) -> bool:
        return not (self.survivors or self.tasks_left or self.error)


class SweepApi(Protocol):
    """The effects the sweep takes (part of launcher.run.windows.winapi.WinApi). `token` is the
    LogonUserW token; every call that takes it runs impersonating it."""

    def sweep_logon(self, user: str, password: str) -> int: ...
    def sweep_end(self, token: int) -> None: ...
    def sweep_pids(self) -> list[int]: ...  # every process id, any user's (Toolhelp snapshot)
    def sweep_open(self, token: int, pid: int) -> Opened | None: ...  # None: refused, gone or exited
    def sweep_terminate(self, token: int, handle: int) -> None: ...  # and waits briefly for the exit
    def sweep_close(self, handle: int) -> None: ...
    def sweep_tasks(self, token: int) -> list[TaskSeen]: ...  # every folder, hidden tasks too
    def sweep_delete_task(self, token: int, path: str) -> None: ...


def ours(task: TaskSeen, sid: str) -> bool:
    return sid.upper() in (task.user_sid.upper(), task.owner.upper())


@dataclass
class _Tally:
    killed: list[int] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def sweep(api: SweepApi, user: str, password: str, sid: str, own_pid: int, rounds: int = ROUNDS) -> Swept:
    """End the sandbox user's processes and delete its tasks, as that user; never raises."""
    try:
        token = api.sweep_logon(user, password)
    except WinApiError as e:
        return Swept(error=f"could not log on as {user} to sweep: {e}")
    tally = _Tally()
    try:
        for _ in range(rounds):
            if not _round(api, token, sid, own_pid, tally):
                return Swept(tuple(tally.killed), tuple(tally.deleted))
        procs, tasks = _look(api, token, sid, own_pid)
        for h in procs.values():
            api.sweep_close(h)
        return Swept(tuple(tally.killed), tuple(tally.deleted), tuple(sorted(procs)), tuple(sorted(tasks)))
    except WinApiError as e:
        return Swept(tuple(tally.killed), tuple(tally.deleted), error=f"the sweep could not look: {e}")
    finally:
        api.sweep_end(token)


def _look(api: SweepApi, token: int, sid: str, own_pid: int) -> tuple[dict[int, int], list[str]]:
    """The sandbox user's live processes (pid -> an open handle) and its tasks."""
    procs: dict[int, int] = {}
    for pid in api.sweep_pids():
        if pid == own_pid:
            continue
        got = api.sweep_open(token, pid)
        if got is None:
            continue  # another user's (refused), or gone
        if got.sid.upper() == sid.upper():
            procs[pid] = got.handle
        else:
            api.sweep_close(got.handle)  # opened, but not the sandbox user's: never touched
    return procs, [t.path for t in api.sweep_tasks(token) if ours(t, sid)]


def _round(api: SweepApi, token: int, sid: str, own_pid: int, tally: _Tally) -> bool:
    """One round: processes first (they may register tasks), then tasks. True: it found something."""
    procs, tasks = _look(api, token, sid, own_pid)
    for pid, handle in procs.items():
        try:
            api.sweep_terminate(token, handle)
            tally.killed.append(pid)
        except WinApiError:
            pass  # still there next round; a survivor if it stays
        finally:
            api.sweep_close(handle)
    for path in tasks:
        try:
            api.sweep_delete_task(token, path)
            tally.deleted.append(path)
        except WinApiError:
            pass
    return bool(procs or tasks)


def describe(swept: Swept) -> str | None:
    """The one line for a sweep that was not clean (None when it was)."""
    if swept.clean:
        return None
    if swept.error and not (swept.survivors or swept.tasks_left):
        return f"the sandbox user's leftover processes and scheduled tasks were not swept: {swept.error}"
    parts = []
    if swept.survivors:
        parts.append(f"{len(swept.survivors)} process(es) (pid {', '.join(map(str, swept.survivors))})")
    if swept.tasks_left:
        parts.append(f"{len(swept.tasks_left)} scheduled task(s) ({', '.join(swept.tasks_left)})")
    left = " and ".join(parts) or "an unknown part"
    why = f": {swept.error}" if swept.error else ""
    return f"the sandbox user's {left} survived the sweep{why}"


def marker(journal: str) -> str:
    """The run's pending-sweep mark, beside its ACL journal (`<pid>-<task>.jsonl` -> `.sweep`)."""
    return journal.removesuffix(".jsonl") + MARK


def marker_pid(name: str) -> int | None:
    head, _, rest = name.partition("-")
    return int(head) if head.isdigit() and rest.endswith(MARK) else None


def pending(api: FileApi, folder: str) -> tuple[list[str], bool]:
    """(the pending marks of runs that are gone, whether another run is live) in the journal folder.
    A live run is any journal or mark whose pid is alive and not ours: its processes are its command."""
    dead: list[str] = []
    other = False
    for name in api.list_dir(folder):
        pid = marker_pid(name) or state.journal_pid(name)
        if pid is None or pid == api.own_pid():
            continue
        if api.pid_alive(pid):
            other = True
        elif name.endswith(MARK):
            dead.append(f"{folder}\\{name}")
    return sorted(dead), other
