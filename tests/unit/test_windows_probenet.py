"""The H3/H4 probe bodies (probenet.py): the scripts compile, every row is registered, and each
judge fails the escape, fails a probe that could not run, and passes only the refusal with its
permitted control (scripts run only on Windows)."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from selftest.windows import allbodies, probebody, probenet, probes, verifyrun
from selftest.windows.probebody import Verdict


def test_scripts_compile_and_rows_are_registered() -> None:
    for body in probenet.BODIES:
        compile(body.script, body.name, "exec")
        assert body.name in probes.WINDOWS_ONLY
        assert body in allbodies.bodies()
        assert probebody.RESULT in body.script


@pytest.mark.parametrize("body", probenet.BODIES, ids=lambda b: b.name)
def test_a_probe_that_did_not_run_fails(body: probebody.ProbeBody) -> None:
    assert not body.judge(1, None).ok


def test_scheduled_task() -> None:
    j = probenet.judge_task
    assert not j(0, {"control": 0, "create": [0, ""], "escaped": True}).ok
    assert not j(0, {"control": 1, "create": [1, "denied"], "escaped": False}).ok  # no control
    assert j(0, {"control": 0, "create": [1, "Access is denied"], "escaped": False}).ok
    v = j(0, {"control": 0, "create": [0, ""], "escaped": False})
    assert v.ok and "never ran" in v.detail


def test_wmi_process() -> None:
    j = probenet.judge_wmi
    assert not j(0, {"control_in_job": True, "pid": 77, "outside_job": True}).ok
    assert not j(0, {"control_in_job": True, "pid": 77, "outside_job": None}).ok  # made, not inspected
    assert not j(0, {"control_in_job": False, "pid": 0, "outside_job": None}).ok
    denied, com = [1, "Invoke-CimMethod : Access denied (0x80041003)"], [1, "80070005 Access is denied."]
    assert j(0, {"control_in_job": True, "pid": 0, "outside_job": None, "created": denied, "com": com}).ok
    assert j(0, {"control_in_job": True, "pid": 77, "outside_job": False, "com": com}).ok  # stayed in the job


def test_smb_webdav_is_a_known_gap_unless_refused() -> None:
    j = probenet.judge_smb
    gap = j(0, {"control": True, "smb": [53, "bad netpath"], "webdav": [67, ""], "webclient_running": True})
    assert not gap.ok and gap.gap and "known gap" in gap.detail
    broken = j(0, {"control": False, "smb": [5, ""], "webdav": [5, ""], "webclient_running": False})
    assert not broken.ok and not broken.gap  # a probe that proves nothing is a failure, not the gap
    assert not j(1, None).ok and not j(1, None).gap
    assert j(0, {"control": True, "smb": [5, ""], "webdav": [5, ""], "webclient_running": False}).ok


def test_smb_counts_only_access_denied_and_webdav_a_stopped_webclient() -> None:
    """The decision (docs/windows.md, H4): a firewall block on 445 shows as bad net path or a
    timeout, as an unanswered leak does; neither is a refusal. A WebDAV attempt that failed while
    WebClient stayed stopped had no service to carry it."""
    j = probenet.judge_smb
    for smb in ([53, "bad netpath"], [121, "semaphore timeout"], [-1, "no answer within 15 s"], [65, "net denied"]):
        v = j(0, {"control": True, "smb": smb, "webdav": [5, ""], "webclient_running": False})
        assert not v.ok and "cannot be told" in v.detail
    assert j(0, {"control": True, "smb": [5, ""], "webdav": [67, "bad net name"], "webclient_running": False}).ok
    running = j(0, {"control": True, "smb": [5, ""], "webdav": [67, ""], "webclient_running": True})
    assert not running.ok and "cannot be told" not in running.detail
    assert not j(0, {"control": True, "smb": [5, ""], "webdav": [0, "listed"], "webclient_running": False}).ok


def test_a_known_gap_is_printed_on_every_run_never_passed_and_not_counted_as_a_failure() -> None:
    """The H4 decision: the row stays visible (GAP, and in the summary), the exit code counts real failures."""
    gap = probenet.judge_smb(0, {"control": True, "smb": [53, "x"], "webdav": [67, ""], "webclient_running": True})
    ok, bad = Verdict(True, "fine"), Verdict(False, "leaked")
    lines: list[str] = []
    assert verifyrun.report([("a", ok), ("smb_webdav", gap)], 0, lines.append) == 0
    assert lines[1].startswith("  GAP   smb_webdav") and "1 passed, 0 failed, 1 known gaps" in lines[-1]
    lines.clear()
    assert verifyrun.report([("a", bad), ("smb_webdav", gap)], 0, lines.append) == 1
    assert lines[0].startswith("  FAIL  a") and "0 passed, 1 failed, 1 known gaps" in lines[-1]


class _Kernel32:
    """What the WMI body asks kernel32, on a machine where every process is in SOME job: the run's
    (the body, its own child) nested in Secondary Logon's, WmiPrvSE's for what WMI starts."""

    def __init__(self, own_job: set[int], any_job: set[int]) -> None:
        self.own, self.any, self.killed = own_job, any_job, list[int]()

        def open_process(access: int, inherit: bool, pid: int) -> int:
            return pid + 10000

        def is_process_in_job(h: Any, job: object, flag: Any) -> int:
            flag._obj.value = int(getattr(h, "value", h)) - 10000 in self.any  # NULL job: "any job"
            return 1

        def query(job: object, cls: int, buf: Any, size: int, ret: object) -> int:
            assert job is None and cls == 3  # the caller's own immediate job, JobObjectBasicProcessIdList
            got = buf._obj
            got.assigned = got.listed = len(self.own)
            for i, pid in enumerate(sorted(self.own)):
                got.ids[i] = pid
            return 1

        def terminate(h: Any, code: int) -> int:
            self.killed.append(int(getattr(h, "value", h)) - 10000)
            return 1

        self.OpenProcess, self.IsProcessInJob = open_process, is_process_in_job
        self.QueryInformationJobObject, self.TerminateProcess = query, terminate


def _run_wmi_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: _Kernel32) -> dict[str, Any]:
    """probenet.WMI executed here, its Win32 and child processes faked: WMI made pid 600."""
    child = SimpleNamespace(pid=500, kill=lambda: None)

    def run(args: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        text = "0 600" if "Invoke-CimMethod" in " ".join(args) else "SANDGATE-COM-MADE"
        return subprocess.CompletedProcess(args, 0, text, "")

    monkeypatch.setattr(ctypes, "WinDLL", lambda name, use_last_error=False: k, raising=False)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: child)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    exec(compile(probenet.WMI, "wmi_process", "exec"), {"__name__": "__main__"})
    got: dict[str, Any] = json.loads((tmp_path / probebody.RESULT).read_text())
    return got


def test_the_wmi_body_tells_the_runs_job_from_any_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """win-divert review: IsProcessInJob(h, NULL) answers "in any job", and what WMI starts sits in
    WmiPrvSE's job: the body must ask its own job's pid list, or an escape reads as "in the job"."""
    k = _Kernel32(own_job={500}, any_job={500, 600})
    got = _run_wmi_body(tmp_path, monkeypatch, k)
    assert got["control_in_job"] is True and got["pid"] == 600 and got["outside_job"] is True
    assert k.killed == [600]  # never left behind
    assert not probenet.judge_wmi(0, got).ok
    # Control: a process WMI made inside the run's job is "in the job".
    (tmp_path / probebody.RESULT).unlink()
    k2 = _Kernel32(own_job={500, 600}, any_job={500, 600})
    assert _run_wmi_body(tmp_path, monkeypatch, k2)["outside_job"] is False
