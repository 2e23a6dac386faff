"""verify's `config_files` probe (selftest/probes/configfiles.py) and its outside half
(selftest/configstage.py), without a sandbox.

Without a sandbox nothing holds the files, so the probe must read "permitted" and the host must
show the change; with nothing staged it cannot tell ("unsupported"). Inside a real run the probe
is tests/e2e/test_verify.py's (and tests/e2e/test_config_files_e2e.py tries the same operations).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from selftest.configstage import ConfigStage
from selftest.probes import configfiles as probe
from selftest.probes import core


def _run() -> core.Record:
    spec = SimpleNamespace(marker_tag="")  # the probe reads only the marker's tag
    return core.run_one(core.REGISTRY["config_files"], spec, "child", watchdog=None)  # type: ignore[arg-type]


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    return ws


def test_unprotected_configuration_reads_as_permitted_and_the_host_shows_it(ws: Path) -> None:
    stage = ConfigStage.stage(ws, ws.parent / "ca.pem", os.getuid(), os.getgid())
    assert stage.evidence() == {}
    assert "include: [./included/extra.yaml]" in stage.policy.read_text() and stage.ca.is_file()
    rec = _run()
    assert (rec["expected"], rec["observed"]) == ("blocked", "permitted"), rec
    shown = stage.evidence()[("config_files", "*")]
    assert all(f in shown for f in probe.CONFIG_FILES), shown
    assert (ws / probe.NEIGHBOUR_DIR).is_dir() and (ws / probe.CONFIG_DIR).is_dir()  # renamed back


def test_nothing_staged_is_unsupported_and_a_failed_control_cannot_tell(ws: Path) -> None:
    rec = _run()
    assert rec["observed"] == "unsupported" and "staged no" in rec["detail"], rec
    ConfigStage.stage(ws, ws.parent / "ca.pem", os.getuid(), os.getgid())
    (ws / probe.NEIGHBOUR).unlink()
    (ws / probe.NEIGHBOUR).mkdir()  # the ordinary file cannot be written: the control fails first
    rec = _run()
    assert rec["observed"] == "unsupported" and "control failed" in rec["detail"], rec
