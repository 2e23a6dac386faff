"""Git's indirections (issue 10), end to end: real `sandgate run`, real git, real kernel, in a World.

Every attack plants something that would run a program on the user's next `git status` or
`git commit` on the host: a planted core.fsmonitor, a pre-commit hook or a clean filter that
touches a marker file. Each one must fail inside the sandbox, leave the host's files as they
were, and the real git on the host afterwards must not touch the marker. Where the attack is
not self-evidently real, a control runs the same script without sandgate on a disposable copy
and shows that there the marker does appear, so no test passes because the attack was
impossible anyway. The permitted half shows everyday git still works inside the sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..support.runner import Sandgate, env
from ..support.world import World, new_world

ID = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@sandgate.test",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@sandgate.test",
    "GIT_CONFIG_NOSYSTEM": "1",
}


@dataclass
class Git:
    world: World
    base: Path
    ws: Path  # the workspace: a repository with a submodule (sub), a nested repository and a linked worktree
    home: Path
    policy: Path
    marker: Path  # every planted program touches this; it must never appear

    def run(self, script: str, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        audit = self.base / f"audit-{time.monotonic_ns()}.jsonl"
        sg = Sandgate(self.world, policy=self.policy, quiet=True, cwd=self.ws, timeout=120)
        return sg.run(*extra, audit=audit, cmd=["sh", "-c", script], cwd=cwd, env=self.env())

    def env(self) -> dict[str, str]:
        return {**env(), **ID, "HOME": str(self.home), "M": str(self.marker)}

    def host(self, repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The real git on the host, after the run: what the user would type next."""
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=check, env=self.env(), timeout=60
        )

    def bare(self, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """The same script without sandgate (the control)."""
        return subprocess.run(
            ["sh", "-c", script], check=False, cwd=cwd, capture_output=True, text=True, env=self.env(), timeout=60
        )

    def host_git_runs_nothing(self, *repos: Path) -> None:
        for repo in repos or (self.ws, self.ws / "sub", self.ws / "nested", self.base / "wt"):
            self.host(repo, "status")
            self.host(repo, "commit", "-q", "--allow-empty", "-m", "host commit")
        assert not self.marker.exists(), "a program planted inside the sandbox ran on the host"

    def copy(self) -> Path:
        """A disposable copy of the workspace for a control (submodule and worktree links stay relative)."""
        dst = Path(tempfile.mkdtemp(prefix="ctl-", dir=self.base)) / "ws"
        shutil.copytree(self.ws, dst, symlinks=True)
        return dst


def _sh(cwd: Path, script: str) -> None:
    subprocess.run(["sh", "-ec", script], cwd=cwd, check=True, capture_output=True, env={**env(), **ID})


@pytest.fixture(scope="module")
def g() -> Iterator[Git]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-git-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    try:
        with new_world() as w:
            home = base / "home"
            home.mkdir()
            _sh(
                base,
                textwrap.dedent("""\
                git init -q lib && cd lib && echo lib > f && git add f && git commit -qm lib && cd ..
                git init -q ws && cd ws && echo hi > README && git add README && git commit -qm init
                git -c protocol.file.allow=always submodule add -q ../lib sub && git commit -qm 'add sub'
                git worktree add -q ../wt
                git init -q nested && cd nested && git commit -q --allow-empty -m nested && cd ..
                echo nested/ >> .git/info/exclude
                # Honoured if planted: a per-worktree config (config.worktree) and a clean filter
                # that .git/info/attributes could switch on for every file.
                git config extensions.worktreeConfig true
                git config filter.probe.clean 'sh -c "touch \\"$M\\"; cat"'
                """),
            )
            policy = base / "policy.yaml"
            policy.write_text("version: 1\nnetwork:\n  allow: [pypi.test]\n")
            yield Git(w, base, base / "ws", home, policy, base / "marker")
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))  # the fake home's sandbox layer too
        shutil.rmtree(base, ignore_errors=True)


def lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    return r.stdout.strip().splitlines()


#: Prints "<name>=refused" or "<name>=WRITTEN" for each attempt.
TRY = 't() { name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "$name=WRITTEN"; else echo "$name=refused"; fi; }\n'
PLANT_EVIL = textwrap.dedent("""\
    cp -r .git evil && rm -f evil/commondir
    printf '[core]\\n\\tfsmonitor = touch %s\\n' "$M" >> evil/config
    printf '#!/bin/sh\\ntouch %s\\n' "$M" > evil/hooks/pre-commit && chmod +x evil/hooks/pre-commit
    """)


# ---- what must fail ----------------------------------------------------------------------------


