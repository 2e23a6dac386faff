"""r3-day D2: a killed sandgate must not leave the proxy child holding the filters' port.

Windows does not end a process's children when it dies; only a job with
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE whose last handle was sandgate's does ("closing the last job
object handle terminates all associated processes", learn.microsoft.com/windows/win32/api/jobapi2/
nf-jobapi2-createjobobjectw). The real WinApi's start_proxy is driven here with recording
win32job functions and a fake Popen (the binding itself is win32job's, checked by test_win_sdk).
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from fsguard.windows import job, win32job
from launcher.run.windows import win32proxyjob
from launcher.run.windows.realapi import RealWinApi
from sgbase.windows.api import WinApiError
from sgbase.windows.win32 import Win32Error

ARGV = ("python", "-P", "-m", "launcher.cli", "proxy", "--listen", "127.0.0.1:3128")


class FakeChild:
    """What Popen leaves on Windows: pid, the process handle in `_handle`, terminate/kill/wait."""

    def __init__(self, log: list[tuple[str, Any]], *args: object, **kwargs: object) -> None:
        self.pid, self._handle, self.stdout, self.log = 4242, 777, None, log
        self.alive = True
        log.append(("popen", kwargs.get("creationflags")))

    def terminate(self) -> None:
        self.log.append(("terminate", self.pid))
        self.alive = False

    def kill(self) -> None:
        self.log.append(("kill", self.pid))
        self.alive = False

    def wait(self, timeout: float | None = None) -> int:
        return 1


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    got: list[tuple[str, Any]] = []
    jobs: dict[int, job.JobLimits] = {}

    def make_job(limits: job.JobLimits) -> int:
        jobs[900 + len(jobs)] = job.check_job(limits)
        got.append(("make_job", limits))
        return 900 + len(jobs) - 1

    monkeypatch.setattr(win32job, "make_job", make_job)
    monkeypatch.setattr(win32job, "assign", lambda j, h: got.append(("assign", (j, h))))
    monkeypatch.setattr(win32job, "close_job", lambda j: got.append(("close_job", j)))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: FakeChild(got, *a, **k))
    return got


def test_the_proxy_is_in_a_kill_on_close_job_before_start_proxy_returns(log: list[tuple[str, Any]]) -> None:
    api = RealWinApi()
    proc = api.start_proxy(ARGV)
    names = [n for n, _ in log]
    assert names == ["make_job", "popen", "assign"]  # the job exists before the child
    limits = log[0][1]
    assert limits.limit_flags & job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE  # sandgate killed: the proxy dies
    assert not limits.limit_flags & job.BREAKAWAY_FLAGS and not limits.ui_restrictions
    assert log[2][1] == (900, 777)  # the job's handle and Popen's process handle
    api.stop_proxy(proc)
    assert [n for n, _ in log][3:] == ["terminate", "close_job"]  # stopped, then its job closed
    assert win32proxyjob._JOBS == {}


def test_a_proxy_that_cannot_join_its_job_is_ended_and_the_run_refused(
    log: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(j: int, h: int) -> None:
        raise Win32Error(5, "Access is denied")

    monkeypatch.setattr(win32job, "assign", refuse)
    with pytest.raises(WinApiError, match="could not join its job"):
        RealWinApi().start_proxy(ARGV)
    assert [n for n, _ in log] == ["make_job", "popen", "kill", "close_job"]  # nothing left running
    assert win32proxyjob._JOBS == {}


def test_no_job_no_proxy(log: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(limits: job.JobLimits) -> int:
        raise Win32Error(8, "Not enough memory")

    monkeypatch.setattr(win32job, "make_job", fail)
    with pytest.raises(WinApiError, match="proxy's job"):
        RealWinApi().start_proxy(ARGV)
    assert log == []  # never started outside a job
