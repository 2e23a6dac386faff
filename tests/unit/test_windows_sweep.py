"""The teardown sweep (issue 28, H3; fsguard/windows/sweep.py): what a run's command left outside
its job (an interactive-token scheduled task, a process that escaped) is gone after teardown, as
the sandbox user, through the fake that enforces the documented access contracts
(tests/support/sweepfake.py); the real user's and another user's tasks and processes survive; a
sweep that cannot run or leaves survivors is one `sandgate:` line and is retried by the next run
and by `sandgate cleanup`. Fake evidence only (docs/windows.md, "What has run where").
"""

from __future__ import annotations

import pytest

from fsguard.windows import sweep
from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import runner
from sgbase.windows import state
from sgbase.windows.api import WinApiError
from tests.support import sweepfake, winfake
from tests.support.winfake import APPDATA, REAL_SID, TOOL, FakeWinApi

OTHER = "S-1-5-21-1111111111-2222222222-3333333333-1077"  # another local user


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def _neighbours(api: FakeWinApi) -> dict[str, object]:
    """The real user's and another user's tasks and processes, some readable, openable and even
    deletable by Everyone: the sweep may see them, and must still leave them alone."""
    api.register_task(REAL_SID, "\\real-backup")
    api.m.tasks["\\other-open"] = sweepfake.Task(OTHER, OTHER, (sweepfake.EVERYONE,), (sweepfake.EVERYONE,))
    return {
        "real": api.spawn_outside(REAL_SID),
        "other": api.spawn_outside(OTHER, grants=(OTHER, sweepfake.SYSTEM, sweepfake.EVERYONE)),
        "tasks": {"\\real-backup", "\\other-open"},
    }


def _escaping(api: FakeWinApi, seen: dict[str, int]) -> None:
    """CMD registers an interactive-token task (schtasks /create without /ru) and starts a process
    that is not in the job (what such a task's action, or any other escape, leaves)."""
    sid = winfake.sandbox_sid(api)

    def program(fake: FakeWinApi, launch: Launch, desk: str) -> int:
        fake.register_task(sid, "\\sandgate-escape")
        seen["escaped"] = fake.spawn_outside(sid)
        return 0

    api.program = program


def _marks() -> str:
    return state.journal_dir(APPDATA)