def test_commondir_cannot_redirect_config_and_hooks(g: Git) -> None:
    script = PLANT_EVIL + TRY + "t commondir sh -c 'echo ../evil > .git/commondir'\n"
    r = g.run(script)
    assert lines(r) == ["commondir=refused"], r.stdout + r.stderr
    assert not (g.ws / ".git/commondir").exists()  # the run's placeholder is gone, nothing planted
    g.host_git_runs_nothing()
    shutil.rmtree(g.ws / "evil")
    # Control: on a copy, without sandgate, the same script makes the user's `git status` run it.
    ctl = g.copy()
    assert lines(g.bare(script, ctl)) == ["commondir=WRITTEN"]
    g.host(ctl, "status")
    assert g.marker.exists()
    g.marker.unlink()
    shutil.rmtree(ctl.parent)


def test_git_config_and_hooks_stay_read_only_in_every_repository(g: Git) -> None:
    fsmon = "[core]\\n\\tfsmonitor = touch $M\\n"
    hook = "#!/bin/sh\\ntouch $M\\n"
    r = g.run(
        TRY
        + textwrap.dedent(f"""\
        t config sh -c 'printf "{fsmon}" >> .git/config'
        t git-config git config core.fsmonitor "touch $M"
        t hook sh -c 'printf "{hook}" > .git/hooks/pre-commit'
        t nested-config sh -c 'printf "{fsmon}" >> nested/.git/config'
        t nested-hook sh -c 'printf "{hook}" > nested/.git/hooks/pre-commit'
        t sub-config sh -c 'printf "{fsmon}" >> .git/modules/sub/config'
        t sub-hook sh -c 'printf "{hook}" > .git/modules/sub/hooks/pre-commit'
        t sub-gitfile sh -c 'echo "gitdir: ../evil" > sub/.git'
        t sub-git-config git -C sub config core.fsmonitor "touch $M"
        """)
    )
    assert lines(r) == [
        f"{n}=refused"
        for n in (
            "config",
            "git-config",
            "hook",
            "nested-config",
            "nested-hook",
            "sub-config",
            "sub-hook",
            "sub-gitfile",
            "sub-git-config",
        )
    ], r.stderr
    for cfg in (g.ws / ".git/config", g.ws / "nested/.git/config", g.ws / ".git/modules/sub/config"):
        assert "fsmonitor" not in cfg.read_text(), cfg
    assert (g.ws / "sub/.git").read_text().strip() == "gitdir: ../.git/modules/sub"
    for hooks in (g.ws / ".git/hooks", g.ws / "nested/.git/hooks", g.ws / ".git/modules/sub/hooks"):
        assert not (hooks / "pre-commit").exists(), hooks
    g.host_git_runs_nothing()


def test_new_submodule_and_worktree_git_directories_cannot_be_created(g: Git) -> None:
    hook = "#!/bin/sh\\ntouch $M\\n"
    r = g.run(
        TRY
        + textwrap.dedent(f"""\
        t modules-x sh -c 'mkdir -p .git/modules/x/hooks && printf "{hook}" > .git/modules/x/hooks/pre-commit'
        t nested-modules sh -c 'mkdir -p nested/.git/modules/x/hooks'
        t worktrees-w sh -c 'mkdir -p .git/worktrees/w && echo ../.. > .git/worktrees/w/commondir'
        t nested-worktrees sh -c 'mkdir -p nested/.git/worktrees/w'
        t wt-commondir sh -c 'echo ../../../evil > .git/worktrees/wt/commondir'
        t wt-config sh -c 'printf "[core]\\n\\tfsmonitor = touch $M\\n" > .git/worktrees/wt/config.worktree'
        t sub-commondir sh -c 'echo ../../../evil > .git/modules/sub/commondir'
        """)
    )
    assert lines(r) == [
        f"{n}=refused"
        for n in (
            "modules-x",
            "nested-modules",
            "worktrees-w",
            "nested-worktrees",
            "wt-commondir",
            "wt-config",
            "sub-commondir",
        )
    ], r.stderr
    assert sorted(p.name for p in (g.ws / ".git/modules").iterdir()) == ["sub"]
    assert sorted(p.name for p in (g.ws / ".git/worktrees").iterdir()) == ["wt"]
    assert not (g.ws / "nested/.git/modules").exists() and not (g.ws / "nested/.git/worktrees").exists()
    assert (g.ws / ".git/worktrees/wt/commondir").read_text() == "../..\n"
    assert not (g.ws / ".git/worktrees/wt/config.worktree").exists()
    assert not (g.ws / ".git/modules/sub/commondir").exists()
    g.host_git_runs_nothing()


