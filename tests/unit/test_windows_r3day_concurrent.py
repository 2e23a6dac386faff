"""r3-day D9: a second run started while one runs must not replay a dead run's journal.

Both runs' ACEs belong to the same sandbox SID. A journal left by a killed run whose pid was reused
(win-acl A7; after a reboot every pid is new) is "live" when the first run starts, so the first run
applies its ACEs on top of the leftover ones; when that pid's process ends and the agent starts a
second command, the second run's step 2 replayed the journal: the DACL had changed since, so
restore_action took out *every* ACE of the sandbox SID ("remove_sid_aces"), the first run's grants
and protections included, mid-run; and only then was the second run refused at the port.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fsguard.windows import acljournal, sddl
from fsguard.windows.launch import Launch
from launcher import cli
from sgbase.windows import state
from tests.support import winfake
from tests.support.winfake import APPDATA, BASE_DACL, WS, FakeWinApi

STALE_PID, FIRST_PID, SECOND_PID = 5555, 4242, 4343


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def _stale_journal(api: FakeWinApi) -> None:
    """A killed run's journal for the workspace root, its ACE still there, its pid reused."""
    sid = winfake.sandbox_sid(api)
    entry = acljournal.entry_for(WS, f"(A;OICI;0x1301bf;;;{sid})", BASE_DACL, sid)
    api.m.files[state.journal_path(APPDATA, STALE_PID, "old")] = (acljournal.encode(entry) + "\n").encode()
    api.m.dacls[WS] = entry.after_sddl
    api.alive.add(STALE_PID)


def _second(seen: list[object], monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeWinApi, Launch, str], int]:
    def first(fake: FakeWinApi, launch: Launch, desk: str) -> int:
        if len(fake.launches) > 1:
            return 0
        fake.alive.discard(STALE_PID)  # the process that held the reused pid ends
        fake.alive |= {FIRST_PID, SECOND_PID}
        monkeypatch.setattr(fake, "own_pid", lambda: SECOND_PID)  # the second sandgate process
        workspace = fake.m.dacls[WS]
        try:
            seen.append(cli.main(["run", "--allow", "example.test", "--", "tool"]))
        except SystemExit as e:
            seen.append(e.code)
        finally:
            monkeypatch.setattr(fake, "own_pid", lambda: FIRST_PID)
        seen.append(sddl.same_dacl(fake.m.dacls[WS], workspace))  # the first run's ACEs untouched
        return 0

    return first


def test_a_refused_second_run_leaves_the_first_runs_aces(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    _stale_journal(api)
    seen: list[object] = []
    api.program = _second(seen, monkeypatch)
    assert cli.main(["run", "--", "tool"]) == 0
    assert seen == [125, True]


def test_the_next_run_after_both_replays_the_stale_journal(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matching permitted case: with no other run live, the dead journal is replayed and removed."""
    _stale_journal(api)
    api.alive.discard(STALE_PID)
    assert cli.main(["run", "--", "tool"]) == 7
    assert sddl.same_dacl(api.m.dacls[WS], BASE_DACL)
    assert not [p for p in api.m.files if p.startswith(state.journal_dir(APPDATA))]


def test_cleanup_during_a_live_run_replays_nothing(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sandgate cleanup` follows the same rule (r3-day's note): while another run lives, a dead run's journal
    is left alone (its undo would take the live run's ACEs of the same SID out), exit 1, said in one line;
    once that run has ended, the same cleanup replays and removes it."""
    _stale_journal(api)
    api.alive.discard(STALE_PID)  # the killed run's pid: gone
    live = state.journal_path(APPDATA, SECOND_PID, "live")  # another sandgate process than this one
    api.m.files[live] = b""  # a live run's journal
    api.alive.add(SECOND_PID)
    workspace = api.m.dacls[WS]
    assert cli.main(["cleanup"]) == 1
    assert "another sandgate run is live" in capsys.readouterr().err
    assert api.m.dacls[WS] == workspace and state.journal_path(APPDATA, STALE_PID, "old") in api.m.files
    api.alive.discard(SECOND_PID)  # it ended (and left its empty journal: nothing to undo)
    assert cli.main(["cleanup"]) == 0
    assert sddl.same_dacl(api.m.dacls[WS], BASE_DACL)