def _next_sandgate(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run's sandgate has exited; the next one has another pid."""
    monkeypatch.setattr(api, "own_pid", lambda: 4343)
    api.alive = {4343}


def _pending(api: FakeWinApi) -> list[str]:
    return [p for p in api.m.files if p.startswith(_marks()) and p.endswith(sweep.MARK)]


def test_escaped_task_and_process_are_gone_after_teardown_and_others_survive(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    others, seen = _neighbours(api), dict[str, int]()
    _escaping(api, seen)
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 0  # CMD's status: the run worked
    err = capsys.readouterr().err
    assert "sandgate: teardown" not in err and api.stdout == [b"fake output\n"]  # the permitted run, whole
    sid = winfake.sandbox_sid(api)
    assert "\\sandgate-escape" not in api.m.tasks and api.live(sid) == []  # both gone
    assert set(api.m.tasks) == others["tasks"]  # the real user's and another user's tasks survive
    assert api.live(REAL_SID) == [others["real"]] and api.live(OTHER) == [others["other"]]
    names = api.names()
    assert names.index("close_job") < names.index("sweep_logon") < names.index("stop_proxy")
    assert names.index("sweep_end") < max(i for i, n in enumerate(names) if n == "set_dacl")  # before the ACLs
    assert ("sweep_open", (others["other"],)) in api.calls  # opened (Everyone may), checked, left alone
    assert _pending(api) == [] and api.sweep_leaks() == [] and not api.violations


def test_the_sandbox_token_cannot_touch_what_the_contracts_refuse(api: FakeWinApi) -> None:
    """The fake's contracts themselves: the sandbox user's token opens only processes whose DACL
    grants it, deletes only tasks it may delete, and registers tasks only for itself."""
    others = _neighbours(api)
    user, (sid, password) = next(iter(api.m.users.items()))
    token = api.sweep_logon(user, password)
    assert api.sweep_open(token, int(others["real"])) is None  # type: ignore[call-overload]
    with pytest.raises(WinApiError, match="E_ACCESSDENIED"):
        api.sweep_delete_task(token, "\\real-backup")
    assert [t.path for t in api.sweep_tasks(token)] == ["\\other-open"]  # the real user's is not even seen
    with pytest.raises(WinApiError, match="password"):
        api.register_task(sid, "\\as-me", principal=REAL_SID)
    with pytest.raises(WinApiError, match="LOGON_FAILURE"):
        api.sweep_logon(user, "wrong")
    api.sweep_end(token)


def _run_whose_sweep_cannot_log_on(api: FakeWinApi) -> dict[str, int]:
    """A run whose command escapes (a task and a process) and whose teardown sweep is refused its logon."""
    seen = dict[str, int]()
    _escaping(api, seen)
    api.fail = ("sweep_logon", 1)
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 0
    return seen


def test_a_sweep_that_cannot_start_is_one_line_and_the_next_run_sweeps_first(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run_whose_sweep_cannot_log_on(api)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sandgate: teardown")]
    assert len(lines) == 1 and "not swept" in lines[0] and "'sandgate cleanup' retries" in lines[0]
    sid = winfake.sandbox_sid(api)
    assert api.live(sid) == [seen["escaped"]] and "\\sandgate-escape" in api.m.tasks  # still there: said so
    assert len(_pending(api)) == 1  # the mark stays
    api.fail, api.program = None, None
    _next_sandgate(api, monkeypatch)
    api.calls.clear()
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 7
    assert api.live(sid) == [] and "\\sandgate-escape" not in api.m.tasks and _pending(api) == []
    names = api.names()
    assert names.index("sweep_logon") < names.index("start_proxy")  # swept before this run made anything


def test_cleanup_sweeps_what_a_failed_sweep_left(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_whose_sweep_cannot_log_on(api)
    api.fail = None
    _next_sandgate(api, monkeypatch)
    capsys.readouterr()
    assert cli.main(["cleanup"]) == 0
    assert "swept 1 process(es) and 1 scheduled task(s)" in capsys.readouterr().err
    assert api.live(winfake.sandbox_sid(api)) == [] and _pending(api) == []


def test_a_survivor_is_reported_refuses_the_next_run_and_fails_cleanup(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = dict[str, int]()
    _escaping(api, seen)

    def refuse(token: int, handle: int) -> None:  # a process TerminateProcess cannot end
        raise WinApiError("TerminateProcess: access denied")

    monkeypatch.setattr(api, "sweep_terminate", refuse)
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 0
    err = capsys.readouterr().err
    pid = seen["escaped"]
    assert f"1 process(es) (pid {pid}) survived the sweep" in err and err.count("sandgate: teardown") == 1
    assert "\\sandgate-escape" not in api.m.tasks  # what could be done was done
    api.program = None
    _next_sandgate(api, monkeypatch)
    api.calls.clear()
    with pytest.raises(SystemExit):
        cli.main(["run", "--allow", "example.test", "--", "tool"])  # it would share this run's grants
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and f"pid {pid}" in err and "Traceback" not in err
    assert "start_suspended" not in api.names() and "start_proxy" not in api.names()
    assert cli.main(["cleanup"]) == 1 and "survived the sweep" in capsys.readouterr().err


def test_no_sweep_while_another_run_of_the_sandbox_user_is_live(api: FakeWinApi) -> None:
    """Its processes are that run's command: the sweep waits (this run's mark stays for later)."""
    seen = dict[str, int]()
    _escaping(api, seen)
    live = state.journal_path(APPDATA, 5151, "othertask")
    api.m.files[live] = b""
    api.alive.add(5151)
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 0
    assert api.live(winfake.sandbox_sid(api)) == [seen["escaped"]] and "sweep_logon" not in api.names()
    assert len(_pending(api)) == 1


class _Respawning(FakeWinApi):
    """A process that comes back after every kill (a task firing between rounds)."""

    def sweep_terminate(self, token: int, handle: int) -> None:
        super().sweep_terminate(token, handle)
        self.spawn_outside(winfake.sandbox_sid(self))


def test_the_loop_is_bounded_and_reports_what_keeps_coming_back() -> None:
    api = _Respawning()
    winfake.set_up(api)
    sid = winfake.sandbox_sid(api)
    api.spawn_outside(sid)
    user, (_, password) = next(iter(api.m.users.items()))
    done = sweep.sweep(api, user, password, sid, api.own_pid(), rounds=3)
    assert len(done.killed) == 3 and len(done.survivors) == 1 and not done.clean
    assert "survived the sweep" in (sweep.describe(done) or "") and api.sweep_leaks() == []


def test_ours_is_the_principal_or_the_owner_never_a_name_alone() -> None:
    sid = "S-1-5-21-1-2-3-1001"
    assert sweep.ours(sweep.TaskSeen("\\a", sid, ""), sid)
    assert sweep.ours(sweep.TaskSeen("\\b", "", sid.lower()), sid)  # registered by it, for nobody
    assert not sweep.ours(sweep.TaskSeen("\\c", OTHER, OTHER), sid)
    assert not sweep.ours(sweep.TaskSeen("\\d", "", ""), sid)
    assert sweep.describe(sweep.Swept(killed=(1,), deleted=("\\a",))) is None
    assert sweep.marker(state.journal_path(APPDATA, 7, "t")).endswith("7-t.sweep")
    assert sweep.marker_pid("7-t.sweep") == 7 and sweep.marker_pid("7-t.jsonl") is None


def test_a_run_that_never_started_cmd_does_not_sweep(api: FakeWinApi) -> None:
    api.fail = ("create_job", 1)
    with pytest.raises(SystemExit):
        cli.main(["run", "--allow", "example.test", "--", TOOL])
    assert "sweep_logon" not in api.names() and _pending(api) == []


def _left_behind(api: FakeWinApi) -> tuple[str, int]:
    """What a killed run's command left: an interactive-token task and a process outside any job."""
    sid = winfake.sandbox_sid(api)
    api.register_task(sid, "\\sandgate-escape")
    return sid, api.spawn_outside(sid)


@pytest.mark.parametrize("sealed", [True, False])
def test_setup_remove_sweeps_before_the_user_is_deleted(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str], sealed: bool
) -> None:
    """Deleting the user first would orphan its SID's task and process: nobody could log on as it
    to end them. The sweep runs first (with a fresh password when the sealed one is gone)."""
    others = _neighbours(api)
    sid, _ = _left_behind(api)
    if not sealed:
        del api.m.files[state.sealed_password(APPDATA)]
    assert cli.main(["setup", "--remove"]) == 0
    said = capsys.readouterr().err
    assert "sandgate: swept 1 process(es) and 1 scheduled task(s) of the sandbox user" in said
    assert api.live(sid) == [] and set(api.m.tasks) == others["tasks"] and not api.m.users
    assert api.live(REAL_SID) == [others["real"]] and api.live(OTHER) == [others["other"]]
    names = api.names()
    assert names.index("sweep_end") < names.index("firewall_remove") < names.index("delete_user")
    assert api.sweep_leaks() == [] and not api.violations


def test_setup_remove_stops_before_deleting_anything_when_the_sweep_leaves_survivors(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, pid = _left_behind(api)

    def refuse(token: int, handle: int) -> None:  # a process TerminateProcess cannot end
        raise WinApiError("TerminateProcess: access denied")

    monkeypatch.setattr(api, "sweep_terminate", refuse)
    before = (dict(api.m.users), set(api.m.filters), dict(api.m.rules), api.m.files.get(state.setup_record(APPDATA)))
    with pytest.raises(SystemExit) as e:
        cli.main(["setup", "--remove"])
    err = capsys.readouterr().err
    assert e.value.code != 0 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("sandgate: error:") and f"(pid {pid}) survived the sweep" in err and "not removed" in err
    assert (
        dict(api.m.users),
        set(api.m.filters),
        dict(api.m.rules),
        api.m.files.get(state.setup_record(APPDATA)),
    ) == before
    assert api.live(sid) == [pid] and "\\sandgate-escape" not in api.m.tasks  # what could be done was done
    monkeypatch.undo()  # ended by hand: now the removal goes through
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: api)
    assert cli.main(["setup", "--remove"]) == 0 and not api.m.users and api.live(sid) == []


def test_setup_remove_waits_for_a_live_run(api: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    """A live run's processes are its command, not leftovers: nothing swept, nothing removed."""
    sid, pid = _left_behind(api)
    api.m.files[state.journal_path(APPDATA, 5151, "othertask")] = b""
    api.alive.add(5151)
    with pytest.raises(SystemExit):
        cli.main(["setup", "--remove"])
    assert "still running" in capsys.readouterr().err
    assert api.live(sid) == [pid] and api.m.users and "sweep_logon" not in api.names()


# win-acl A6: one process or task the sweep cannot read must not make every later run refuse ------


def test_a_process_whose_token_cannot_be_read_is_closed_and_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenProcessToken checks the token's own DACL (its user and SYSTEM), which another user's
    process keeps even when its process DACL lets the sandbox user open it: that is not an error of
    the sweep, and not a process known to be the sandbox user's."""
    from fsguard.windows import win32sweep
    from sgbase.windows.win32 import Win32Error

    closed: list[int] = []

    def exit_code(h: int, code: object) -> int:
        code._obj.value = win32sweep.STILL_ACTIVE  # type: ignore[attr-defined]
        return 1

    calls = {"OpenProcess": lambda access, inherit, pid: 0x70, "GetExitCodeProcess": exit_code}
    monkeypatch.setattr(win32sweep, "fn", lambda name: calls[name])
    monkeypatch.setattr(win32sweep, "close", closed.append)

    def refused(process: int) -> str:
        raise Win32Error(5, "OpenProcessToken failed (error 5)")

    monkeypatch.setattr(win32sweep, "token_user", refused)
    assert win32sweep.open_process(1234) is None and closed == [0x70]
    monkeypatch.setattr(win32sweep, "token_user", lambda process: "S-1-5-21-1-2-3-1001")
    assert win32sweep.open_process(1234) == (0x70, "S-1-5-21-1-2-3-1001") and closed == [0x70]  # kept open


def test_a_task_principal_that_cannot_be_looked_up_is_nobody_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsguard.windows import win32tasks
    from sgbase.windows.win32 import Win32Error

    def offline(name: str) -> str | None:
        raise Win32Error(1789, "LookupAccountNameW failed (error 1789)")  # ERROR_TRUSTED_RELATIONSHIP_FAILURE

    monkeypatch.setattr(win32tasks, "account_sid", offline)
    assert win32tasks.resolve("CORP\\alice") == ""
    assert win32tasks.resolve("S-1-5-18") == "S-1-5-18" and win32tasks.resolve("") == ""
    monkeypatch.setattr(win32tasks, "account_sid", lambda name: "S-1-5-21-1-2-3-1001" if name == "box" else None)
    assert win32tasks.resolve("box") == "S-1-5-21-1-2-3-1001" and win32tasks.resolve("gone") == ""
