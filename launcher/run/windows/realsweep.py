"""The real WinApi's teardown-sweep effects (sweep.SweepApi): each one call into win32sweep.py or
win32tasks.py, the sandbox user's rights taken by impersonating its LogonUserW token in a thread of
sandgate's own (win32sweep.as_user). Holds no decision (sweep.py's). Never run yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsguard.windows import launch, win32sweep, win32tasks
from fsguard.windows.sweep import Opened, TaskSeen
from sgbase.windows.api import WinApiError


def _call(what: str, f: Callable[..., Any], *args: object) -> Any:
    try:
        return f(*args)
    except OSError as e:
        if what == "LogonUserW" and isinstance(e.errno, int) and e.errno in launch.HINTS:
            raise WinApiError(launch.hint(e.errno, "the sweep as the sandbox user")) from None
        raise WinApiError(f"{what}: {e.strerror or e}") from None


class RealSweepApi:
    """Mixed into RealWinApi."""

    def sweep_logon(self, user: str, password: str) -> int:
        token: int = _call("LogonUserW", win32sweep.logon, user, password)
        return token

    def sweep_end(self, token: int) -> None:
        _call("CloseHandle", win32sweep.close, token)

    def sweep_pids(self) -> list[int]:
        pids: list[int] = _call("CreateToolhelp32Snapshot", win32sweep.pids)
        return pids

    def sweep_open(self, token: int, pid: int) -> Opened | None:
        got = _call("OpenProcess", win32sweep.as_user, token, lambda: win32sweep.open_process(pid))
        return Opened(*got) if got else None

    def sweep_terminate(self, token: int, handle: int) -> None:
        _call("TerminateProcess", win32sweep.terminate, handle)  # the handle carries the access

    def sweep_close(self, handle: int) -> None:
        _call("CloseHandle", win32sweep.close, handle)

    def sweep_tasks(self, token: int) -> list[TaskSeen]:
        rows = _call("the Task Scheduler (Schedule.Service)", win32sweep.as_user, token, win32tasks.tasks)
        return [TaskSeen(*row) for row in rows]

    def sweep_delete_task(self, token: int, path: str) -> None:
        _call(f"deleting the scheduled task {path}", win32sweep.as_user, token, lambda: win32tasks.delete(path))
