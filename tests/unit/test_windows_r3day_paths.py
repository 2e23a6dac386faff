r"""r3-day D3: a workspace path near MAX_PATH must not leave `.git`'s children unprotected.

Without the long-path opt-in, "the maximum length for a path is MAX_PATH, which is defined as 260
characters", while an extended-length name ("\\?\" prefix) always works
(learn.microsoft.com/windows/win32/fileio/maximum-file-path-limitation). The fake below enforces
that for `exists` (the real one is os.path.lexists): a 252-character workspace is a valid current
directory, but its `.git\HEAD` (262) is "not found" by the plain name. The backend planned `.git` as
a `gitdir:` file and dropped every `.git\<x>` protection; CMD could write `.git\hooks` via `\\?\`.
"""

from __future__ import annotations

import pytest

from launcher import cli
from sgbase.windows import state
from tests.support import winfake
from tests.support.winfake import WS, FakeWinApi, Machine

MAX_PATH = 260
LONG_WS = "C:\\src\\" + "d" * (252 - len("C:\\src\\"))  # 252: SetCurrentDirectory's MAX_PATH - 2 allows it


def _moved(m: Machine) -> Machine:
    """The fake's default machine with its workspace at LONG_WS."""

    def mv(p: str) -> str:
        return LONG_WS + p[len(WS) :] if p == WS or p.startswith(WS + "\\") else p

    m.dacls = {mv(k): v for k, v in m.dacls.items()}
    m.dirs = {mv(p) for p in m.dirs}
    m.files = {mv(k): v for k, v in m.files.items()}
    return m


class LongWorkspace(FakeWinApi):
    """The workspace at LONG_WS, long paths enabled (plain names of any length work)."""

    def __init__(self) -> None:
        super().__init__(_moved(winfake.workspace()))

    def cwd(self) -> str:
        return LONG_WS


class NoLongPaths(LongWorkspace):
    """As Windows without LongPathsEnabled: a plain name of MAX_PATH or more is not found."""

    def exists(self, path: str) -> bool:
        if path.startswith("\\\\?\\"):
            return super().exists(path[4:])
        return len(path) < MAX_PATH and super().exists(path)


def _install(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch, api)


def _run() -> int:
    return cli.main(["run", "--allow", "example.test", "--", "tool.exe"])


def _hooks_denied(api: FakeWinApi) -> bool:
    sid = winfake.sandbox_sid(api)
    return any(
        name == "set_dacl" and args[0] == LONG_WS + r"\.git\hooks" and "(D;" in str(args[1]) and sid in str(args[1])
        for name, args in api.calls
    )


def test_without_long_paths_the_run_is_refused_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = _install(NoLongPaths(), monkeypatch)
    before = api.snapshot()
    with pytest.raises(SystemExit) as got:
        _run()
    assert got.value.code == 125
    err = capsys.readouterr().err
    assert "MAX_PATH" in err and "LongPathsEnabled" in err and "Traceback" not in err
    assert "start_suspended" not in api.names() and "set_dacl" not in api.names()
    assert api.snapshot() == before
    assert not [p for p in api.m.files if p.startswith(state.journal_dir(winfake.APPDATA))]


def test_with_long_paths_the_same_workspace_runs_and_hooks_are_protected(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _install(LongWorkspace(), monkeypatch)
    before = api.snapshot()
    assert _run() == 7
    assert _hooks_denied(api)  # the protection the plain-name miss dropped
    assert api.snapshot() == before
