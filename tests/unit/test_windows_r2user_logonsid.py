"""r2-user U3 (win-proc R9): CMD's token likely holds the real user's logon SID.

CreateProcessWithLogonW "uses the logon SID in the caller token" (its Remarks,
https://learn.microsoft.com/windows/win32/api/winbase/nf-winbase-createprocesswithlogonw), and the
interactive window station and desktop grant that logon SID. The mitigation: an explicit deny for the
sandbox SID on sandgate's own station, desktop and processes, before CMD starts; the verify row
`logon_sid` reports what CMD can still open. Fake evidence only (Windows never ran this).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from fsguard.windows import logonreach, sddl, win32logonreach, win32proc
from launcher import cli
from launcher.run.windowsbackend import WindowsBackend
from selftest.windows import allbodies, probelogon, probes
from sgbase.windows.api import Proc
from sgbase.windows.win32 import Win32Error
from tests.support import winfake, winkernel
from tests.support.winfake import REAL_SID, FakeWinApi

SANDBOX_SID = "S-1-5-21-1-2-3-1001"
LOGON_SID = "S-1-5-5-0-99"  # the real user's logon SID: in their token and, per U3, in CMD's
WINSTA_ENUMDESKTOPS, DESKTOP_HOOKCONTROL, PROCESS_VM_READ = 0x0001, 0x0008, 0x0010


def granted(dacl: str, token: set[str], want: int) -> bool:
    """The documented access check over a DACL in order: a deny naming a token SID and any wanted bit
    refuses; allows add up (https://learn.microsoft.com/windows/win32/secauthz/how-dacls-control-access-to-an-object)."""
    left = want
    for ace in sddl.split_dacl(dacl)[1]:
        got = sddl.parse_ace(ace)
        if "IO" in got.flags or sddl.sid_of(got.sid) not in token:
            continue
        if got.kind in ("D",) and got.mask & left:
            return False
        if got.kind == "A":
            left &= ~got.mask
        if not left:
            return True
    return False


class SessionKernel(winkernel.FakeKernel):
    """The fake DLL functions plus the interactive session's objects, each with the DACL Windows gives
    it: WinSta0 and Default grant the logon SID (Win32 "Logon": the station's owner and ACEs are the
    LogonSid's, STANDARD_RIGHTS_REQUIRED included), a process the default DACL's user, SYSTEM and
    the logon SID's read and execute."""

    def __init__(self) -> None:
        super().__init__()
        self.station_names: dict[int, str] = {}
        self.objects = {
            "WinSta0": f"D:(A;;0xf037f;;;{LOGON_SID})(A;;0xf037f;;;SY)",
            "Default": f"D:(A;;0xf01ff;;;{LOGON_SID})(A;;0xf01ff;;;SY)",
            "pid:4242": f"D:(A;;0x1fffff;;;{REAL_SID})(A;;0x1fffff;;;SY)(A;;0x121411;;;{LOGON_SID})",
            "pid:4300": f"D:(A;;0x1fffff;;;{REAL_SID})(A;;0x1fffff;;;SY)(A;;0x121411;;;{LOGON_SID})",
        }
        self.station = self._named("WinSta0")
        self.own_desktop = self._named("Default")
        self.opened: list[tuple[str, int]] = []

    def _named(self, name: str) -> int:
        h = self._handle()
        self.station_names[h], self.station_dacl[h] = name, self.objects[name]
        return h

    def OpenWindowStationW(self, name: str, inherit: int, access: int) -> int:
        self.opened.append((name, access))
        return self._named(name) if name in self.objects else self._fail(2)

    def OpenDesktopW(self, name: str, flags: int, inherit: int, access: int) -> int:
        # "opens the specified desktop object" in the caller's window station (OpenDesktopW docs)
        assert self.station_names[self.station] == "WinSta0"
        self.opened.append((name, access))
        return self._named(name) if name in self.objects else self._fail(2)

    def GetThreadDesktop(self, tid: int) -> int:
        assert tid == threading.get_native_id()  # the calling thread's own id (GetCurrentThreadId's value)
        return self.own_desktop

    def OpenProcess(self, access: int, inherit: int, pid: int) -> int:
        self.opened.append((f"pid:{pid}", access))
        return self._named(f"pid:{pid}") if f"pid:{pid}" in self.objects else self._fail(87)

    def SetSecurityInfo(self, h: int, kind: int, info: int, o: Any, g: Any, dacl: Any, s: Any) -> int:
        assert kind == (6 if self.station_names[h].startswith("pid:") else 7)  # SE_KERNEL_OBJECT / SE_WINDOW_OBJECT
        self.objects[self.station_names[h]] = self.sds[int(dacl.value)]
        return super().SetSecurityInfo(h, kind, info, o, g, dacl, s)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> SessionKernel:
    k = SessionKernel()
    winkernel.install(monkeypatch, k)
    monkeypatch.setattr(win32proc, "fn", winkernel.marshalled(k))
    monkeypatch.setattr(win32logonreach, "fn", winkernel.marshalled(k))
    return k


CMD = {SANDBOX_SID, LOGON_SID}  # the token U3 fears: the sandbox user with the real user's logon SID


def test_without_the_deny_the_logon_sid_opens_the_users_desktop_and_processes(kernel: SessionKernel) -> None:
    """The control: the model grants what U3 describes, so the tests below can fail."""
    assert granted(kernel.objects["WinSta0"], CMD, WINSTA_ENUMDESKTOPS)
    assert granted(kernel.objects["Default"], CMD, DESKTOP_HOOKCONTROL)
    assert granted(kernel.objects["pid:4242"], CMD, PROCESS_VM_READ)


def test_the_deny_comes_first_and_beats_the_logon_sid_allow(kernel: SessionKernel) -> None:
    assert win32logonreach.deny_reach(SANDBOX_SID, (4242, 4300)) == 4
    deny = logonreach.ReachDenial(SANDBOX_SID)
    for name, ace, want in (
        ("WinSta0", deny.station, WINSTA_ENUMDESKTOPS),
        ("Default", deny.desktop, DESKTOP_HOOKCONTROL),
        ("pid:4242", deny.process, PROCESS_VM_READ),
        ("pid:4300", deny.process, PROCESS_VM_READ),
    ):
        assert sddl.same_ace(sddl.split_dacl(kernel.objects[name])[1][0], ace)  # first: canonical order
        assert not granted(kernel.objects[name], CMD, want)
        assert granted(kernel.objects[name], {REAL_SID, LOGON_SID}, want)  # the real user keeps everything
    # opened by name / pid with READ_CONTROL | WRITE_DAC only, never more
    assert {a for _, a in kernel.opened} == {0x00020000 | 0x00040000}
    assert kernel.open <= {kernel.station, kernel.own_desktop}  # every handle it opened is closed again


def test_the_deny_is_added_once(kernel: SessionKernel) -> None:
    win32logonreach.deny_reach(SANDBOX_SID, (4242,))
    before = dict(kernel.objects)
    assert win32logonreach.deny_reach(SANDBOX_SID, (4242,)) == 0
    assert kernel.objects == before


def test_a_null_dacl_is_said_never_replaced_by_a_lone_deny(kernel: SessionKernel) -> None:
    kernel.objects["WinSta0"] = "D:NO_ACCESS_CONTROL"
    kernel.station_dacl[kernel.station] = "D:NO_ACCESS_CONTROL"
    with pytest.raises(Win32Error, match="NULL DACL"):
        win32logonreach.deny_reach(SANDBOX_SID, ())
    assert kernel.objects["WinSta0"] == "D:NO_ACCESS_CONTROL"


def test_a_pid_that_is_gone_is_an_error_not_a_silent_pass(kernel: SessionKernel) -> None:
    with pytest.raises(Win32Error, match="OpenProcess"):
        win32logonreach.deny_reach(SANDBOX_SID, (9999,))


def test_reach_denial_refuses_what_is_not_a_sid() -> None:
    with pytest.raises(ValueError):
        logonreach.ReachDenial("S-1-5-21-1)(A;;GA;;;WD")
    assert logonreach.ReachDenial(SANDBOX_SID).process == f"(D;;0x1fffff;;;{SANDBOX_SID})"


# ---- the backend: before CMD exists, with the proxy's pid; a refusal is said, the run goes on ---------


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def test_a_run_denies_before_cmd_starts_and_names_sandgate_and_the_proxy(api: FakeWinApi) -> None:
    started: list[int] = []
    start_proxy = api.start_proxy

    def recorded(argv: tuple[str, ...]) -> Proc:
        proc = start_proxy(argv)
        started.append(proc.pid)
        return proc

    api.start_proxy = recorded  # type: ignore[method-assign]
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 7
    names = api.names()
    assert names.index("start_proxy") < names.index("deny_logon_reach") < names.index("start_suspended")
    ((sid, pids),) = [args for name, args in api.calls if name == "deny_logon_reach"]
    assert sid == winfake.sandbox_sid(api) and pids == (api.own_pid(), *started)


def test_a_refused_deny_is_one_warning_and_the_run_still_runs(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.fail = ("deny_logon_reach", 1)
    assert cli.main(["run", "--", "tool"]) == 7
    err = capsys.readouterr().err
    assert "fake failure of deny_logon_reach" in err and "Known gaps" in err and "Traceback" not in err


# ---- sandgate verify's row -------------------------------------------------------------------------


def test_the_row_is_listed_and_its_script_stands_alone() -> None:
    assert "logon_sid" in probes.WINDOWS_ONLY and probelogon.BODIES[0] in allbodies.bodies()
    compile(probelogon.SCRIPT, "sandgate-probe.py", "exec")
    assert probelogon.PID_FILE in probelogon.SCRIPT


def test_verify_passes_with_the_deny_and_fails_without_it(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support import winprobefakes

    api.program = winprobefakes.program
    api.m.files[api.python()] = b"MZ"
    capsys.readouterr()
    assert cli.main(["verify", "--only", "logon_sid"]) == 0
    assert "ok    logon_sid" in capsys.readouterr().out
    assert not [p for p in api.m.files if p.endswith(probelogon.PID_FILE)]  # prepare's file removed
    api.reach_denied.clear()  # a fresh logon session, and a backend without the mitigation
    monkeypatch.setattr(WindowsBackend, "_deny_reach", lambda self, box: None)
    assert cli.main(["verify", "--only", "logon_sid"]) == 1
    assert "FAIL  logon_sid" in capsys.readouterr().out


def _row(**steps: Any) -> dict[str, Any]:
    ok, denied = {"ok": True, "error": 0}, {"ok": False, "error": 5}
    base = {"real_pid": 4242, "own_process": ok, "own_desktop": ok, "own_attach": ok}
    return base | {"real_process": denied, "winsta0": denied, "default": None} | steps


@pytest.mark.parametrize(
    ("got", "passes", "says"),
    [
        (_row(), True, "refused (access denied)"),
        (_row(winsta0={"ok": True, "error": 0}, default={"ok": False, "error": 5}), False, "clipboard"),  # r3-new N1
        (_row(real_process={"ok": True, "error": 0}), False, "PROCESS_VM_READ"),
        (_row(real_process={"ok": False, "error": 87}), False, "not with access denied"),  # a wrong pid proves nothing
        (_row(winsta0={"ok": True, "error": 0}, default={"ok": True, "error": 0}), False, "WinSta0\\Default"),
        (_row(winsta0={"ok": False, "error": 2}), False, "not with access denied"),
        (_row(own_process={"ok": False, "error": 5}), False, "proves nothing"),
        (_row(own_attach={"ok": False, "error": 170}), False, "proves nothing"),
        (None, False, "did not run"),
    ],
)
def test_the_judge(got: dict[str, Any] | None, passes: bool, says: str) -> None:
    verdict = probelogon.judge(0, json.loads(json.dumps(got)) if got else None)
    assert verdict.ok is passes and says in verdict.detail