def test_config_worktree_info_attributes_and_alternates_cannot_be_planted(g: Git) -> None:
    script = TRY + textwrap.dedent("""\
        echo data > planted.txt
        t config-worktree sh -c 'printf "[core]\\n\\tfsmonitor = touch $M\\n" > .git/config.worktree'
        t info-attributes sh -c 'echo "* filter=probe" > .git/info/attributes'
        t alternates sh -c 'echo /var/tmp > .git/objects/info/alternates'
        t http-alternates sh -c 'echo http://evil.test/ > .git/objects/info/http-alternates'
        """)
    r = g.run(script)
    assert lines(r) == [
        f"{n}=refused" for n in ("config-worktree", "info-attributes", "alternates", "http-alternates")
    ], r.stderr
    for p in ("config.worktree", "info/attributes", "objects/info/alternates", "objects/info/http-alternates"):
        assert not (g.ws / ".git" / p).exists(), p
    g.host(g.ws, "add", "planted.txt")  # the clean filter would run here
    g.host(g.ws, "rm", "-q", "--cached", "planted.txt")
    (g.ws / "planted.txt").unlink()
    g.host_git_runs_nothing()
    # Control: without sandgate, config.worktree's fsmonitor and the attributes' filter do run.
    for plant in ("config-worktree", "info-attributes"):
        ctl = g.copy()
        r = g.bare(script, ctl)
        assert f"{plant}=WRITTEN" in lines(r), r.stderr
        (ctl / ".git/config.worktree" if plant == "info-attributes" else ctl / ".git/info/attributes").unlink()
        g.host(ctl, "add", "planted.txt")
        g.host(ctl, "status")
        assert g.marker.exists(), plant
        g.marker.unlink()
        shutil.rmtree(ctl.parent)


def test_editor_and_agent_configs_are_read_only(g: Git) -> None:
    r = g.run(
        TRY
        + textwrap.dedent("""\
        t vscode sh -c 'mkdir -p .vscode && echo "{}" > .vscode/settings.json'
        t envrc sh -c 'echo "touch $M" > .envrc'
        t mcp sh -c 'echo "{\\"mcpServers\\": {}}" > .mcp.json'
        t claude sh -c 'mkdir -p .claude && echo "{}" > .claude/settings.json'
        t nested-vscode sh -c 'mkdir -p sub2/.vscode && rmdir sub2/.vscode sub2'
        """)
    )
    assert lines(r) == ["vscode=refused", "envrc=refused", "mcp=refused", "claude=refused", "nested-vscode=WRITTEN"], (
        r.stderr
    )
    for p in (".vscode", ".envrc", ".mcp.json", ".claude"):
        assert not (g.ws / p).exists(), p  # and the run's placeholders are gone


# ---- what must keep working --------------------------------------------------------------------


def test_everyday_git_works_in_the_workspace_repository(g: Git) -> None:
    r = g.run(
        textwrap.dedent(f"""\
        set -e
        echo a > a.txt && git add a.txt && git commit -qm 'sandbox: a'
        git branch feature && git checkout -qb topic
        echo b > b.txt && git add b.txt && git commit -qm 'sandbox: b'
        git checkout -q feature && echo c > c.txt && git add c.txt && git commit -qm 'sandbox: c'
        git merge -q --no-edit -m 'sandbox: merge' topic
        echo wip >> a.txt && git stash -q && git stash list | wc -l && git stash pop -q && git checkout -q -- a.txt
        git tag light && git tag -a -m 'sandbox tag' annotated
        git reset -q --hard HEAD~1
        git checkout -q topic && git rebase -q feature
        git checkout -q feature && git cherry-pick topic >/dev/null
        git fetch -q {g.base / "lib"} master && git rev-parse --verify -q FETCH_HEAD >/dev/null
        git gc -q 2>/dev/null  # prints "unable to update info/refs" (read-only info/), succeeds
        echo ok""")
    )
    assert r.returncode == 0 and lines(r)[-2:] == ["1", "ok"], r.stdout + r.stderr
    log = g.host(g.ws, "log", "--oneline", "--all").stdout
    assert "sandbox: a" in log and "sandbox: b" in log and "sandbox: merge" in log
    assert {"light", "annotated"} <= set(g.host(g.ws, "tag").stdout.split())
    assert g.host(g.ws, "fsck", "--no-progress").returncode == 0
    for p in ("commondir", "config.worktree", "objects/info/alternates"):  # placeholders removed
        assert not (g.ws / ".git" / p).exists(), p
    g.host(g.ws, "checkout", "-q", "master")
    g.host_git_runs_nothing()


