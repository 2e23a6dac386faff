"""The Windows backend through the fake WinApi: `sandgate run -- CMD` end to end with
sys.platform = "win32", the order of effects, and nothing left behind after a failure at any step.

None of this is Windows evidence (docs/windows.md, "What has run where"): it checks the order and
the bookkeeping the backend owns; the real calls are realapi.py's, run only by the Windows CI.
"""

from __future__ import annotations

import json

import pytest

from fsguard.windows import acl, acljournal
from launcher import cli
from launcher.run import windowsbackend as backend
from launcher.run.windows import runner
from sgbase.windows import state
from sgbase.windows.api import WinApiError
from tests.support import winfake
from tests.support.winfake import APPDATA, WS, FakeWinApi


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def _run(*argv: str) -> int:
    return cli.main(["run", "--allow", "example.test", *argv, "--", "tool.exe", "--flag", "a b"])


def _journals(api: FakeWinApi) -> list[str]:
    return [p for p in api.m.files if p.startswith(state.journal_dir(APPDATA))]


def test_a_run_goes_through_every_step_in_order(api: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    before = api.snapshot()
    assert _run() == 7  # CMD's own exit code
    names = api.names()
    order = [
        "wfp_installed",  # setup checked first
        "unprotect",
        "list_dir",  # left journals replayed
        "start_proxy",
        "await_proxy",
        "append_line",  # journal before the first ACE
        "set_dacl",
        "create_job",
        "start_suspended",
        "assign",
        "resume",
        "wait",
        "close_job",  # teardown, reversed
        "remove_file",
        "stop_proxy",
    ]
    firsts = [names.index(n) for n in order[:-3]] + [len(names) - 1 - names[::-1].index(n) for n in order[-3:]]
    assert firsts == sorted(firsts), list(zip(order, firsts, strict=True))
    assert not api.violations
    assert api.snapshot() == before  # ACLs restored, placeholders gone, journal deleted, nothing running
    start = next(args for name, args in api.calls if name == "start_suspended")
    user, argv, cwd, env = start
    assert user == state.sandbox_user_name(winfake.REAL_SID) and argv == ("tool.exe", "--flag", "a b") and cwd == WS
    assert isinstance(env, dict) and env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and env["NO_PROXY"] == ""
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["PATH"] == r"C:\Windows;C:\Tools"  # fsguard's env filter
    proxy_argv = next(args[0] for name, args in api.calls if name == "start_proxy")
    assert isinstance(proxy_argv, tuple)
    assert proxy_argv[1:5] == ("-P", "-m", "launcher.cli", "proxy")  # -P: never the workspace's modules
    assert proxy_argv[-2:] == ("--listen", "127.0.0.1:3128")
    assert proxy_argv[proxy_argv.index("--allow") : proxy_argv.index("--allow") + 2] == ("--allow", "example.test")
    assert "sandgate: error" not in capsys.readouterr().err


def test_every_ace_is_journalled_before_it_is_set(api: FakeWinApi) -> None:
    _run()
    journalled: set[str] = set()
    applied = 0
    for name, args in api.calls:
        if name == "create_job":
            break  # the apply phase is over; what follows is teardown
        if name == "append_line":
            entry = acljournal.decode(str(args[1]))
            journalled.add(entry.after_sddl or entry.path)
        if name == "set_dacl":
            applied += 1
            assert args[1] in journalled, f"{args[0]} changed before its journal line"
    assert applied >= 5  # grant on the workspace, denies on .git internals, .vscode, ~/.ssh...


def test_during_the_run_the_boundary_is_in_place(api: FakeWinApi) -> None:
    seen: dict[str, str] = {}

    def wait(proc: object) -> int:
        seen.update(api.m.dacls)
        return 0

    api.wait = wait  # type: ignore[method-assign]
    sid = winfake.sandbox_sid(api)
    assert _run() == 0
    assert f"(A;OICI;0x1301bf;;;{sid})" in seen[WS]  # Modify on the workspace
    assert f"(D;OICI;0xd0156;;;{sid})" in seen[WS + r"\.git\hooks"]  # deny-write on hooks
    assert seen[WS + r"\.idea"]  # a placeholder for a protected name that did not exist
    assert f"(D;OICI;{acl.DENY_READ:#x};;;{sid})" in seen[winfake.HOME + r"\.ssh"]  # deny-read on secrets
    assert f"(D;OICI;{acl.DENY_READ:#x};;;{sid})" in seen[state.root(APPDATA)]  # sandgate's own state
    assert WS + r"\.idea" not in api.m.dacls  # ...and gone again


STEPS = [
    ("list_dir", 1),
    ("start_proxy", 1),
    ("await_proxy", 1),
    ("dacl", 1),
    ("append_line", 1),
    ("set_dacl", 1),
    ("set_dacl", 4),
    ("make_dir", 1),
    ("create_job", 1),
    ("create_desktop", 1),
    ("start_suspended", 1),
    ("assign", 1),
    ("resume", 1),
    ("wait", 1),
]


@pytest.mark.parametrize("step", STEPS, ids=[f"{n}#{i}" for n, i in STEPS])
def test_a_failure_at_any_step_leaves_nothing_behind(
    api: FakeWinApi, step: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    before = api.snapshot()
    api.fail = step
    with pytest.raises(SystemExit) as exit_:
        _run()
    assert exit_.value.code == 125
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # the failure itself, then at most what to do about it
    assert last.startswith(f"sandgate: error: fake failure of {step[0]}") and "Traceback" not in err
    assert step in {(n, sum(c == n for c in api.names()[: i + 1])) for i, n in enumerate(api.names())}
    assert api.snapshot() == before  # no ACE, no placeholder, no job, no process, no proxy, no journal
    assert not api.violations
    if step[0] == "assign":  # outside the job: terminated, never resumed
        assert "terminate" in api.names() and "resume" not in api.names()


def _setup_refused(api: FakeWinApi, capsys: pytest.CaptureFixture[str], what: str) -> None:
    api.calls.clear()
    before = api.snapshot()
    with pytest.raises(SystemExit):
        _run()
    err = capsys.readouterr().err.strip()
    assert err.startswith("sandgate: error: ") and "\n" not in err and what in err
    assert err.endswith("run 'sandgate setup' as administrator")
    assert not {"start_proxy", "set_dacl", "make_dir", "create_job", "start_suspended"} & set(api.names())
    assert api.snapshot() == before


def test_without_setup_a_run_is_refused_before_anything_is_touched(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.m.filters.clear()
    _setup_refused(api, capsys, "WFP filters")
    name = state.sandbox_user_name(winfake.REAL_SID)
    winfake.set_up(api)
    del api.m.users[name]
    _setup_refused(api, capsys, f"sandbox user {name} is missing")
    api.m.files.clear()
    _setup_refused(api, capsys, "one-time setup")


def test_the_matching_run_after_setup_passes(api: FakeWinApi) -> None:
    assert _run() == 7 and "start_suspended" in api.names()  # control for the refusals above


def _left_journal(api: FakeWinApi, pid: int, *, torn: bool = False) -> tuple[str, str]:
    """What a run killed after setting one ACE leaves: the journal line and the changed DACL."""
    sid = winfake.sandbox_sid(api)
    entry = acljournal.entry_for(WS, f"(A;OICI;0x1301bf;;;{sid})", api.m.dacls[WS], sid)
    path = state.journal_path(APPDATA, pid, "deadbeef")
    api.m.files[path] = (acljournal.encode(entry) + "\n" + ('{"path": "C:\\\\x", "bef' if torn else "")).encode()
    api.m.dacls[WS] = entry.after_sddl
    return path, entry.before_sddl


def test_a_killed_runs_journal_is_replayed_by_the_next_run(api: FakeWinApi) -> None:
    path, before = _left_journal(api, 999, torn=True)  # the crash tore its last, never-applied line
    assert _run() == 7
    assert api.m.dacls[WS] == before and path not in api.m.files


def test_a_live_runs_journal_is_left_alone(api: FakeWinApi) -> None:
    api.alive.add(555)
    path, _ = _left_journal(api, 555)
    changed = api.m.dacls[WS]
    assert _run() == 7
    assert api.m.dacls[WS] == changed and path in api.m.files  # its boundary is still needed


def test_a_change_the_user_made_meanwhile_survives_the_restore(api: FakeWinApi) -> None:
    path, _ = _left_journal(api, 999)
    sid = winfake.sandbox_sid(api)
    api.m.dacls[WS] = api.m.dacls[WS] + "(A;OICI;FA;;;S-1-5-21-9-9-9-2000)"  # the user shared the folder
    assert runner.cleanup(lambda _: None) == 0
    assert sid not in api.m.dacls[WS] and "S-1-5-21-9-9-9-2000" in api.m.dacls[WS] and path not in api.m.files


def test_cleanup_on_windows_replays_left_journals(api: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    path, before = _left_journal(api, 999)
    assert cli.main(["cleanup"]) == 0
    assert api.m.dacls[WS] == before and path not in api.m.files
    assert "sandgate: removed ACL journal" in capsys.readouterr().err
    assert cli.main(["cleanup"]) == 0 and "nothing to clean up" in capsys.readouterr().err


def test_a_failed_restore_keeps_the_journal_for_cleanup(api: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    before = api.snapshot()
    real_set = api.set_dacl
    applied = 0

    def set_dacl(path: str, text: str, walk: bool = True) -> None:
        nonlocal applied
        applied += 1
        if "close_job" in api.names() and applied % 2:
            raise WinApiError("access denied")  # some restores fail during teardown
        real_set(path, text, walk)

    api.set_dacl = set_dacl  # type: ignore[method-assign]
    assert _run() == 7  # CMD's status still reaches the caller
    assert "'sandgate cleanup' retries" in capsys.readouterr().err
    assert len(_journals(api)) == 1 and api.snapshot() != before
    api.set_dacl = real_set  # type: ignore[method-assign]
    api.alive.discard(4242)  # that run is over (its pid is ours here)
    monkey_pid = api.own_pid
    api.own_pid = lambda: 1  # type: ignore[method-assign]
    assert runner.cleanup(lambda _: None) == 0
    api.own_pid = monkey_pid  # type: ignore[method-assign]
    assert api.snapshot() == before


def test_teardown_is_idempotent(api: FakeWinApi) -> None:
    be = backend.WindowsBackend(api, None)
    from launcher.config.load import Policy
    from launcher.run.seam import SandboxRequest
    from netguard.policy import NetworkPolicy

    box = be.make(SandboxRequest((winfake.TOOL,), WS, {}, Policy(NetworkPolicy(), ()), "t1"))
    be.start(box)
    be.teardown(box)
    after = api.snapshot()
    n = len(api.calls)
    be.teardown(box)
    assert api.snapshot() == after and [c for c, _ in api.calls[n:]] == []


def test_no_policy_means_no_proxy_and_options_windows_lacks_are_refused(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.chdir(str(tmp_path))  # no ./.sandgate.yaml here
    assert cli.main(["run", "-q", "--", "tool.exe"]) == 7 and "start_proxy" not in api.names()
    for flag in (["--ask"], ["--user", "bob"]):
        with pytest.raises(SystemExit):
            cli.main(["run", "--allow", "example.test", *flag, "--", "tool.exe"])
        assert "not available on Windows yet" in capsys.readouterr().err


def test_the_journal_lines_are_the_journal_format(api: FakeWinApi) -> None:
    api.fail = ("create_job", 1)  # stop with the ACEs applied, the journal full
    lines: list[str] = []
    real = api.remove_file

    def keep(path: str) -> None:
        if path in api.m.files and path.endswith(".jsonl"):
            lines.extend(api.m.files[path].decode().splitlines())
        real(path)

    api.remove_file = keep  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        _run()
    assert lines and all(json.loads(line)["sid"] == winfake.sandbox_sid(api) for line in lines)
    assert any(json.loads(line)["placeholder"] for line in lines)
