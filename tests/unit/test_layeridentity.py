"""Whose home layers are whose (issue 24, item 6): a layer belongs to a uid AND a home directory's
identity, so a new account given a deleted account's uid (and even its home's path) starts from
its own home; and every user's store is hidden inside every sandbox, not only the command's.

Runs as root (like every unit test here that plans layers); everything lives under a throwaway
directory in /var/tmp, the stores' roots redirected there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsguard import homeoverlay, layerstore

UID = 4242  # a uid without an account: only a directory name here


@pytest.fixture
def tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandgate-test-layerid-", dir="/var/tmp"))
    monkeypatch.setattr(layerstore, "ROOT_BASE", d / "lib")
    try:
        yield d
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(d)], capture_output=True, check=False)  # our own temp dir
        shutil.rmtree(d, ignore_errors=True)


def _plan(home: Path, ws: Path) -> homeoverlay.HomeOverlay:
    ov = homeoverlay.plan(str(home), (), uid=UID, owner=0, workspace=str(ws))
    assert ov is not None and len(ov.layers) == 1
    return ov


def test_a_new_account_at_a_deleted_accounts_uid_and_home_path_starts_from_its_own_home(tmp: Path) -> None:
    home, ws = tmp / "home" / "alice", tmp / "proj"
    home.mkdir(parents=True)
    ws.mkdir()
    first = _plan(home, ws)
    (Path(first.layers[0]) / ".npmrc").write_text("//registry/:_authToken=old-account\n")  # as a fold leaves it
    os.close(first.hold)  # the run ended
    again = _plan(home, ws)
    assert again.layers == first.layers  # the same account: the same, warm layer (the control)
    os.close(again.hold)
    old_base = Path(first.layers[0]).parents[1]
    shutil.rmtree(home)  # userdel -r; then useradd gives the uid, and the path, to someone else
    home.mkdir()
    new = _plan(home, ws)
    try:
        assert Path(new.layers[0]).parents[1] != old_base
        assert not (Path(new.layers[0]) / ".npmrc").exists()
        assert not old_base.exists(), "the old account's layer outlived its home"
        rec = layerstore.recorded_home(Path(new.layers[0]).parents[1])
        assert rec == (str(home), layerstore.home_identity(str(home)))
    finally:
        os.close(new.hold)


def test_a_layer_recorded_before_home_identities_is_collected(tmp: Path) -> None:
    home, ws = tmp / "home" / "bob", tmp / "proj"
    home.mkdir(parents=True)
    ws.mkdir()
    legacy = layerstore.store(UID) / "0123456789ab"  # sandgate before issue 24: keyed by the path alone
    for d in (layerstore.store(UID), legacy, legacy / "ws-00"):
        layerstore.private(d, 0)
    (legacy / "home").write_text(f"{home}\n")
    ov = _plan(home, ws)
    os.close(ov.hold)
    assert not legacy.exists()
    assert layerstore.recorded_home(Path(ov.layers[0]).parents[1]) is not None


def test_every_users_store_is_hidden_and_no_lookalike(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layerstore, "USER_STORE_PARENT", tmp)
    for name in ("sandgate-1000", "sandgate-1001", "sandgate-conc-abc", "sandgate-12a"):
        (tmp / name).mkdir()
    os.chown(tmp / "sandgate-1001", 1001, 1001)  # another user's, 0700: a root command could still read it
    (tmp / "sandgate-1001").chmod(0o700)
    (tmp / "sandgate-77").symlink_to(tmp / "sandgate-conc-abc")  # planted: must not hide its target
    (tmp / "sandgate-5").write_text("")
    hidden = homeoverlay.hidden_stores(UID)
    assert set(hidden) == {
        tmp / "lib",
        Path(f"/var/tmp/sandgate-{UID}"),
        tmp / "sandgate-1000",
        tmp / "sandgate-1001",
    }


def test_the_home_identity_ignores_the_device_number(tmp: Path) -> None:
    ident = layerstore.identity(str(tmp))
    assert layerstore.home_identity(str(tmp)) == ident.split(":", 1)[1] and ident.count(":") == 2
