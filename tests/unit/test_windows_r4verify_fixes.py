r"""r4-verify: `sandgate verify` on Windows read end to end (round 4); one test per finding
(/work/notes/s38/r4-verify.md). Fake evidence only: Windows itself has not run this.

V1 the bodies' interpreter in a venv: `<venv>\Scripts\python.exe` is a redirector in the real user's
   profile, unreadable to the sandbox user; the bodies run with the base interpreter pyvenv.cfg names.
V3 private_desktop judged WinSta0's refusal on any failure; now on ERROR_ACCESS_DENIED only.
V4 probenet's `run` decoded the tools' output strictly in the locale's code page: one OEM byte
   (0x81: 'ü' in cp850, undefined in cp1252) killed the script, so the row never had a result.
"""

from __future__ import annotations

import ntpath
import subprocess
import sys
from typing import Any

import pytest

from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import runner
from selftest.windows import allbodies, probedesktop, probenet, verifyrun
from sgbase.windows.api import Proc
from tests.support import winprobefakes
from tests.support.winfake import HOME, FakeWinApi

BASE = r"C:\Program Files\Python312\python.exe"
VENV = ntpath.join(HOME, r"pipx\venvs\sandgate")
VENV_PYTHON = ntpath.join(VENV, r"Scripts\python.exe")
CFG = b"home = C:\\Program Files\\Python312\ninclude-system-site-packages = false\nversion = 3.12.8\n"


def _venv_machine(monkeypatch: pytest.MonkeyPatch, cfg: bytes | None, base: bool = True) -> FakeWinApi:
    fake = FakeWinApi()
    fake.program = winprobefakes.program
    fake.python = lambda: VENV_PYTHON  # type: ignore[method-assign]  # sandgate installed with pipx
    fake.m.files[VENV_PYTHON] = b"MZ"
    if base:
        fake.m.files[BASE] = b"MZ"
    if cfg is not None:
        fake.m.files[ntpath.join(VENV, "pyvenv.cfg")] = cfg
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    assert cli.main(["setup"]) == 0
    return fake


def _launched(fake: FakeWinApi) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    original = fake.start_suspended

    def start(launch: Launch) -> Proc:
        # the sandbox user cannot read the real user's profile (its ACL: the user, SYSTEM, Administrators)
        assert not ntpath.normcase(launch.argv[0]).startswith(ntpath.normcase(HOME) + "\\"), launch.argv[0]
        seen.append(launch.argv)
        return original(launch)

    fake.start_suspended = start  # type: ignore[method-assign]
    return seen


def test_v1_bodies_run_with_the_venvs_base_interpreter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _venv_machine(monkeypatch, CFG)
    seen = _launched(fake)
    capsys.readouterr()
    assert cli.main(["verify", "--only", "private_desktop,logon_sid"]) == 0, capsys.readouterr()
    assert [a[0] for a in seen] == [BASE, BASE] and [a[-1] for a in seen] == ["private_desktop", "logon_sid"]


def test_v1_the_interpreter_choice() -> None:
    fake = FakeWinApi()
    fake.python = lambda: VENV_PYTHON  # type: ignore[method-assign]
    assert verifyrun.interpreter(fake) == VENV_PYTHON  # no pyvenv.cfg: not a venv, as it is
    fake.m.files[ntpath.join(VENV, "pyvenv.cfg")] = CFG
    assert verifyrun.interpreter(fake) == VENV_PYTHON  # the base named but not there: as it is (fails visibly)
    fake.m.files[BASE] = b"MZ"
    assert verifyrun.interpreter(fake) == BASE
    del fake.m.files[ntpath.join(VENV, "pyvenv.cfg")]
    fake.m.files[ntpath.join(VENV, "Scripts", "pyvenv.cfg")] = b"Home=C:\\Program Files\\Python312\n"  # beside it
    assert verifyrun.interpreter(fake) == BASE
    plain = FakeWinApi()
    assert verifyrun.interpreter(plain) == plain.python()  # an installed Python: unchanged


