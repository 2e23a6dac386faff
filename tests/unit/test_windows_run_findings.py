"""Issue 28's process findings (W1, W4-W7, H1, M2, M5, M9, M14), each through the fake that
enforces the Microsoft contract behind it (tests/support/winkernel.py): the WinApi-level fake for
the backend's decisions, the DLL-level FakeKernel for win32proc.py's real ctypes marshalling.
Fake evidence only (docs/windows.md, "What has run where").
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest

from fsguard.windows import desktop, envblock, exesearch, job, launch, profileenv, win32job, win32proc, win32stdio
from fsguard.windows.job import JobLimits
from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import plan
from launcher.run.windows.realapi import RealWinApi
from sgbase.windows import state, win32
from sgbase.windows.api import Proc, WinApiError
from tests.support import winfake, winkernel
from tests.support.winfake import HOME, WS, FakeWinApi

SANDBOX_PROFILE = "C:\\Users\\" + state.sandbox_user_name(winfake.REAL_SID)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def _run(*cmd: str) -> int:
    return cli.main(["run", "--allow", "example.test", "--", *cmd])


def _started(api: FakeWinApi) -> tuple[Launch, str]:
    (launched,) = api.launches.values()
    return launched


# ---- W1: one spelling per variable; a refused block is one line --------------------------------


def test_w1_the_fake_refuses_two_spellings_of_one_name_as_windows_has_one_variable() -> None:
    with pytest.raises(WinApiError, match="twice"):
        winkernel.check_environment({"HTTP_PROXY": "a", "http_proxy": "a"}, HOME)
    winkernel.check_environment({"HTTP_PROXY": "a", "NO_PROXY": ""}, HOME)  # control: one each passes


def test_w1_a_run_sets_one_proxy_spelling_over_the_users_own(api: FakeWinApi) -> None:
    api.env.update(http_proxy="http://corp.test:8080", No_Proxy="*")  # the user's own, lower case
    assert _run(winfake.TOOL) == 7
    env = _started(api)[0].env
    assert {k: v for k, v in env.items() if k.casefold() in ("http_proxy", "no_proxy")} == {
        "HTTP_PROXY": "http://127.0.0.1:3128",
        "NO_PROXY": "",
    }
    assert len({n.casefold() for n, _ in plan.proxy_env(3128)}) == len(plan.proxy_env(3128))


def test_w1_a_block_windows_would_misread_is_one_error_line(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.env["LANG"] = "C\0SECRET=x"  # a NUL would start a second variable in the block
    with pytest.raises(SystemExit) as e:
        _run(winfake.TOOL)
    err = capsys.readouterr().err
    assert e.value.code != 0 and "sandgate: error:" in err and "NUL" in err and "Traceback" not in err
    assert "start_suspended" not in api.names()


# ---- W4: no UI limits, since the job must take a process already in a job -----------------------


def test_w4_a_job_with_ui_limits_cannot_take_cmd_and_sandgates_job_has_none(api: FakeWinApi) -> None:
    assert job.plan_job().ui_restrictions == 0
    with pytest.raises(job.JobPlanError, match="UI limits"):
        job.check_job(JobLimits(job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, job.JOB_OBJECT_UILIMIT_READCLIPBOARD, 0))
    # The fake's contract: a started process is already in a job, so a UI-limited job refuses it.
    assert _run(winfake.TOOL) == 7 and "assign" in api.names()  # the real plan's job takes it
    bad = api.create_job(JobLimits(job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, job.JOB_OBJECT_UILIMIT_DESKTOP, 0))
    pid = next(iter(api.launches))
    with pytest.raises(WinApiError, match="access denied"):
        api.assign(bad, Proc(pid, pid + 1))


def test_w4_make_job_sets_no_ui_restrictions_and_the_kernel_then_assigns(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = winkernel.FakeKernel()
    winkernel.install(monkeypatch, kernel)
    h = win32job.make_job(job.plan_job())
    assert kernel.jobs[h] == 0
    win32job.assign(h, 77)  # accepted: no UI limits
    kernel.jobs[h] = job.JOB_OBJECT_UILIMIT_HANDLES  # what the old make_job set
    with pytest.raises(OSError):
        win32job.assign(h, 77)


# ---- W5: the executable found with the run's PATH, passed as lpApplicationName ------------------


def test_w5_without_lp_application_name_the_service_path_misses_a_users_tool(api: FakeWinApi) -> None:
    bare = Launch("u", "p", "", "tool.exe --x", ("tool.exe",), WS, {}, "s\\d")
    with pytest.raises(WinApiError, match="service's PATH"):
        winkernel.check_application(bare, api.exists, api.m.files)
    assert _run("tool", "--x") == 7  # found by sandgate on the user's PATH, PATHEXT adds .exe
    launched = _started(api)[0]
    assert launched.application == winfake.TOOL and launched.cmdline == "tool --x"


def test_w5_a_cmd_shim_runs_under_comspec_and_an_expanding_argument_is_refused(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.m.files[r"C:\Tools\npm.cmd"] = b"@echo off"
    api.m.files[r"C:\Windows\System32\cmd.exe"] = b"MZ"
    api.env["ComSpec"] = r"C:\Windows\System32\cmd.exe"
    assert _run("npm", "install", "left pad") == 7
    launched = _started(api)[0]
    assert launched.application == r"C:\Windows\System32\cmd.exe"
    assert launched.cmdline.endswith('/d /s /c ""C:\\Tools\\npm.cmd" "install" "left pad""')
    with pytest.raises(SystemExit):
        _run("npm", "run", "%PATH%")
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and "batch file" in err


def test_w5_resolution_rules() -> None:
    env = {"Path": r"C:\a;C:\b", "PATHEXT": ".EXE;.CMD"}
    have = {r"C:\b\git.exe", r"C:\src\tool.exe", r"C:\a\x.ps1"}
    assert exesearch.resolve(("git", "st"), env, r"C:\src", have.__contains__).application == r"C:\b\git.exe"
    assert exesearch.resolve((r".\tool.exe",), env, r"C:\src", have.__contains__).application == r"C:\src\tool.exe"
    with pytest.raises(exesearch.ExeSearchError, match="not found"):
        exesearch.resolve(("tool",), env, r"C:\src", have.__contains__)  # never the current directory
    with pytest.raises(exesearch.ExeSearchError, match="interpreter"):
        exesearch.resolve((r"C:\a\x.ps1",), {**env, "PATHEXT": ".PS1"}, r"C:\src", have.__contains__)
    for argv in (("a b", 'c"d', "e\\", 'f\\"g', ""), ("x\\y z\\",), ("plain",)):
        assert exesearch.cmdline(argv) == subprocess.list2cmdline(argv) or '"' in "".join(argv)


# ---- W6 and H1: std handles are sandgate's pipes; CMD on the run's own desktop -------------------


def test_w6_h1_output_comes_back_and_cmd_is_not_on_the_users_desktop(api: FakeWinApi) -> None:
    assert _run(winfake.TOOL) == 7
    launched, desk = _started(api)
    assert launched.stdio and api.stdout == [b"fake output\n"] and api.lost_output == []
    assert desk != winkernel.USER_DESKTOP and desk.startswith("sandgate-") and desk.count("\\") == 1
    assert api.m.desktops == {}  # closed at teardown
    sandbox = winfake.sandbox_sid(api)
    assert f";;;{sandbox})" in api.desktop_sddl[desk] and api.desktop_sddl[desk].startswith("D:P(")


def test_h1_the_fake_puts_a_start_without_lp_desktop_on_the_users_desktop(api: FakeWinApi) -> None:
    no_desk = Launch(next(iter(api.m.users)), "p", "x", "x", ("x",), WS, {}, "")
    assert winkernel.check_desktop(no_desk, set(), {}, api.m.users) == winkernel.USER_DESKTOP
    with pytest.raises(WinApiError, match="no access"):  # a desktop that does not grant the user
        winkernel.check_desktop(no_desk.__class__(**{**no_desk.__dict__, "desktop": "s\\d"}), {"s\\d"}, {}, api.m.users)


def _launch(env: dict[str, str] | None = None, stdio: bool = True) -> Launch:
    how = desktop.plan_desktop("t1", winfake.REAL_SID, "S-1-5-21-1-2-3-1001")
    env = env if env is not None else {"PATH": r"C:\Windows", "NAME": "snow \U0001f600 man"}
    return Launch("u", "pw", r"C:\Tools\tool.exe", "tool.exe --x", ("tool.exe",), WS, env, how.lp_desktop, stdio)


def test_w6_h1_m2_the_real_start_marshals_what_the_contracts_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = winkernel.FakeKernel((r"C:\Tools\tool.exe",))
    winkernel.install(monkeypatch, kernel)
    got = win32proc.create_suspended(_launch())
    (start,) = kernel.started
    assert start["app"] == r"C:\Tools\tool.exe" and start["desktop"] == "sandgate-t1\\sandgate-t1"
    assert start["console"] == "pipes" and start["env"]["NAME"] == "snow \U0001f600 man"  # a non-BMP char intact
    assert start["flags"] & job.CREATE_SUSPENDED
    ours = (got.stdin, got.stdout, got.stderr)
    assert all(h in kernel.open and kernel.pipes[h] is False for h in ours)  # ours: not inheritable
    assert len(kernel.open & set(kernel.pipes)) == 3  # the child's ends were closed after the start


def test_m2_the_empty_block_is_terminated_and_a_lone_surrogate_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = winkernel.FakeKernel((r"C:\Tools\tool.exe",))
    winkernel.install(monkeypatch, kernel)
    win32proc.create_suspended(_launch({}))
    assert kernel.started[0]["env"] == {}
    assert envblock.utf16(envblock.build({})) == b"\0\0\0\0"
    with pytest.raises(envblock.EnvBlockError):
        envblock.utf16("\ud800")


def test_m14_a_failed_start_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = winkernel.FakeKernel(())  # the tool is missing
    winkernel.install(monkeypatch, kernel)
    with pytest.raises(OSError, match="command was not found"):
        win32proc.create_suspended(_launch())
    assert not kernel.open - {h for h in kernel.open if h not in kernel.pipes}  # no pipe handle leaked
    assert "Secondary Logon" in launch.hint(launch.ERROR_SERVICE_DISABLED, "x")
    assert "log on locally" in launch.hint(launch.ERROR_LOGON_TYPE_NOT_GRANTED, "x")
    assert launch.hint(4242, "x") == "cannot start x (Windows error 4242)"


def test_h1_the_desktop_is_made_in_its_own_station_and_sandgate_switches_back(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = winkernel.FakeKernel()
    winkernel.install(monkeypatch, kernel)
    kernel.admin = True  # elevated: the station is named after the run (unelevated: test_windows_proc_findings)
    plan_ = desktop.plan_desktop("t1", winfake.REAL_SID, "S-1-5-21-1-2-3-1001")
    station, desk, where = win32proc.create_desktop(plan_)
    assert kernel.desktops[desk] == (station, "sandgate-t1") and kernel.station == 1  # back in its own
    assert kernel.sddl == plan_.sddl and where == "sandgate-t1\\sandgate-t1"
    win32proc.close_desktop(station, desk)
    assert not kernel.desktops and not kernel.stations
    with pytest.raises(ValueError):
        desktop.plan_desktop("t1", "S-1-5-21-1)(A;;GA;;;WD", "S-1-5-21-1-2-3-1001")  # no SDDL smuggling


# ---- W7: the sandbox user's own profile ---------------------------------------------------------


def test_w7_profile_variables_are_the_sandbox_users(api: FakeWinApi) -> None:
    api.env.update(USERPROFILE=HOME, APPDATA=HOME + r"\AppData\Roaming", TEMP=HOME + r"\AppData\Local\Temp")
    api.env.update(CARGO_HOME=HOME + r"\.cargo", HOME=HOME)
    assert _run(winfake.TOOL) == 7
    env = _started(api)[0].env
    assert env["USERPROFILE"] == SANDBOX_PROFILE and env["TEMP"] == SANDBOX_PROFILE + r"\AppData\Local\Temp"
    assert "CARGO_HOME" not in env and "HOME" not in env
    with pytest.raises(WinApiError, match="real user's profile"):  # the fake's check bites on the old env
        winkernel.check_environment({"APPDATA": HOME + r"\AppData\Roaming"}, HOME)
    assert profileenv.scrub({"Path": HOME + r"\bin;C:\x"}, HOME) == {"Path": HOME + r"\bin;C:\x"}  # lists kept


# ---- M5: the wait can be interrupted -------------------------------------------------------------


def test_m5_the_wait_is_sliced_so_ctrl_c_reaches_python(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = winkernel.FakeKernel()
    winkernel.install(monkeypatch, kernel)
    assert win32proc.wait_exit(5) == 3 and kernel.waits == [win32proc.WAIT_SLICE_MS] * 3
    kernel = winkernel.FakeKernel(interrupt_after=2)
    winkernel.install(monkeypatch, kernel)
    with pytest.raises(KeyboardInterrupt):
        win32proc.wait_exit(5)
    with pytest.raises(winkernel.Unstoppable):  # the contract bites on an INFINITE wait
        kernel.WaitForSingleObject(5, 0xFFFFFFFF)


# ---- M9: the proxy's stdout drained after its ready line; W6's relay -----------------------------


def test_m9_the_proxy_keeps_running_when_it_writes_after_ready() -> None:
    script = "import sys; print('{\"ready\": true}', flush=True); sys.stdout.write('x' * 400000); sys.stdout.flush()"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    real = RealWinApi()
    real._children[child.pid] = child
    try:
        real.await_proxy(Proc(child.pid, 0), 20)
        assert child.wait(20) == 0  # a full, undrained pipe would block it forever
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_w6_the_relay_copies_output_and_closes_stdin_at_eof() -> None:
    fds = [os.pipe() for _ in range(5)]  # our stdin, child stdin, child stdout, child stderr, our out
    (in_r, in_w), (cin_r, cin_w), (out_r, out_w), (err_r, err_w), (ours_r, ours_w) = fds
    relay = win32stdio.Relay(cin_w, out_r, err_r, (in_r, ours_w, ours_w))
    os.write(in_w, b"typed\n")
    os.close(in_w)
    os.write(out_w, b"out\n")
    os.close(out_w)
    os.close(err_w)
    relay.finish(5)
    assert os.read(cin_r, 100) == b"typed\n" and _eof(cin_r)
    assert os.read(ours_r, 100) == b"out\n"
    for fd in (cin_r, ours_r, ours_w, in_r):
        os.close(fd)


def _eof(fd: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if os.read(fd, 1) == b"":
            return True
    return False


def test_the_table_binds_every_new_call() -> None:
    names = {c.name for c in win32.CALLS}
    for name in ("CreatePipe", "SetHandleInformation", "CreateWindowStationW", "CreateDesktopW", "CloseDesktop"):
        assert name in names
    assert ctypes.sizeof(win32proc.SECURITY_ATTRIBUTES) in (12, 24)
