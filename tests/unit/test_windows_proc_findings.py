"""Session 38's process-start review (notes: win-proc R1-R8), each through the fake that enforces the
Microsoft contract behind it: the DLL-level FakeKernel (tests/support/winkernel.py) for win32proc.py's
real marshalling, the WinApi-level fake (winfake.py) for the backend's decisions. Fake evidence only.
"""

from __future__ import annotations

import ctypes
import os
import time

import pytest

from fsguard.windows import desktop, envblock, exesearch, launch, profileenv, win32proc, win32stdio
from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import plan
from sgbase.windows import state
from tests.support import winfake, winkernel
from tests.support.winfake import HOME, WS, FakeWinApi

SANDBOX_SID = "S-1-5-21-1-2-3-1001"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> winkernel.FakeKernel:
    k = winkernel.FakeKernel((r"C:\Tools\tool.exe",))
    winkernel.install(monkeypatch, k)
    return k


def _run(*cmd: str) -> int:
    return cli.main(["run", "--allow", "example.test", "--", *cmd])


def _launch(cmdline: str = "tool.exe --x", env: dict[str, str] | None = None) -> Launch:
    how = desktop.plan_desktop("t1", winfake.REAL_SID, SANDBOX_SID)
    env = env if env is not None else {"PATH": r"C:\Windows"}
    return Launch("u", "pw", r"C:\Tools\tool.exe", cmdline, ("tool.exe",), WS, env, how.lp_desktop)


