"""`sandgate run --transparent` on Windows (transparent.py, windowsbackend.py) against the fake WinApi and
its fake WinDivert (tests/support/windivertfake.py), through launcher.cli with sys.platform =
"win32": refused in one line when it could not work, torn down on every exit path, and fail
closed when the loop dies mid-run. Fake evidence only: Windows itself has not run this."""

from __future__ import annotations

import pytest

from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import runner
from netguard.windows import owners, win32divert
from tests.support.winfake import FakeWinApi, sandbox_sid

OTHER_SID = "S-1-5-21-1111111111-2222222222-3333333333-1007"  # another user of the machine

RUN = ["run", "--transparent", "--allow", "example.test", "--", "tool"]


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    fake = FakeWinApi()
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    return fake


@pytest.fixture
def ready(machine: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> FakeWinApi:
    assert cli.main(["setup", "--transparent"]) == 0
    capsys.readouterr()
    machine.calls.clear()
    return machine


def _pid(api: FakeWinApi, launch: Launch) -> int:
    (pid,) = [p for p, (run, _) in api.launches.items() if run is launch]
    return pid


def _refused(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """The run failed with exactly one `sandgate: error:` line naming `words`, and no traceback."""
    with pytest.raises(SystemExit) as e:
        cli.main(RUN)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("sandgate: error:")]
    assert e.value.code == 125 and len(errors) == 1 and "Traceback" not in err, err
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


def _nothing_left(api: FakeWinApi) -> None:
    assert api.dynamic == {} and all(h.closed for h in api.divert_handles)
    assert api.owner_handles == {}  # every process handle the loop kept was closed
    assert not api.debug_enabled  # SeDebugPrivilege off again: the token as the run found it
    assert all(r._sock.fileno() == -1 for r in api.resolvers)
    assert (api.m.proxies, api.m.jobs, api.m.desktops) == (set(), set(), {})
    assert not api.violations


def test_a_divert_handle_that_cannot_open_refuses_the_run(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    ready.divert_driver = False  # WinDivert64.sys missing (or blocked by policy)
    _refused(capsys, "transparent capture", "WinDivert64.sys")
    assert "start_suspended" not in ready.names() and "wfp_open_dynamic" not in ready.names()
    _nothing_left(ready)


def test_permits_that_cannot_be_added_refuse_the_run_and_close_the_handles(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    ready.fail = ("wfp_open_dynamic", 1)
    _refused(capsys, "wfp_open_dynamic")
    assert ready.divert_handles and "start_suspended" not in ready.names()
    _nothing_left(ready)


@pytest.mark.parametrize("step", ["start_suspended", "assign", "wait"])
def test_a_failure_after_the_loop_started_removes_the_permits(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str], step: str
) -> None:
    ready.fail = (step, 1)
    _refused(capsys, step)
    assert ready.names().index("wfp_close_dynamic") < ready.names().index("close_job")
    _nothing_left(ready)


def test_the_loop_dying_mid_run_blocks_the_commands_traffic_and_the_run_says_so(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        pid = _pid(api, launch)
        seen.append(api.tcp_connect(pid, "198.18.0.7", 443, 50000))  # captured while the loop runs
        api.divert_crash()  # WinDivert's driver unloaded under the loop: its handles now fail open
        assert api.wait_until(lambda: not api.dynamic)  # the loop took its permits with it
        seen.append(api.tcp_connect(pid, "198.18.0.9", 443, 50001))
        return 3

    ready.program = program
    assert cli.main(RUN) == 3  # CMD's own status
    assert seen == ["proxy", "refused"]  # after the loop died: WFP's persistent block, not a leak
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "redirect loop stopped" in line]
    assert len(said) == 1 and said[0].startswith("sandgate: error:") and "blocked from now on" in said[0]
    assert "handle is invalid" in said[0]
    _nothing_left(ready)


def _left(api: FakeWinApi, dst: str) -> list[object]:
    """The SYNs to `dst` that left the host unchanged (sent by the loop, not reflected inward)."""
    return [p for h in api.divert_handles for p in h.sent if getattr(p, "dst_addr", None) == dst]


def test_a_sandbox_process_outside_the_job_is_dropped_while_the_job_and_others_go_their_way(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hole the sweep's author found: the run's permits match the sandbox SID, not the job, so
    a process of that SID that escaped the job (an interactive-token task's action) would have had
    direct off-host TCP, unaudited, until teardown. Now its SYN is dropped, in the same run in
    which the job's connect reaches the proxy and another user's passes untouched."""
    seen: dict[str, str] = {}

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        sid = sandbox_sid(api)
        escaped, other = api.spawn_outside(sid), api.spawn_outside(OTHER_SID)
        seen["job"] = api.tcp_connect(_pid(api, launch), "198.18.0.7", 443, 50000)
        seen["escaped"] = api.tcp_connect(escaped, "198.18.0.8", 443, 50001)
        seen["again"] = api.tcp_connect(escaped, "198.18.0.8", 443, 50001)  # its retransmit
        seen["other"] = api.tcp_connect(other, "198.18.0.9", 443, 50002)
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == {"job": "proxy", "escaped": "dropped", "again": "dropped", "other": "direct"}
    assert _left(ready, "198.18.0.8") == []  # no SYN of the escaped process left the host
    assert len(_left(ready, "198.18.0.9")) == 1  # another user's went out as it was
    _nothing_left(ready)  # no violation: no sandbox-SID SYN passed unchanged
    assert ready.live(sandbox_sid(ready)) == []  # and the sweep ended the escaped process


@pytest.mark.parametrize("refused", ["process", "token"])
@pytest.mark.parametrize("whose", ["sandbox", "other"])
def test_an_owner_the_loop_cannot_read_is_dropped(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str], refused: str, whose: str
) -> None:
    """OpenProcess refused (its DACL, or the System process/CSRSS), or its token's DACL refusing
    TOKEN_QUERY: whose flow it is cannot be told, so it is dropped, whoever it really is."""
    seen: list[str] = []

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        pid = api.spawn_outside(sandbox_sid(api) if whose == "sandbox" else OTHER_SID)
        api.owner_refused[pid] = refused
        seen.append(api.tcp_connect(pid, "198.18.0.8", 443, 50001))
        seen.append(api.tcp_connect(_pid(api, launch), "198.18.0.7", 443, 50000))  # control
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == ["dropped", "proxy"] and _left(ready, "198.18.0.8") == []
    _nothing_left(ready)


def test_the_fake_catches_a_loop_that_passes_the_sandbox_users_flows(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check behind the tests above: the old verdict (outside the job -> pass) lets the escaped
    process's SYN out unchanged, and the fake records it."""
    monkeypatch.setattr(owners, "judge", lambda owner, sid: "reflect" if owner.membership == "job" else "pass")
    seen: list[str] = []

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        seen.append(api.tcp_connect(api.spawn_outside(sandbox_sid(api)), "198.18.0.8", 443, 50001))
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == ["direct"] and any("passed unchanged" in v for v in ready.violations), ready.violations


def test_the_fake_catches_a_loop_that_dies_and_leaves_its_permits(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check behind the test above: a loop that dies without removing its permits lets CMD's
    next connect out unchanged (WinDivert fails open), and the fake records it."""

    def silent(self: win32divert.TransparentPath) -> None:
        try:
            assert self.redirector is not None
            self.redirector.serve(self._stop)
        except OSError:
            pass  # the bug: no _close(), the permits outlive the handles

    monkeypatch.setattr(win32divert.TransparentPath, "_run", silent)
    seen: list[str] = []

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        api.divert_crash()
        seen.append(api.tcp_connect(_pid(api, launch), "198.18.0.9", 443, 50001))
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == ["direct"] and ready.violations and "left unchanged" in ready.violations[0]


def test_unelevated_is_refused_before_anything_is_touched(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    ready.admin = False
    _refused(capsys, "--transparent needs an elevated")
    assert not {"serve_resolver", "start_proxy", "create_job", "divert_open"} & set(ready.names())
    _nothing_left(ready)


def test_without_setup_transparent_the_run_says_what_to_do(
    machine: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["setup"]) == 0
    capsys.readouterr()
    _refused(capsys, "sandgate setup --transparent")
    assert "divert_open" not in machine.names()


def test_without_a_policy_there_is_nothing_to_capture_into(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--transparent", "--", "tool"])
    assert "--transparent needs a policy" in capsys.readouterr().err
    assert "divert_open" not in ready.names()


def test_a_run_without_the_flag_never_opens_windivert(ready: FakeWinApi) -> None:
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == 7
    assert not {"serve_resolver", "divert_open", "wfp_open_dynamic"} & set(ready.names())
    (argv,) = [args[0] for name, args in ready.calls if name == "start_proxy"]
    assert "--transparent" not in argv  # type: ignore[operator]


def test_the_flag_is_windows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", "linux")  # Linux captures transparently always (nftables)
    with pytest.raises(SystemExit):
        cli.build_parser("run").parse_args(RUN)
    monkeypatch.setattr("sys.platform", "win32")
    assert cli.build_parser("run").parse_args(RUN).transparent is True


def _connects(api: FakeWinApi, launch: Launch) -> dict[str, str]:
    """The job's connect and another user's, in one run (their process DACLs grant only their users)."""
    other = api.spawn_outside(OTHER_SID)
    return {
        "job": api.tcp_connect(_pid(api, launch), "198.18.0.7", 443, 50000),
        "other": api.tcp_connect(other, "198.18.0.9", 443, 50002),
    }


def test_the_loop_runs_with_debug_privilege_enabled_and_turns_it_off_after(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenProcess on another user's process is checked against its DACL (its user and SYSTEM):
    the elevated loop opens it only with SeDebugPrivilege enabled, which the run enables before the
    loop starts and disables when it stops."""
    seen: dict[str, object] = {}

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        seen["enabled"] = api.debug_enabled
        seen.update(_connects(api, launch))
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == {"enabled": True, "job": "proxy", "other": "direct"}
    names = ready.names()
    on, off = [i for i, n in enumerate(names) if n == "debug_privilege"]
    assert on < names.index("divert_open") and names.index("wfp_close_dynamic") < off
    assert [a for n, a in ready.calls if n == "debug_privilege"] == [(True,), (False,)]
    _nothing_left(ready)


def test_a_privilege_enabled_before_the_run_stays_enabled(ready: FakeWinApi) -> None:
    ready.debug_enabled = True  # sandgate started from a debugger's shell, say: left as it was found
    assert cli.main(RUN) == 7
    assert ready.debug_enabled and [a for n, a in ready.calls if n == "debug_privilege"] == [(True,)]


def test_a_token_without_debug_privilege_refuses_the_run_in_one_line(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """AdjustTokenPrivileges "succeeds" with ERROR_NOT_ALL_ASSIGNED when the token lacks the privilege:
    said, and the run refused before the loop or CMD exists (else every other user's flow, and
    perhaps the command's, would be dropped: no network, silently)."""
    ready.debug_held = False
    _refused(capsys, "SeDebugPrivilege", "error 1300", "without --transparent")
    assert not {"divert_open", "wfp_open_dynamic", "start_suspended"} & set(ready.names())
    _nothing_left(ready)


def test_the_fake_refuses_other_users_processes_to_a_loop_without_the_privilege(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check behind the tests above: a loop that never enables SeDebugPrivilege cannot open
    another user's process, so that user's flow is dropped; the job's still reaches the proxy, by
    the job's own pid list (its process's DACL refuses the loop too)."""
    monkeypatch.setattr(FakeWinApi, "debug_privilege", lambda self, enable: False)  # the old loop
    seen: dict[str, str] = {}

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        assert api.owner_open(_pid(api, launch)) == owners.Opened()  # the sandbox user's DACL: refused
        seen.update(_connects(api, launch))
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == {"job": "proxy", "other": "dropped"} and _left(ready, "198.18.0.9") == []
    _nothing_left(ready)


def test_the_job_is_told_by_its_pid_list_even_when_its_process_cannot_be_opened(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """Membership is the job's own answer (QueryInformationJobObject), not the process's: the
    command's connect is reflected even when OpenProcess on it is refused outright."""
    seen: list[str] = []

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        pid = _pid(api, launch)
        api.owner_refused[pid] = "process"
        seen.append(api.tcp_connect(pid, "198.18.0.7", 443, 50000))
        return 0

    ready.program = program
    assert cli.main(RUN) == 0
    assert seen == ["proxy"]
    _nothing_left(ready)


def test_membership_is_the_job_lists_and_an_unreadable_list_is_dropped() -> None:
    """owners.held, the pure part: listed -> the job's whatever the handle; not listed -> outside,
    judged by the SID; no list -> unknown (dropped), the handle kept for release either way."""
    sid = "S-1-5-21-1-2-3-1001"
    opened = owners.Opened(44, OTHER_SID)
    assert owners.held(7, owners.Opened(), frozenset({7})) == owners.Held(owners.Owner("job", None))
    assert owners.held(8, opened, frozenset({7})) == owners.Held(owners.Owner("outside", OTHER_SID), 44)
    assert owners.held(8, opened, None) == owners.Held(owners.Owner("unknown", OTHER_SID), 44)
    assert [
        owners.judge(owners.held(8, opened, listed).owner, sid) for listed in (frozenset({8}), frozenset(), None)
    ] == [
        "reflect",
        "pass",
        "drop",
    ]


def test_permits_that_cannot_be_removed_still_turn_the_privilege_off(
    ready: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """win-divert M-b: the permits failing to go (the handles then stay open until the process exits,
    fail closed by BFE's session end) must not leave SeDebugPrivilege enabled in sandgate's token."""
    ready.fail = ("wfp_close_dynamic", 1)
    cli.main(RUN)
    err = capsys.readouterr().err
    assert "could not stop the transparent capture" in err and "Traceback" not in err
    assert [a for n, a in ready.calls if n == "debug_privilege"] == [(True,), (False,)]
    assert not ready.debug_enabled
