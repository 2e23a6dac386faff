"""Trust records for workspace policies: by path and content hash, private, atomic; and what an
untrusted file keeps (only what narrows)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fsguard import policy as fspolicy
from fsguard.env import EnvPolicy
from launcher.config import hostilefile, narrowing, trust, userconfig
from launcher.config.load import build_policy
from netguard import policy as netpolicy

REPO = Path(__file__).resolve().parent.parent.parent


def test_a_record_is_path_plus_content_hash_and_any_edit_revokes_it(tmp_path: Path) -> None:
    store = trust.Store(tmp_path / "state" / "sandgate")
    f = tmp_path / "ws" / ".sandgate.yaml"
    f.parent.mkdir()
    f.write_bytes(b"version: 1\n")
    assert store.status(f, f.read_bytes()) == ("unknown", None)
    [(key, digest)] = store.add([(f, f.read_bytes())])
    assert key == str(f) and digest == hostilefile.digest(b"version: 1\n")
    assert store.status(f, b"version: 1\n") == ("trusted", None)
    assert store.status(f, b"version: 1\n# one more byte\n") == ("changed", None)
    assert store.status(tmp_path / "other.yaml", b"version: 1\n") == ("unknown", None)  # same content, other path
    assert store.revoke(f) and not store.revoke(f)
    assert store.status(f, b"version: 1\n") == ("unknown", None)


def test_the_key_resolves_the_directory_but_keeps_a_symlinked_file_as_named(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)  # the user cd's through a symlink; os.getcwd() gives the real path
    (real / "dotfile.yaml").write_text("version: 1\n")
    (real / ".sandgate.yaml").symlink_to(real / "dotfile.yaml")
    assert trust.key(tmp_path / "link" / ".sandgate.yaml") == str(real / ".sandgate.yaml")


def test_the_list_is_private_and_written_atomically(tmp_path: Path) -> None:
    store = trust.Store(tmp_path / "state" / "sandgate")
    old = os.umask(0o022)
    try:
        store.add([(tmp_path / "a.yaml", b"a"), (tmp_path / "b.yaml", b"b")])
    finally:
        os.umask(old)
    assert stat.S_IMODE(store.file.stat().st_mode) == 0o600 and stat.S_IMODE(store.dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in store.dir.iterdir()) == ["trusted.json", "trusted.lock"]  # no temporary left
    doc = json.loads(store.file.read_text())
    assert doc["version"] == 1 and set(doc["files"]) == {str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")}
    assert trust.decode(trust.encode(store.records())) == store.records()


def test_a_damaged_or_foreign_list_is_never_believed(tmp_path: Path) -> None:
    store = trust.Store(tmp_path)
    f = tmp_path / "p.yaml"
    for bad in (b"{", b"[]", b'{"version": 2, "files": {}}', b'{"version": 1, "files": {"rel": {}}}', b"\xff"):
        store.file.write_bytes(bad)
        store.file.chmod(0o600)
        st, why = store.status(f, b"x")
        assert st == "unknown" and why is not None and "damaged" in why, bad
        with pytest.raises(trust.TrustError, match="damaged"):
            store.add([(f, b"x")])  # never overwritten: the user decides
    store.file.unlink()
    store.add([(f, b"x")])
    store.file.chmod(0o666)  # writable by anyone: anyone could have trusted anything
    st, why = store.status(f, b"x")
    assert st == "unknown" and why is not None and "writable by others" in why
    store.file.unlink()
    store.file.symlink_to(tmp_path / "elsewhere.json")
    assert store.status(f, b"x")[0] == "unknown"


def test_a_list_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    store = trust.Store(tmp_path / "home" / ".local" / "state" / "sandgate")
    assert store.problem((tmp_path / "elsewhere",)) is None
    why = store.problem((tmp_path / "home",))  # running in ~: the whole home is the writable workspace
    assert why is not None and f"is inside {tmp_path / 'home'}, where a sandboxed command may write" in why
    assert "XDG_STATE_HOME" in why
    extra = trust.Store(store.dir, writable=(tmp_path / "home" / ".local",))  # sandgate run --write ~/.local
    assert extra.problem((tmp_path / "elsewhere",)) is not None


def test_state_dir_follows_xdg_and_ignores_a_relative_value() -> None:
    assert userconfig.state_dir({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/sandgate")
    home = Path(os.path.expanduser("~"))
    assert userconfig.state_dir({"XDG_STATE_HOME": "rel"}) == home / ".local/state/sandgate"
    assert userconfig.state_dir({}) == home / ".local/state/sandgate"


# ---- what an untrusted file keeps ---------------------------------------------------------------


def test_narrow_keeps_only_what_forbids_more() -> None:
    rule = netpolicy.parse_network(
        {"allow": ["a.test"], "deny": ["d.test"], "ask": ["q.test"], "resolver": "192.0.2.1"}, "ws.yaml"
    )
    fs = fspolicy.FsPolicy(write=(".",), read_deny=("secrets",), protect=("notes.txt", "/etc/nologin", "~/.x"))
    env = EnvPolicy(drop=("P_*",), keep=("*",))
    net, fs2, env2, ignored = narrowing.narrow(rule, fs, env, has_include=True)
    assert net == netpolicy.NetworkPolicy(deny=rule.deny)
    assert fs2 == fspolicy.FsPolicy(read_deny=("secrets",), protect=("notes.txt",))
    assert env2 == EnvPolicy(drop=("P_*",))
    assert ignored == (
        "include",
        "network.allow",
        "network.ask",
        "network.resolver",
        "filesystem.write",
        "filesystem.protect outside the workspace",
        "env.keep",
    )
    # `write: []` (nothing writable) and `write: ["."]` (no private /tmp: the host's shows) are both ignored:
    # write is not monotonic, so no form of it is taken from an untrusted file.
    for write in ((), (".",), ("/tmp",)):
        assert narrowing.narrow(netpolicy.NetworkPolicy(), fspolicy.FsPolicy(write=write), EnvPolicy(), False)[3] == (
            "filesystem.write",
        )
    assert narrowing.narrow(netpolicy.NetworkPolicy(), fspolicy.FsPolicy(), EnvPolicy(), False)[3] == ()


@dataclasses.dataclass(frozen=True)
class _WiderFs(fspolicy.FsPolicy):
    """fsguard grows a way to widen (as `unprotect` did): an untrusted file must not get it."""

    open_everything: tuple[str, ...] = ()


def test_narrow_drops_fields_it_does_not_know() -> None:
    fs = _WiderFs(read_deny=("s",), open_everything=("/",))
    _, fs2, _, ignored = narrowing.narrow(netpolicy.NetworkPolicy(), fs, EnvPolicy(), False)
    assert type(fs2) is fspolicy.FsPolicy and fs2.read_deny == ("s",) and ignored == ("filesystem.open_everything",)


# ---- the command ------------------------------------------------------------------------------


def sandgate(*args: str, cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(state)},
    )


def test_cli_trust_list_and_revoke(tmp_path: Path) -> None:
    ws, state = tmp_path / "ws", tmp_path / "state"
    ws.mkdir()
    (ws / ".sandgate.yaml").write_text("version: 1\ninclude: [pypi, ./more.yaml]\nnetwork:\n  allow: [a.test]\n")
    (ws / "more.yaml").write_text("version: 1\nnetwork:\n  allow: [more.test]\n")
    r = sandgate("trust", cwd=ws, state=state)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"sandgate: trusted {ws / '.sandgate.yaml'} (sha256 ")
    assert lines[1].startswith(f"sandgate: trusted {ws / 'more.yaml'} (sha256 ") and "any change" in lines[1]
    (ws / "more.yaml").write_text("version: 1\nnetwork:\n  allow: [evil.test]\n")
    listed = sandgate("trust", "--list", cwd=ws, state=state).stdout.splitlines()
    assert [x.split()[:2] for x in listed] == [
        ["trusted", str(ws / ".sandgate.yaml")],
        ["changed", str(ws / "more.yaml")],
    ]
    r = sandgate("trust", "--revoke", ".sandgate.yaml", cwd=ws, state=state)
    assert r.returncode == 0 and r.stderr.strip() == f"sandgate: no longer trusted: {ws / '.sandgate.yaml'}"
    assert [x.split()[1] for x in sandgate("trust", "--list", cwd=ws, state=state).stdout.splitlines()] == [
        str(ws / "more.yaml")
    ]


def test_cli_trust_refuses_what_it_cannot_stand_behind(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".sandgate.yaml").write_text('version: 1\nnetwork:\n  allow: ["*"]\n')
    for state, fragment in (
        (tmp_path / "state", ".sandgate.yaml:3: '*' would match every host"),
        (ws / "state", f"is inside {ws}, where a sandboxed command may write"),
    ):
        r = sandgate("trust", cwd=ws, state=state)
        assert r.returncode == 125 and len(r.stderr.splitlines()) == 1 and fragment in r.stderr, r.stderr
    os.mkfifo(ws / "fifo.yaml")
    r = sandgate("trust", "fifo.yaml", cwd=ws, state=tmp_path / "state")
    assert (
        r.returncode == 125
        and r.stderr.strip() == "sandgate: error: fifo.yaml: not a regular file (a FIFO); a policy is a YAML file"
    )
    assert not (tmp_path / "state" / "sandgate" / "trusted.json").exists()


def test_build_policy_with_a_store_that_cannot_be_read_runs_narrowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    Path(".sandgate.yaml").write_text("version: 1\nnetwork:\n  allow: [a.test]\n")
    store = trust.Store(tmp_path / "state")
    store.dir.mkdir()
    store.file.write_text("not json")
    store.file.chmod(0o600)
    pol = build_policy([], [], [], workspace=Path(".sandgate.yaml"), store=store)
    assert not pol.network.allow and pol.narrowed is not None and "damaged" in pol.narrowed.notice()