def test_commits_in_the_superproject_and_inside_its_submodule(g: Git) -> None:
    r = g.run(
        textwrap.dedent("""\
        set -e
        cd sub && echo more >> f && git commit -qam 'sandbox: in sub' && git checkout -qb sub-topic && cd ..
        git add sub && git commit -qm 'sandbox: bump sub'
        git submodule status | cut -c1 | tr ' ' =
        cd nested && echo n > n.txt && git add n.txt && git commit -qm 'sandbox: nested' && cd ..
        git -C ../wt commit -q --allow-empty -m 'sandbox: in wt'  # its git directory is .git/worktrees/wt
        echo ok""")
    )
    assert r.returncode == 0 and lines(r) == ["=", "ok"], r.stdout + r.stderr
    assert "sandbox: in sub" in g.host(g.ws / "sub", "log", "--oneline").stdout
    assert "sandbox: bump sub" in g.host(g.ws, "log", "--oneline").stdout
    assert "sandbox: nested" in g.host(g.ws / "nested", "log", "--oneline").stdout
    assert "sandbox: in wt" in g.host(g.base / "wt", "log", "--oneline").stdout
    assert not (g.ws / ".git/modules/sub/commondir").exists()
    g.host_git_runs_nothing()


def test_git_init_and_first_commit_in_a_fresh_workspace(g: Git) -> None:
    fresh = g.base / "fresh"
    fresh.mkdir()
    r = g.run(
        "set -e; git init -q; echo x > f; git add f; git commit -qm first; git log --oneline | wc -l; "
        "git clone -q " + str(g.base / "lib") + " cloned; cd cloned; git commit -q --allow-empty -m c; echo ok",
        cwd=fresh,
    )
    assert r.returncode == 0 and lines(r) == ["1", "ok"], r.stdout + r.stderr
    assert "first" in g.host(fresh, "log", "--oneline").stdout
    assert (fresh / "cloned/.git").is_dir()


def test_unprotect_opens_one_tool_directory_and_nothing_else(g: Git) -> None:
    pol = g.base / "unprotect.yaml"
    pol.write_text('version: 1\nnetwork:\n  allow: [pypi.test]\nfilesystem:\n  unprotect: [".vscode/"]\n')
    r = g.run(
        TRY + "t vscode sh -c 'mkdir -p .vscode && echo {} > .vscode/settings.json'\n"
        "t claude sh -c 'mkdir -p .claude && echo {} > .claude/settings.json'\n",
        "--policy",
        str(pol),
    )
    assert lines(r) == ["vscode=WRITTEN", "claude=refused"], r.stderr
    assert (g.ws / ".vscode/settings.json").read_text() == "{}\n"
    shutil.rmtree(g.ws / ".vscode")
    bad = g.base / "bad.yaml"
    bad.write_text("version: 1\nfilesystem:\n  unprotect:\n    - .vscode/\n    - .git/hooks/\n")
    r = g.run("true", "--policy", str(bad))
    assert r.returncode != 0 and f"{bad}:5:" in r.stderr and "cannot be unprotected" in r.stderr, r.stderr


def test_placeholders_leave_no_trace_in_git_or_a_concurrent_run(g: Git) -> None:
    """A missing protected path is held by an empty directory: git does not list it (so `git add -A`
    cannot commit it), and a second run in the same workspace does not take it for its policy."""
    assert not (g.ws / ".sandgate.yaml").exists() and not (g.ws / ".mcp.json").exists()
    g.host(g.ws, "commit", "-q", "--allow-empty", "-m", "clean")
    # The placeholder still protects: the name can be neither filled nor freed for a planted file.
    plant = "echo x > .sandgate.yaml/p 2>/dev/null && echo filled; rmdir .sandgate.yaml 2>/dev/null && echo freed"
    r = g.run(f"{plant}; git status --porcelain --untracked-files=all; echo end")
    untracked = [line for line in r.stdout.splitlines() if line.startswith("??")]
    assert r.returncode == 0 and r.stdout.endswith("end\n") and untracked == [], (r.stdout, r.stderr)  # no placeholder
    assert "filled" not in r.stdout and "freed" not in r.stdout, r.stdout
    sg = Sandgate(g.world, cwd=g.ws, timeout=60)
    first = sg.popen(policy=g.policy, quiet=True, audit=g.base / "long.jsonl", cmd=["sleep", "4"], env=g.env())
    try:
        deadline = time.monotonic() + 20
        while not (g.ws / ".sandgate.yaml").is_dir() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (g.ws / ".sandgate.yaml").is_dir(), "positive control: the first run holds the placeholder"
        second = sg.run(audit=g.base / "second.jsonl", cmd=["true"], env=g.env())
        assert second.returncode == 0, second.stderr  # it found no policy there: the placeholder is not read as one
        assert "no policy given" in second.stderr
    finally:
        assert first.wait(60) == 0
    assert not (g.ws / ".sandgate.yaml").exists()
    assert "??" not in g.host(g.ws, "status", "--porcelain").stdout