def _crt_argv(line: str) -> list[str]:
    """How a program built on the Microsoft C runtime splits its command line (CommandLineToArgvW's
    rules: 2n backslashes + quote -> n and a quote toggle, 2n+1 -> n and a literal quote)."""
    out: list[str] = []
    cur, quoted, slashes, have = [], False, 0, False
    for c in line:
        if c == "\\":
            slashes += 1
            continue
        if c == '"':
            cur.append("\\" * (slashes // 2))
            if slashes % 2:
                cur.append('"')
            else:
                quoted = not quoted
            slashes, have = 0, True
            continue
        cur.append("\\" * slashes)
        slashes = 0
        if c in " \t" and not quoted:
            if have:
                out.append("".join(cur))
            cur, have = [], False
            continue
        cur.append(c)
        have = True
    cur.append("\\" * slashes)
    if have or slashes:
        out.append("".join(cur))
    return out


# ---- R1: CreateProcessWithLogonW's lpCommandLine bound ---------------------------------------------


def test_r1_a_command_line_past_cpwls_bound_is_refused_before_any_handle(kernel: winkernel.FakeKernel) -> None:
    fits = "t" * launch.MAX_CMDLINE
    assert launch.check_cmdline(fits, "t") == fits
    with pytest.raises(launch.LaunchError, match=r"1024 characters|at most 1023"):
        launch.check_cmdline(fits + "x", "t")
    with pytest.raises(launch.LaunchError):  # counted in UTF-16 units: a non-BMP character is two
        launch.check_cmdline("t" * (launch.MAX_CMDLINE - 1) + "\U0001f600", "t")
    with pytest.raises(ValueError, match="a script, a response file"):  # realapi._call: one line
        win32proc.create_suspended(_launch("tool.exe " + "a" * 2000))
    assert not kernel.started and not kernel.open  # refused before a pipe was made
    win32proc.create_suspended(_launch("tool.exe " + "a" * 1000))  # control: under the bound it starts
    assert len(kernel.started) == 1


def test_r1_the_fake_kernel_refuses_what_cpwl_documents_and_error_87_is_explained(
    kernel: winkernel.FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "check_cmdline", lambda line, what: line)  # as if sandgate did not check
    with pytest.raises(OSError, match="command line over 1023 characters"):
        win32proc.create_suspended(_launch("tool.exe " + "a" * 1100))
    assert not kernel.started and kernel.error == launch.ERROR_INVALID_PARAMETER


def test_r1_a_run_with_a_long_command_line_is_one_line_and_nothing_starts(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _run(winfake.TOOL, "x" * 1100)
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and "at most 1023" in err and "Traceback" not in err
    assert "start_suspended" not in api.names() and not api.m.jobs and not api.m.desktops  # torn down
    assert _run(winfake.TOOL, "x" * 900) == 7  # control: under the bound it runs


# ---- R2: the fake kernel checks Windows' block order, and the real proxy variables pass ------------


def test_r2_a_block_with_the_real_proxy_variables_passes_the_kernel(kernel: winkernel.FakeKernel) -> None:
    env = dict((*plan.proxy_env(3128), *profileenv.profile_env(r"C:\Users\sb", "sb"), ("PATH", r"C:\Windows")))
    win32proc.create_suspended(_launch(env=env))
    names = list(kernel.started[0]["env"])
    assert names.index("HTTPS_PROXY") < names.index("HTTP_PROXY")  # upcased order: 'S' (0x53) < '_' (0x5F)


def test_r2_the_fake_refuses_a_casefold_sorted_block(
    kernel: winkernel.FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envblock, "sort_key", str.casefold)  # the order M3 replaced: HTTP_PROXY first
    with pytest.raises(OSError):
        win32proc.create_suspended(_launch(env=dict(plan.proxy_env(3128))))
    assert not kernel.started and kernel.error == 87


# ---- R3: batch arguments reach the program the shim wraps intact -----------------------------------


def test_r3_trailing_backslashes_survive_a_shims_percent_star() -> None:
    have = {r"C:\Tools\npm.cmd"}
    env = {"PATH": r"C:\Tools", "PATHEXT": ".EXE;.CMD", "ComSpec": r"C:\Windows\System32\cmd.exe"}
    args = (r"C:\dir" + "\\", "x y", "", "plain", "a\\\\")
    got = exesearch.resolve(("npm", *args), env, WS, have.__contains__)
    inner = got.cmdline.split(" /d /s /c ", 1)[1][1:-1]  # what cmd.exe runs after /s strips the outer quotes
    forwarded = inner.split(" ", 1)[1]  # %*: the arguments as cmd.exe hands them on, quotes kept
    assert _crt_argv(forwarded) == list(args)  # the program sees each argument as typed
    # control: a single trailing backslash before the closing quote eats it and the next argument
    assert _crt_argv('"C:\\dir\\" "x y"') == ['C:\\dir" x', "y"]


def test_r3_a_batch_file_whose_path_cmd_would_expand_is_refused() -> None:
    have = {r"C:\100%x%\run.cmd"}
    with pytest.raises(exesearch.ExeSearchError, match="path holds %"):
        exesearch.resolve((r"C:\100%x%\run.cmd", "a"), {"PATHEXT": ".CMD"}, WS, have.__contains__)


# ---- R4: App Execution Aliases are not the sandbox user's ------------------------------------------


def test_r4_a_store_alias_first_on_path_is_skipped_for_the_real_program(api: FakeWinApi) -> None:
    alias_dir = HOME + r"\AppData\Local\Microsoft\WindowsApps"
    api.m.files[alias_dir + r"\tool.exe"] = b""  # the 0-byte alias, first on the user's PATH
    api.env["PATH"] = alias_dir + r";C:\Windows;C:\Tools"
    assert _run("tool") == 7
    ((launched, _),) = api.launches.values()
    assert launched.application == winfake.TOOL


def test_r4_only_a_store_alias_is_one_line_saying_what_to_do(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    alias_dir = HOME + r"\AppData\Local\Microsoft\WindowsApps"
    api.m.files[alias_dir + r"\python.exe"] = b""
    api.env["PATH"] = alias_dir + r";C:\Windows"
    with pytest.raises(SystemExit):
        _run("python", "-V")
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and "Microsoft Store alias" in err and "Traceback" not in err
    assert "start_suspended" not in api.names()
    assert exesearch.app_alias(alias_dir.upper() + r"\PYTHON.EXE") and not exesearch.app_alias(winfake.TOOL)


# ---- R5: a command that dies in DLL initialisation is explained ------------------------------------


def test_r5_status_dll_init_failed_is_said_and_kept(api: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.exit_code = launch.STATUS_DLL_INIT_FAILED
    assert _run(winfake.TOOL) & 0xFFFFFFFF == launch.STATUS_DLL_INIT_FAILED  # the status stays the command's
    assert "0xC0000142" in capsys.readouterr().err
    api.exit_code = 1
    assert _run(winfake.TOOL) == 1 and "0xC0000142" not in capsys.readouterr().err  # control


# ---- R6: the run's window station is always a new one ----------------------------------------------


def test_r6_an_existing_station_of_that_name_is_never_reused(
    kernel: winkernel.FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel.admin = True  # elevated: the station carries the run's name
    how = desktop.plan_desktop("t1", winfake.REAL_SID, SANDBOX_SID)
    kernel.CreateWindowStationW(how.station, 0, desktop.WINSTA_ALL_ACCESS, None)  # someone else's, first
    with pytest.raises(OSError, match="CreateWindowStationW"):
        win32proc.create_desktop(how)
    assert not kernel.desktops and kernel.station == 1  # nothing made in it, still in our own station
    monkeypatch.setattr(win32proc, "CWF_CREATE_ONLY", 0)  # what the call did before: the fake reopens it
    win32proc.create_desktop(how)
    assert kernel.reopened == how.station


# ---- R7: the failed starts seen in the field say what to do ----------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (launch.ERROR_ACCOUNT_LOCKED_OUT, "locked out"),
        (launch.ERROR_ACCOUNT_RESTRICTION, "policy restricts"),
        (launch.ERROR_DIRECTORY, "working directory"),
        (launch.ERROR_PATH_NOT_FOUND, "network drive"),
        (launch.ERROR_INVALID_PARAMETER, "command line over"),
    ],
)
def test_r7_hints(code: int, words: str) -> None:
    assert words in launch.hint(code, "x") and "Windows error" not in launch.hint(code, "x")


# ---- R8: variables naming the workspace stay when the workspace is inside the profile --------------


def test_r8_values_in_the_workspace_are_kept_when_it_is_in_the_profile() -> None:
    ws = HOME + r"\src\proj"
    env = {"VIRTUAL_ENV": ws + r"\.venv", "CARGO_HOME": HOME + r"\.cargo", "APPDATA": HOME + r"\AppData"}
    assert profileenv.scrub(env, HOME, keep_under=(ws,)) == {"VIRTUAL_ENV": ws + r"\.venv"}
    assert profileenv.scrub(env, HOME) == {}  # without the workspace: all in the profile, all dropped


def test_r8_the_backend_keeps_the_workspace_variables(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "home", lambda: r"C:\src")  # the workspace C:\src\proj inside the profile
    api.env.update(VIRTUAL_ENV=WS + r"\.venv", CARGO_HOME=r"C:\src\.cargo")
    assert _run(winfake.TOOL) == 7
    ((launched, _),) = api.launches.values()
    assert launched.env["VIRTUAL_ENV"] == WS + r"\.venv" and "CARGO_HOME" not in launched.env
    assert state.sandbox_user_name(winfake.REAL_SID) in launched.env["USERPROFILE"]


# ---- R10: a background process holding the pipes delays the end by the timeout once, not per stream --


def test_r10_finish_bounds_both_streams_together() -> None:
    fds = [os.pipe() for _ in range(4)]  # our stdin, child stdin, child stdout, child stderr
    (in_r, in_w), (cin_r, cin_w), (out_r, out_w), (err_r, err_w) = fds
    relay = win32stdio.Relay(cin_w, out_r, err_r, (in_r, out_w, err_w))  # writers held: never EOF
    started = time.monotonic()
    relay.finish(0.6)
    assert time.monotonic() - started < 1.0  # one bound for stdout and stderr (the old code: 0.6 each)
    for fd in (in_w, out_w, err_w, cin_r):
        os.close(fd)


def test_a_refused_job_close_still_closes_the_process_and_the_runs_desktop(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.fail = ("close_job", 1)
    assert _run(winfake.TOOL) == 7
    assert "could not close the job" in capsys.readouterr().err
    assert api.m.desktops == {} and "close_process" in api.names()  # the old code stopped at the job


def test_a_refused_assign_ends_the_command_and_says_why(api: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.fail = ("assign", 1)  # e.g. sandgate's own job has UI limits: no valid hierarchy (Nested Jobs)
    with pytest.raises(SystemExit):
        _run(winfake.TOOL)
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and "UI limits" in err and "Traceback" not in err
    assert "terminate" in api.names() and "resume" not in api.names()  # never one instruction outside
    assert not api.m.jobs and not api.m.desktops


# ---- R16: unelevated, Windows names the window station ------------------------------------------


def test_r16_unelevated_the_station_windows_names_is_used_and_granted(kernel: winkernel.FakeKernel) -> None:
    how = desktop.plan_desktop("t1", winfake.REAL_SID, SANDBOX_SID)
    assert not kernel.CreateWindowStationW(how.station, 1, desktop.WINSTA_ALL_ACCESS, None)  # the fake bites:
    assert kernel.error == 5  # "Only members of the Administrators group are allowed to specify a name"
    station, desk, where = win32proc.create_desktop(how)
    assert where == winkernel.LOGON_STATION + "\\sandgate-t1"  # what lpDesktop must then name
    assert kernel.desktops[desk] == (station, "sandgate-t1") and kernel.station == 1  # made there, back home
    assert kernel.station_dacl[station] == how.sddl  # a new station: the run's DACL applied
    win32proc.close_desktop(station, desk)


def test_r16_a_station_another_program_holds_gets_the_sandbox_ace_added(kernel: winkernel.FakeKernel) -> None:
    theirs = f"D:(A;;GA;;;{winfake.REAL_SID})(A;;0x2;;;S-1-15-2-1)"  # e.g. Chromium's alternate station
    sa = win32proc.SECURITY_ATTRIBUTES(24, None, 0)
    kernel.sds[0] = theirs
    kernel.CreateWindowStationW(None, 0, desktop.WINSTA_ALL_ACCESS, ctypes.byref(sa))
    how = desktop.plan_desktop("t1", winfake.REAL_SID, SANDBOX_SID)
    station, _desk, where = win32proc.create_desktop(how)
    assert where.startswith(winkernel.LOGON_STATION + "\\") and kernel.reopened == winkernel.LOGON_STATION
    dacl = kernel.station_dacl[station]
    assert how.station_grant in dacl and f"(A;;GA;;;{winfake.REAL_SID})" in dacl  # added, theirs kept
    assert "(A;;0x2;;;S-1-15-2-1)" in dacl and "GA;;;" + SANDBOX_SID not in dacl  # not GA: no WRITE_DAC


def test_r16_a_run_passes_the_name_windows_gave_as_lp_desktop(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    given = winkernel.LOGON_STATION + "\\sandgate-x"
    real = api.create_desktop

    def named_by_windows(plan: desktop.DesktopPlan) -> tuple[int, str]:
        handle, _ = real(plan)
        api.m.desktops[handle] = given
        api.desktop_sddl[given] = plan.sddl
        return handle, given

    monkeypatch.setattr(api, "create_desktop", named_by_windows)
    assert _run(winfake.TOOL) == 7
    ((launched, desk),) = api.launches.values()
    assert launched.desktop == given == desk  # not the plan's own name


# ---- every call of the start and the desktop through ctypes' own argument conversion ----------------


def test_the_start_and_both_desktop_paths_pass_ctypes_conversion(
    kernel: winkernel.FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(win32proc, "fn", winkernel.marshalled(kernel))
    how = desktop.plan_desktop("t1", winfake.REAL_SID, SANDBOX_SID)
    first, desk, _ = win32proc.create_desktop(how)  # unelevated: the unnamed station, read back
    kernel.station_dacl[first] = "D:(A;;GA;;;WD)"  # kept open, with someone else's DACL now
    station, _, _ = win32proc.create_desktop(desktop.plan_desktop("t3", winfake.REAL_SID, SANDBOX_SID))
    assert kernel.reopened and how.station_grant in kernel.station_dacl[station]  # DACL read, ACE added
    win32proc.close_desktop(first, desk)
    kernel.admin = True
    win32proc.create_desktop(desktop.plan_desktop("t2", winfake.REAL_SID, SANDBOX_SID))  # named
    env = dict((*plan.proxy_env(3128), ("PATH", r"C:\Windows")))
    got = win32proc.create_suspended(_launch(env=env))
    assert kernel.started and got.stdout
    assert win32proc.wait_exit(5) == 3