def test_v1_control_without_a_base_the_venv_row_cannot_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: what the old code did (the venv's redirector) is refused by this test's check."""
    fake = _venv_machine(monkeypatch, None)
    _launched(fake)
    with pytest.raises(AssertionError, match="pipx"):
        cli.main(["verify", "--only", "private_desktop"])


def _desk(winsta0: bool, error: int) -> dict[str, Any]:
    return {"station": "sandgate-1", "desktop": "sandgate-1", "winsta0": winsta0, "winsta0_error": error,
            "own_window": True, "sendinput": 0}  # fmt: skip


def test_v3_winsta0_refusal_counts_only_as_access_denied() -> None:
    assert probedesktop.judge(0, _desk(False, 5)).ok
    for bad in (_desk(False, 2), _desk(False, 87), _desk(True, 0)):
        assert not probedesktop.judge(0, bad).ok, bad
    old = _desk(False, 0)
    del old["winsta0_error"]  # what the old script wrote: a failure without its reason
    assert not probedesktop.judge(0, old).ok
    script = probedesktop.SCRIPT
    call = script.index('OpenWindowStationW("WinSta0"')
    assert script.index("ctypes.get_last_error()", call) < script.index("\n", script.index("\n", call) + 1)


def test_v3_through_verify_a_winsta0_not_denied_fails_the_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeWinApi()
    fake.program = winprobefakes.program
    fake.m.files[fake.python()] = b"MZ"
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    assert cli.main(["setup"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--only", "private_desktop"]) == 0  # the run denied WinSta0: refused (5)
    assert "ok    private_desktop" in capsys.readouterr().out
    fake.reach_denied.clear()
    monkeypatch.setattr(fake, "deny_logon_reach", lambda sid, pids: None)  # the deny did not take
    assert cli.main(["verify", "--only", "private_desktop"]) == 1
    assert "FAIL  private_desktop" in capsys.readouterr().out


def _run_function() -> Any:
    scope: dict[str, Any] = {}
    exec(probenet._COMMON, scope)  # the helper every probenet script starts with
    return scope["run"]


def test_v4_a_byte_the_locale_cannot_decode_does_not_kill_the_script() -> None:
    run = _run_function()
    code, text = run(sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'Zugriff verweigert \\x81 ok')")
    assert code == 0 and text.endswith("\\x81 ok")
    text.encode("cp1252")  # the row's detail prints to a redirected stdout (the ANSI code page) unharmed


def test_v4_control_strict_decoding_raises() -> None:
    """The control: the same child read as the old `run` read it dies with UnicodeDecodeError."""
    with pytest.raises(UnicodeDecodeError):
        subprocess.run([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'\\x81')"],
                       capture_output=True, text=True, encoding="utf-8", check=False)  # fmt: skip


def test_wmi_control_child_needs_no_network() -> None:
    """DOUBTFUL in r4-verify: `ping 127.0.0.1` may fail at once under the run's ICMP block, ending the
    control child before the in-job check: the control is now a sleeping interpreter."""
    line = next(x for x in probenet.WMI.splitlines() if x.startswith("child = "))
    assert "sys.executable" in line and "ping" not in line
    assert {b.name for b in allbodies.bodies()} >= {"private_desktop", "wmi_process", "scheduled_task"}


#: What Windows PowerShell 5.1 writes to a redirected stderr when CreateInstance is refused (the
#: error record: message, position, category; learn.microsoft.com/powershell, about_Error_Handling).
COM_RECORD = (
    'Exception calling "CreateInstance" with "1" argument(s): "Retrieving the COM class factory for component '
    "with CLSID {9BA05972-F6A8-11CF-A442-00A0C90A8F39} failed due to the following error: 80070005 Access is "
    'denied. (Exception from HRESULT: 0x80070005 (E_ACCESSDENIED))."\r\n'
    "At line:1 char:105\r\n"
    "+ ... 0A8F39'); $o = [Activator]::CreateInstance($t); 'SANDGATE-COM-MADE'\r\n"
    "+                  ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\r\n"
    "    + CategoryInfo          : NotSpecified: (:) [], MethodInvocationException\r\n"
    "    + FullyQualifiedErrorId : UnauthorizedAccessException\r\n"
    " \r\n"
)


def _wmi(com: list[Any]) -> dict[str, Any]:
    created = [1, "    + FullyQualifiedErrorId : HRESULT 0x80041003,Microsoft.Management.Infrastructure.CimCmdlets"]
    return {"control_in_job": True, "created": created, "pid": 0, "outside_job": None, "com": com}


def test_v5_the_com_refusal_is_seen_within_what_run_keeps() -> None:
    old = _wmi([1, COM_RECORD[-300:]])  # the old script: the error record's tail, as `run` kept it
    assert not probenet.judge_wmi(0, old).ok  # the HRESULT was cut off: a refused COM read as "not denied"
    line = "SANDGATE-COM-FAILED 0x80070005 UnauthorizedAccessException\r\n"  # the script's own line now
    assert probenet.judge_wmi(0, _wmi([0, line])).ok
    assert not probenet.judge_wmi(0, _wmi([0, "SANDGATE-COM-FAILED 0x80040154 COMException\r\n"])).ok  # not registered
    assert not probenet.judge_wmi(0, _wmi([0, "SANDGATE-COM-MADE\r\n"])).ok
    ps = next(x for x in probenet.WMI.splitlines() if "CreateInstance" in x)
    assert "try {" in ps and "SANDGATE-COM-MADE" in ps
    assert "'SANDGATE-COM-FAILED 0x{0:X8} {1}' -f $e.HResult" in probenet.WMI


def test_v6_a_scratch_workspace_left_behind_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeWinApi()
    fake.m.files[fake.python()] = b"MZ"
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    assert cli.main(["setup"]) == 0

    def leaves_a_file(api: Any, launch: Launch, desk: str) -> int:
        api.m.files[ntpath.join(launch.cwd, "sandgate-probe-left.txt")] = b"x"  # an attack not undone
        return winprobefakes.program(api, launch, desk)

    said: list[str] = []
    fake.program = winprobefakes.program
    verifyrun.run_rows(fake, probedesktop.BODIES, said.append)
    assert not [s for s in said if "not empty" in s]
    fake.program = leaves_a_file
    verifyrun.run_rows(fake, probedesktop.BODIES, said.append)
    assert [s for s in said if "is not empty" in s and "sandgate-verify-" in s]


def _permission_error(winerror: int | None) -> PermissionError:
    """What CPython raises on Windows: winerror 5, 32 (sharing) and 33 (lock) all become EACCES,
    PermissionError (PC/errmap.h); open() goes through the CRT and keeps no winerror (None)."""
    e = PermissionError(13, "denied")
    if winerror is not None:
        e.winerror = winerror  # type: ignore[attr-defined]
    return e


class _Refusing:
    """FsOps whose every call fails with the given error (the ACL probes' blocked checks)."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def fail(*_: object) -> None:
            raise self.error

        return fail


@pytest.mark.parametrize(("winerror", "counted"), [(5, True), (None, True), (32, False), (33, False), (19, False)])
def test_v10_only_access_denied_counts_as_the_acl_refusal(winerror: int | None, counted: bool) -> None:
    from selftest.windows import aclprobes

    check = aclprobes.Check("rename .git away", "blocked", aclprobes._rename("C:\\w\\.git", "C:\\w\\x"))
    ok, line = aclprobes._one(check, _Refusing(_permission_error(winerror)))
    assert ok is counted and (line == "access denied") is counted, line


def test_v10_self_code_script_tells_a_sharing_violation_from_a_refusal(tmp_path: Any) -> None:
    from selftest.windows import probeself

    source = probeself.SCRIPT
    start, end = source.index("def make_file"), source.index("targets = json.load")
    scope: dict[str, Any] = {}
    exec("import json, os, sys, uuid\n" + source[start:end], scope)
    for code, want in ((5, "denied"), (None, "denied"), (32, "error")):
        scope["make_file"] = scope["make_dir"] = lambda folder, c=code: (_ for _ in ()).throw(_permission_error(c))
        assert scope["attempt"](str(tmp_path))[0] == want, code
