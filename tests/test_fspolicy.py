"""The `filesystem:` and `env:` sections: errors name FILE:LINE, defaults cannot be lost, env filtering."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsguard import policy as fp
from launcher.policy import PolicyFileError, build_policy

BAD = [
    ("version: 1\nfilesystem: [a]\n", 2, "'filesystem' must be a mapping"),
    ("version: 1\nfilesystem:\n  writable: [.]\n", 3, "unknown key 'filesystem.writable'"),
    ("version: 1\nfilesystem:\n  write: .\n", 3, "'filesystem.write' must be a list"),
    ("version: 1\nfilesystem:\n  write:\n    - .\n    - 7\n", 5, "entries must be non-empty strings"),
    ("version: 1\nfilesystem:\n  write: [\"/\"]\n", 3, "is the whole filesystem"),
    ("version: 1\nfilesystem:\n  read_deny: [\"~bob/.ssh\"]\n", 3, "only '~'"),
    ("version: 1\nfilesystem:\n  protect: [\"../x\"]\n", 3, "'..' is not allowed"),
    ("version: 1\nenv: {dorp: []}\n", 2, "unknown key 'env.dorp'"),
    ("version: 1\nenv:\n  keep: \"A\"\n", 3, "'env.keep' must be a list"),
]


@pytest.mark.parametrize("text,line,fragment", BAD, ids=[b[2][:30] for b in BAD])
def test_bad_sections_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(PolicyFileError) as e:
        build_policy([p], [], [])
    assert str(e.value).startswith(f"{p}:{line}: ") and fragment in str(e.value), str(e.value)


def test_sections_merge_across_files_and_defaults_stay(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("version: 1\nfilesystem:\n  write: [., build]\n  protect: [deploy.key]\nenv:\n  keep: [CI_TOKEN]\n")
    b = tmp_path / "b.yaml"
    b.write_text("version: 1\ninclude: [./a.yaml]\nfilesystem:\n  read_deny: [~/.pypirc]\nenv:\n  drop: [NPM_*]\n")
    pol = build_policy([b], [], [])
    eff = fp.effective(pol.filesystem, cwd="/ws", home="/home/u", extra_write=("/data",))
    assert eff.write == ("/ws", "/ws/build", "/data") and not eff.private_tmp  # given write replaces the default
    assert "/home/u/.ssh" in eff.read_deny and "/home/u/.pypirc" in eff.read_deny
    protect = dict(eff.protect)
    assert protect["/ws/.git/hooks"] is True and protect["/ws/.git/config"] is False
    assert "/ws/deploy.key" in protect and "/data/.git/hooks" in protect and "/ws/build/.sandgate" in protect
    env, dropped = fp.filter_env({"CI_TOKEN": "1", "NPM_AUTH": "2", "GH_TOKEN": "3", "PATH": "/bin"}, pol.env)
    assert env == {"CI_TOKEN": "1", "PATH": "/bin"} and dropped == ["GH_TOKEN", "NPM_AUTH"]


def test_default_write_is_workspace_and_private_tmp() -> None:
    eff = fp.effective(fp.FsPolicy(), cwd="/ws", home="/h")
    assert eff.write == ("/ws", "/tmp") and eff.private_tmp
    assert all(not p.startswith("/tmp/") for p, _ in eff.protect)  # the private /tmp needs no protection


@given(st.dictionaries(st.from_regex(r"[A-Z_]{1,12}", fullmatch=True), st.just("v"), max_size=20))
def test_filter_env_partitions_and_never_keeps_a_default_secret(env: dict[str, str]) -> None:
    kept, dropped = fp.filter_env(env, fp.EnvPolicy())
    assert set(kept) | set(dropped) == set(env) and not set(kept) & set(dropped)
    for name in kept:
        assert not name.endswith("_TOKEN") and "_SECRET" not in name and not name.startswith("AWS_")


def test_missing_landlock_warns_or_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from launcher import run
    from netguard.audit import AuditLog, read_records
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run.landlock, "abi_version", lambda: 0)
    log = AuditLog(tmp_path / "a.jsonl")
    opts = run.RunOptions(cmd=["true"], audit_path=tmp_path / "a.jsonl", user=None)
    conf = run._confinement(opts, log, tmp_path / "rt")
    assert conf.landlock is None
    rec = read_records(tmp_path / "a.jsonl")[0]
    assert rec["event"] == "policy" and rec["landlock_abi"] == 0 and "NOT restricted" in rec["warnings"][0]
    opts.require_landlock = True
    with pytest.raises(run.RunError, match="--require-landlock"):
        run._confinement(opts, log, tmp_path / "rt")


def test_mount_plan_placeholders_pins_and_symlink_refusal(tmp_path: Path) -> None:
    from fsguard import mounts
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("machine x")
    eff = fp.effective(fp.FsPolicy(protect=("sub/deep/key",)), cwd=str(ws), home=str(home))
    p = mounts.plan(eff)
    assert f"{ws}/.git/hooks" in p.protect and f"{ws}/.git/config" in p.protect
    assert (f"{ws}/.sandgate.yaml", False) in p.placeholders and (f"{ws}/sub", True) in p.placeholders
    assert p.pins[0] == str(ws) and f"{ws}/.git" in p.pins  # ancestors pinned, shallowest first
    # home lies under the host's /tmp here, which the sandbox's private /tmp already leaves out:
    # nothing to hide (and nothing to mount over). A home elsewhere is hidden as usual.
    assert not p.hide_dirs and f"{home}/.netrc" not in p.hide_files
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="sandgate-test-") as other:
        (Path(other) / ".ssh").mkdir()
        (Path(other) / ".netrc").write_text("machine x")
        p2 = mounts.plan(fp.effective(fp.FsPolicy(), cwd=str(ws), home=other))
        assert f"{other}/.ssh" in p2.hide_dirs and f"{other}/.netrc" in p2.hide_files
    (ws / "sub").symlink_to(tmp_path)
    with pytest.raises(mounts.MountError, match="passes through the symlink"):
        mounts.plan(eff)
    (ws / "sub").unlink()
    with pytest.raises(mounts.MountError, match="does not exist"):
        mounts.plan(fp.effective(fp.FsPolicy(write=("nope",)), cwd=str(ws), home=str(home)))


def test_placeholders_are_removed_only_while_empty(tmp_path: Path) -> None:
    from fsguard import mounts
    p = mounts.MountPlan(False, (), (), (), ((str(tmp_path / "d"), True), (str(tmp_path / "f"), False)), (), (), ())
    made = mounts.create_placeholders(p)
    assert made == [str(tmp_path / "d"), str(tmp_path / "f")]
    (tmp_path / "d").chmod(0o755)
    (tmp_path / "d" / "kept").write_text("user data")
    mounts.remove_placeholders(made)
    assert (tmp_path / "d" / "kept").exists() and not (tmp_path / "f").exists()
