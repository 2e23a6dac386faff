"""verify's `runtime_dirs` probe (selftest/probes/runtimedirs.py), without a sandbox.

Without a sandbox nothing is hidden, so a runtime directory holding a live socket must read as
"permitted"; empty or missing ones as "blocked". The directories are the test's own (the probe's
list is monkeypatched), so no real runtime directory is touched or depended on.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.run import runtimedirs as rdirs
from selftest.probes import core
from selftest.probes import runtimedirs as probe


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "live").mkdir()
    (tmp_path / "empty").mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:  # like a daemon's control socket
        s.bind(str(tmp_path / "live" / "daemon-1-x.sock"))
        s.listen()
        yield tmp_path


def _run(monkeypatch: pytest.MonkeyPatch, paths: list[Path]) -> core.Record:
    monkeypatch.setattr(probe, "candidates", lambda: tuple(map(str, paths)))
    spec = object()  # the probe reads nothing of the spec
    return core.run_one(core.REGISTRY["runtime_dirs"], spec, "child", watchdog=None)  # type: ignore[arg-type]


def test_a_reachable_runtime_directory_is_reported(dirs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _run(monkeypatch, [dirs / "empty", dirs / "live", dirs / "missing"])
    assert rec["observed"] == "permitted" and rec["expected"] == "blocked", rec
    assert "daemon-1-x.sock" in rec["detail"] and "connected to" in rec["detail"], rec


def test_empty_and_missing_directories_are_blocked(dirs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _run(monkeypatch, [dirs / "empty", dirs / "missing"])
    assert rec["observed"] == "blocked", rec
    assert f"absent: {dirs / 'missing'}" in rec["detail"] and f"empty: {dirs / 'empty'}" in rec["detail"], rec


def test_the_probe_asks_for_the_launchers_list_for_its_own_uid() -> None:
    assert os.getuid() in probe.host_uids()
    assert set(probe.candidates()) >= set(rdirs.plan({}, [os.getuid()]).hide)
