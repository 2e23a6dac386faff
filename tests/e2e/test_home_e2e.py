"""The sandbox's home (issue 11): writes under ~ succeed, persist for the next sandboxed run, and
never change the real home; secrets stay hidden; a workspace inside ~ is written for real.

Run as a throwaway unprivileged user whose home is outside /tmp (a home under /tmp is replaced by
an empty one instead: tests/e2e/test_audit_home_e2e.py), inside a disposable World.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace

import pytest

from ..support.rootless import UnprivilegedUser
from ..support.runner import SANDGATE, Sandgate, env, write_policy
from ..support.trees import tree_hash
from ..support.world import World


@pytest.fixture
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser(base_dir="/var/tmp") as u:
        yield u


def test_writes_under_home_stay_in_the_sandbox_and_are_there_next_time(
    world: World, sandgate: Sandgate, user: UnprivilegedUser
) -> None:
    home = user.home
    assert not str(home).startswith("/tmp/")
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_test").write_text("SECRET-KEY-MARKER\n")
    (home / ".bashrc").write_text("# the user's own\n")
    proj = home / "proj"
    proj.mkdir()
    for p in (home / ".ssh", home / ".ssh" / "id_test", home / ".bashrc", proj):
        os.chown(p, user.uid, user.gid)
    world.tmp.chmod(0o755)
    pol = write_policy(world, "version: 1\nnetwork:\n  allow: [registry.test]\n", "home")
    pol.chmod(0o644)
    before = tree_hash(home)
    runner = user.runner(world)
    as_user = replace(
        sandgate,
        where=runner,
        policy=pol,
        audit=proj / "a.jsonl",
        quiet=True,
        env={**env(), "HOME": str(home)},
        cwd=proj,
        view=False,  # this test always ran `sandgate run` without VIEW
    )

    def run(script: str) -> tuple[int, str, str]:
        r = as_user.run(cmd=["sh", "-c", script])
        return r.returncode, r.stdout, r.stderr

    code, out, err = run(
        "mkdir -p ~/.npm/_cacache && echo tarball > ~/.npm/_cacache/is-number "
        "&& echo 'alias ls=evil' >> ~/.bashrc && echo built > built.txt "
        "&& cat ~/.ssh/id_test 2>&1 | grep -c SECRET-KEY-MARKER"
    )
    assert code == 1 and out.split() == ["0"], (out, err)  # writes worked; the key stayed hidden (grep -c: 0)
    assert (proj / "built.txt").read_text() == "built\n"  # the workspace inside ~ is real
    (proj / "built.txt").unlink()
    (proj / "a.jsonl").unlink()
    assert tree_hash(home) == before  # the real home is byte for byte as it was
    code, out, _ = run("cat ~/.npm/_cacache/is-number; tail -1 ~/.bashrc")
    assert out.split("\n")[:2] == ["tarball", "alias ls=evil"]  # the next sandboxed run: warm (and, by design,
    # sees what the last one wrote under ~)
    r = runner.run([*SANDGATE, "cache", "clear"], cwd=proj, env={**env(), "HOME": str(home)})
    assert r.returncode == 0 and "removed" in r.stderr, r.stderr
    code, out, _ = run("cat ~/.npm/_cacache/is-number 2>/dev/null || echo cold; tail -1 ~/.bashrc")
    assert out.split("\n")[:2] == ["cold", "# the user's own"]


def test_directories_of_the_real_home_can_be_removed_and_renamed_inside(
    world: World, sandgate: Sandgate, user: UnprivilegedUser
) -> None:
    """Tools prune and replace their caches (`npm cache clean`, pip's cache rotation): removing or
    renaming a directory that exists in the real home must work inside (overlayfs needs `userxattr`
    in a user namespace, else EIO/EXDEV), and the real home must stay as it was."""
    home = user.home
    (home / ".cache" / "tool" / "sub").mkdir(parents=True)
    (home / ".cache" / "tool" / "sub" / "entry").write_text("cached\n")
    (home / ".m2").mkdir()
    proj = home / "proj"
    proj.mkdir()
    for p in (
        home / ".cache",
        home / ".cache/tool",
        home / ".cache/tool/sub",
        home / ".cache/tool/sub/entry",
        home / ".m2",
        proj,
    ):
        os.chown(p, user.uid, user.gid)
    world.tmp.chmod(0o755)
    before = tree_hash(home)
    as_user = replace(
        sandgate,
        where=user.runner(world),
        audit=world.tmp / "rm.jsonl",
        quiet=True,
        env={**env(), "HOME": str(home)},
        cwd=proj,
        view=False,
    )
    (world.tmp / "rm.jsonl").touch()
    os.chown(world.tmp / "rm.jsonl", user.uid, user.gid)
    r = as_user.run(cmd=["sh", "-c", "rm -rf ~/.cache/tool && mv ~/.m2 ~/.m2-old && mkdir ~/.m2 && echo ok"])
    assert r.returncode == 0 and r.stdout.split() == ["ok"], (r.stdout, r.stderr)
    r = as_user.run(cmd=["sh", "-c", "test -e ~/.cache/tool && echo back || echo gone; ls -d ~/.m2-old"])
    assert r.stdout.split() == ["gone", f"{home}/.m2-old"], (r.stdout, r.stderr)  # the next run sees the same
    assert tree_hash(home) == before  # the real home still has both
