"""The `filesystem:` and `env:` sections: errors name FILE:LINE, defaults cannot be lost, env filtering
(its matcher in detail: tests/unit/test_env.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsguard import env as fe
from fsguard import policy as fp
from launcher.config.errors import PolicyFileError
from launcher.config.load import build_policy

BAD = [
    ("version: 1\nfilesystem: [a]\n", 2, "'filesystem' must be a mapping"),
    ("version: 1\nfilesystem:\n  writable: [.]\n", 3, "unknown key 'filesystem.writable'"),
    ("version: 1\nfilesystem:\n  write: .\n", 3, "'filesystem.write' must be a list"),
    ("version: 1\nfilesystem:\n  write:\n    - .\n    - 7\n", 5, "entries must be non-empty strings"),
    ('version: 1\nfilesystem:\n  write: ["/"]\n', 3, "is the whole filesystem"),
    ('version: 1\nfilesystem:\n  read_deny: ["~bob/.ssh"]\n', 3, "only '~'"),
    ('version: 1\nfilesystem:\n  protect: ["../x"]\n', 3, "'..' is not allowed"),
    ("version: 1\nfilesystem:\n  unprotect: [.git/hooks/]\n", 3, "'.git/hooks/' cannot be unprotected"),
    ("version: 1\nfilesystem:\n  unprotect:\n    - .vscode/\n    - ./.GIT\n", 5, "'./.GIT' cannot be unprotected"),
    ("version: 1\nfilesystem:\n  unprotect:\n    - .sandgate/\n", 4, "'.sandgate/' cannot be unprotected"),
    ("version: 1\nfilesystem:\n  unprotect: [src/]\n", 3, "'src/' is not a default protection"),
    ("version: 1\nfilesystem:\n  unprotect: [/ws/.vscode]\n", 3, "unprotect takes a default protection's"),
    ("version: 1\nfilesystem:\n  unprotect: .vscode/\n", 3, "'filesystem.unprotect' must be a list"),
    ("version: 1\nenv: {dorp: []}\n", 2, "unknown key 'env.dorp'"),
    ('version: 1\nenv:\n  keep: "A"\n', 3, "'env.keep' must be a list"),
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
    env, dropped = fe.filter_env({"CI_TOKEN": "1", "NPM_AUTH": "2", "GH_TOKEN": "3", "PATH": "/bin"}, pol.env)
    assert env == {"CI_TOKEN": "1", "PATH": "/bin"} and dropped == ["GH_TOKEN", "NPM_AUTH"]


def test_default_write_is_workspace_and_private_tmp() -> None:
    eff = fp.effective(fp.FsPolicy(), cwd="/ws", home="/h")
    assert eff.write == ("/ws", "/tmp") and eff.private_tmp
    assert all(not p.startswith("/tmp/") for p, _ in eff.protect)  # the private /tmp needs no protection


@given(st.dictionaries(st.from_regex(r"[A-Za-z_]{1,12}", fullmatch=True), st.just("v"), max_size=20))
def test_filter_env_partitions_and_never_keeps_a_default_secret(env: dict[str, str]) -> None:
    kept, dropped = fe.filter_env(env, fe.EnvPolicy())
    assert set(kept) | set(dropped) == set(env) and not set(kept) & set(dropped)
    for name in map(str.upper, kept):  # names match in any letter case since issue 10
        assert not name.endswith("_TOKEN") and "SECRET" not in name and "PASSWORD" not in name
        assert not name.startswith("AWS_") or name in fe.DEFAULT_ENV_KEEP  # AWS_REGION, AWS_CA_BUNDLE, ...


def test_missing_landlock_warns_or_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fsguard import landlock
    from launcher.errors import RunError
    from launcher.run import confinement
    from launcher.run.options import RunOptions
    from netguard.audit import AuditLog, read_records

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)  # the module confinement.py calls
    log = AuditLog(tmp_path / "a.jsonl")
    opts = RunOptions(cmd=["true"], audit_path=tmp_path / "a.jsonl", user=None)
    conf = confinement.plan(opts, log, tmp_path / "rt")
    assert conf.landlock is None
    rec = read_records(tmp_path / "a.jsonl")[0]
    assert rec["event"] == "policy" and rec["landlock_abi"] == 0 and "NOT restricted" in rec["warnings"][0]
    opts.require_landlock = True
    with pytest.raises(RunError, match="--require-landlock"):
        confinement.plan(opts, log, tmp_path / "rt")


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
    assert (f"{ws}/.sandgate.yaml", True) in p.placeholders and (
        f"{ws}/sub",
        True,
    ) in p.placeholders  # a directory: git, npm pack and a concurrent run do not take it for a file
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
    from fsguard import mounts, placeholders

    p = mounts.MountPlan(False, (), (), (), ((str(tmp_path / "d"), True), (str(tmp_path / "f"), False)), (), (), ())
    made = placeholders.create_placeholders(p)
    assert made == [str(tmp_path / "d"), str(tmp_path / "f")]
    (tmp_path / "d").chmod(0o755)
    (tmp_path / "d" / "kept").write_text("user data")
    placeholders.remove_placeholders(made)
    assert (tmp_path / "d" / "kept").exists() and not (tmp_path / "f").exists()


# ---- issue 10: git's indirections and tool configs ------------------------------------------------

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@x",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}


def _sh(cwd: Path, script: str) -> None:
    import subprocess

    subprocess.run(["sh", "-ec", script], cwd=cwd, check=True, capture_output=True, env=GIT_ENV)


def test_unprotect_opens_only_the_named_tool_default(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("version: 1\nfilesystem:\n  unprotect: [.vscode/, ./.envrc]\n")
    b = tmp_path / "b.yaml"
    b.write_text("version: 1\nfilesystem:\n  write: [., out]\n")
    pol = build_policy([a, b], [], [])
    assert pol.filesystem.unprotect == (".vscode", ".envrc")
    protect = dict(fp.effective(pol.filesystem, cwd="/ws", home="/h").protect)
    assert "/ws/.vscode" not in protect and "/ws/out/.vscode" not in protect and "/ws/.envrc" not in protect
    assert protect["/ws/.claude"] is True and protect["/ws/.mcp.json"] is True  # missing file: directory placeholder
    assert protect["/ws/.git/commondir"] is False and protect["/ws/out/.git/modules"] is True
    # An explicit `protect:` entry is never undone by `unprotect:`.
    again = fp.effective(fp.FsPolicy(protect=(".vscode/",), unprotect=(".vscode",)), cwd="/ws", home="/h")
    assert "/ws/.vscode" in dict(again.protect)


def _layout(base: Path) -> Path:
    """A workspace with a submodule, a linked worktree, a nested and a bare repository, and a config
    naming a hooks directory, an included file and a script inside the workspace."""
    _sh(
        base,
        """
        git init -q lib && git -C lib commit -q --allow-empty -m l
        git init -q ws && cd ws && git commit -q --allow-empty -m i
        git -c protocol.file.allow=always submodule add -q ../lib sub && git commit -qm sub
        git worktree add -q wt && git worktree add -q ../wt-out
        git init -q nested && git init -q --bare srv.git
        git config core.hooksPath .githooks && git config include.path ../../shared.gitconfig
        git config core.fsmonitor ./tools/fsmon.sh
        printf '[core]\\n\\tpager = ./tools/pager.sh\\n' > ../shared.gitconfig
        """,
    )
    return base / "ws"


def test_git_plan_protects_every_repository_and_reopens_submodule_and_worktree_gitdirs(tmp_path: Path) -> None:
    from fsguard import mounts

    ws = _layout(tmp_path)
    p = mounts.plan(fp.effective(fp.FsPolicy(), cwd=str(ws), home=str(tmp_path / "h")))
    g = f"{ws}/.git"
    ph = dict(p.placeholders)
    for d in (g, f"{g}/modules/sub", f"{ws}/nested/.git", f"{ws}/srv.git"):  # every git directory
        assert f"{d}/config" in p.protect and f"{d}/hooks" in p.protect and f"{d}/info" in p.protect, d
        assert ph[f"{d}/commondir"] is False and ph[f"{d}/config.worktree"] is False, d
        assert f"{d}/objects/info/alternates" in ph and f"{d}/objects" in p.pins, d
        assert f"{d}/description" in p.protect, d  # not everyday state: read-only although harmless
        assert f"{d}/refs" not in p.protect and f"{d}/HEAD" not in p.protect and f"{d}/objects" not in p.protect
        assert dict(p.filled)[f"{d}/commondir"] == ".\n"  # git dies on an empty commondir
    assert f"{g}/modules" in p.protect and f"{g}/worktrees" in p.protect  # no new submodule/worktree gitdir
    assert ph[f"{ws}/nested/.git/modules"] is True and ph[f"{ws}/nested/.git/worktrees"] is True
    # Reopened whether a .git file inside the workspace names them (wt) or not (wt-out).
    assert p.reopen == (f"{g}/modules/sub", f"{g}/worktrees/wt", f"{g}/worktrees/wt-out")
    wt = f"{g}/worktrees/wt"
    assert f"{wt}/commondir" in p.protect and f"{wt}/gitdir" in p.protect and ph[f"{wt}/config.worktree"] is False
    assert f"{wt}/hooks" not in ph and f"{wt}/commondir" not in ph  # taken from the common directory
    assert f"{ws}/sub/.git" in p.protect and f"{ws}/wt/.git" in p.protect  # the gitdir pointers themselves
    # What the config names inside the workspace: hooks directory, included file, programs.
    assert ph[f"{ws}/.githooks"] is True and f"{tmp_path}/shared.gitconfig" not in p.protect  # outside: Landlock
    assert ph[f"{ws}/tools"] is True  # ./tools/fsmon.sh: its first missing component
    assert not any(x.startswith(f"{ws}/.git/") and x.endswith(".git") for x, _ in p.placeholders)


def test_config_paths_follow_includes_inside_the_workspace(tmp_path: Path) -> None:
    from fsguard import gitguard

    ws = _layout(tmp_path)
    (ws / "local.gitconfig").write_text('[alias]\n\tx = "!./tools/alias.sh --flag"\n[core]\n\teditor = vim\n')
    _sh(ws, "git config --add include.path ../local.gitconfig")
    entries = {e.name: e for e in __import__("os").scandir(ws / ".git")}
    found = dict(gitguard.config_paths(str(ws / ".git"), entries))
    assert found[f"{ws}/local.gitconfig"] is False and found[f"{ws}/tools/alias.sh"] is False
    assert found[f"{ws}/tools/pager.sh"] is False  # named by the included file outside the workspace
    assert found[f"{ws}/.githooks"] is True and not any(k.endswith("vim") for k in found)


def test_no_repository_means_no_git_placeholder(tmp_path: Path) -> None:
    from fsguard import mounts

    ws = tmp_path / "fresh"
    ws.mkdir()
    p = mounts.plan(fp.effective(fp.FsPolicy(), cwd=str(ws), home=str(tmp_path / "h")))
    assert not any("/.git" in x for x, _ in p.placeholders) and not any("/.git" in x for x in p.protect)
    assert (f"{ws}/.vscode", True) in p.placeholders and (f"{ws}/.envrc", True) in p.placeholders


def test_git_symlinks_are_refused_and_the_hooks_weakening_still_opens_hooks(tmp_path: Path) -> None:
    import dataclasses

    from fsguard import mounts

    ws = _layout(tmp_path)
    eff = fp.effective(fp.FsPolicy(), cwd=str(ws), home=str(tmp_path / "h"))
    weak = dataclasses.replace(eff, protect=tuple(x for x in eff.protect if not x[0].endswith("/.git/hooks")))
    p = mounts.plan(weak)  # what `SANDGATE_WEAKEN=git-hooks` (the verify self-test) does
    assert f"{ws}/.git/hooks" not in p.protect and f"{ws}/.git/config" in p.protect
    assert f"{ws}/nested/.git/hooks" not in p.protect  # the workspace root's `.git/<name>` list applies below it
    (ws / "linked").mkdir()
    (ws / "linked/.git").symlink_to(ws / "nested/.git")
    with pytest.raises(mounts.MountError, match=r"make it a .git file"):
        mounts.plan(eff)
    (ws / "linked/.git").unlink()
    (ws / ".git/hooks").rename(ws / ".git/hooks-real")
    (ws / ".git/hooks").symlink_to("hooks-real")
    with pytest.raises(mounts.MountError, match="passes through the symlink"):
        mounts.plan(eff)


def test_commondir_placeholder_holds_dot_and_is_removed_afterwards(tmp_path: Path) -> None:
    from fsguard import mounts, placeholders

    cd, other = tmp_path / "commondir", tmp_path / "other"
    p = mounts.MountPlan(False, (), (), (), ((str(cd), False),), (), (), (), filled=((str(cd), ".\n"),))
    made = placeholders.create_placeholders(p)
    assert cd.read_text() == ".\n" and made == [str(cd)]
    other.write_text("../evil\n")  # a file we did not fill is never removed, whatever its name
    placeholders.remove_placeholders([*made, str(other)])
    assert not cd.exists() and other.exists()


def test_protect_mounts_go_shallowest_first_and_reopen_from_a_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsguard import mounts

    g = tmp_path / ".git"
    (g / "modules/sub/objects").mkdir(parents=True)
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(
        mounts, "mount", lambda src, tgt, *a: calls.append(("fd" if "/proc/self/fd/" in src else "pin", tgt))
    )
    monkeypatch.setattr(mounts, "bind_readonly", lambda src, tgt: calls.append(("ro", tgt)))
    p = mounts.MountPlan(
        False,
        (),
        (str(tmp_path), str(g), str(g / "modules"), str(g / "modules/sub")),
        (str(g / "modules"), str(g / "modules/sub/config")),
        ((str(g / "modules/sub/hooks"), True),),
        (),
        (),
        (),
        reopen=(str(g / "modules/sub"),),
    )
    mounts._protect_mounts(p)
    assert calls == [
        ("pin", str(tmp_path)),
        ("pin", str(g)),
        ("pin", str(g / "modules")),
        ("ro", str(g / "modules")),
        ("pin", str(g / "modules/sub")),
        ("fd", str(g / "modules/sub")),
        ("ro", str(g / "modules/sub/config")),
        ("ro", str(g / "modules/sub/hooks")),
    ]
