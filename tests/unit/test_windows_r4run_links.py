r"""r4-run N1: a junction below the workspace that leads out of it refuses the run before any ACE is set.

The run's grant on the workspace is an inheritable ACE, and SetNamedSecurityInfoW "imposes the current
inheritance model on the ACLs of all objects in the hierarchy below the target object"
(learn.microsoft.com/windows/win32/secauthz/automatic-propagation-of-inheritable-aces); whether that walk
enters a junction is not documented, so the fake takes the worse reading (winfake._through_links). The
sandbox user can plant such a junction in one run (no privilege needed), and the next run's Modify ACE
would reach the target: the real user's profile, their Startup folder. A link that stays inside the
workspace (npm workspaces) is fine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsguard.windows import reparse, win32reparse
from launcher import cli
from tests.support import winfake
from tests.support.winfake import HOME, WS, FakeWinApi

STARTUP = HOME + r"\AppData\Roaming\Microsoft\Windows\Start Menu\Programs\Startup"


def _install(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def _run() -> int:
    return cli.main(["run", "--allow", "example.test", "--", "tool.exe"])


def test_a_junction_out_of_the_workspace_refuses_the_run_and_its_target_gets_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = _install(monkeypatch)
    api.m.dirs.add(STARTUP)
    api.m.dacls[STARTUP] = winfake.BASE_DACL
    api.m.links[WS + r"\x"] = STARTUP  # planted by an earlier run's command
    before = api.snapshot()
    with pytest.raises(SystemExit) as got:
        _run()
    assert got.value.code == 125
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and WS + r"\x is a link to" in err and "Traceback" not in err
    assert winfake.sandbox_sid(api) not in api.m.dacls[STARTUP]  # the grant never reached the target
    assert "set_dacl" not in api.names() and "start_suspended" not in api.names()
    assert api.snapshot() == before


def test_a_junction_inside_the_workspace_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _install(monkeypatch)
    api.m.dirs |= {WS + r"\packages", WS + r"\packages\lib", WS + r"\node_modules"}
    api.m.links[WS + r"\node_modules\lib"] = WS + r"\packages\lib"
    assert _run() == 7
    assert ("reparse_points", (WS,)) in api.calls


@pytest.mark.parametrize(
    ("target", "inside"),
    [
        ("\\\\?\\C:\\src\\proj\\packages\\lib", True),
        ("\\\\?\\c:\\SRC\\Proj", True),  # NTFS names compare case-insensitively
        ("\\\\?\\C:\\src\\proj-other", False),  # a sibling sharing the prefix
        ("\\\\?\\C:\\src\\proj\\..\\secret", False),
        ("..\\..\\outside", False),  # a relative symlink, from the folder holding it
        ("lib2", True),
        ("\\\\?\\Volume{0f2b1a3c-0000-0000-0000-100000000000}\\", False),  # a mounted volume
        ("\\\\?\\UNC\\server\\share", False),
        ("", False),  # unreadable
    ],
)
def test_targets_are_judged_after_resolving(target: str, inside: bool) -> None:
    link = reparse.Link(WS + r"\node_modules\x", target)
    assert (reparse.escaping([link], (WS,)) is None) is inside


def test_the_walk_lists_links_without_following_them(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    os.symlink(outside, ws / "a" / "b" / "out")
    os.symlink(ws / "a", ws / "loop")  # followed, this would list `out` twice and recurse
    found = {(Path(link.path).name, link.target) for link in win32reparse.walk(str(ws))}
    assert found == {("out", str(outside)), ("loop", str(ws / "a"))}
    assert win32reparse.walk(str(tmp_path / "missing")) == ()
