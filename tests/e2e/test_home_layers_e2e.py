"""The sandbox's home under concurrency and across workspaces (issue 23, items 2 and 3).

Each run has its own overlay upper and work directory (never one shared by two live mounts: the
kernel log must not say "in-use"); a workspace's finished runs are folded into its layer, so its
next run is warm even when runs overlapped; what a run in workspace A plants under ~ never shows
in workspace B; `--fresh-home` starts from the real home and drops its writes; `cache clear`
refuses in one line while a sandbox lives (or waits with --wait) and removes the read-only trees
tools leave, as the ordinary user, without a traceback.

All runs are a throwaway unprivileged user's (home under /var/tmp: a home under /tmp is replaced
by an empty one instead), inside a disposable World.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..support.rootless import UnprivilegedUser
from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import World, new_world

WRITERS = 30
FILES = 50


@dataclass
class Home:
    user: UnprivilegedUser
    world: World
    sandgate: Sandgate  # as the user, HOME = its home, quiet

    def ws(self, name: str) -> Path:
        d = self.user.home / "proj" / name  # a workspace inside ~: bound back, written for real
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d.parent, self.user.uid, self.user.gid)
        os.chown(d, self.user.uid, self.user.gid)
        return d

    def sh(self, ws: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.sandgate.run(*args, cmd=["sh", "-c", script], cwd=ws, audit=self.audit(ws))

    def audit(self, ws: Path) -> Path:
        return ws / f"a-{time.monotonic_ns()}.jsonl"  # inside the workspace: the user may create it

    def cache(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        r: subprocess.CompletedProcess[str] = self.sandgate.where.run(
            [*SANDGATE, "cache", "clear", *args], cwd=cwd, env=self.sandgate._env(None), timeout=60
        )
        return r

    def store(self) -> Path:
        return Path(f"/var/tmp/sandgate-{self.user.uid}/homes")


@pytest.fixture(scope="module")
def home(_sandgate_cleanup_stale_users: None) -> Iterator[Home]:
    """One user and world for the module (a user costs seconds to make and remove); every test
    uses its own workspaces."""
    with new_world() as world, UnprivilegedUser(base_dir="/var/tmp") as u:
        (u.home / ".bashrc").write_text("# the user's own\n")
        os.chown(u.home / ".bashrc", u.uid, u.gid)
        world.tmp.chmod(0o755)
        sg = Sandgate(u.runner(world), quiet=True, env={**env(), "HOME": str(u.home)}, view=False, timeout=120)
        try:
            yield Home(u, world, sg)
        finally:
            shutil.rmtree(f"/var/tmp/sandgate-{u.uid}", ignore_errors=True)  # the user's layers (its uid only)


def _kernel_log() -> list[str] | None:
    """The kernel log's lines, or None where it is not readable (dmesg_restrict)."""
    try:
        r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return r.stdout.splitlines() if r.returncode == 0 else None


WRITER = (
    'd=~/.cache/sgtest/$0; mkdir -p "$d" || exit 3; i=0; '
    'while [ $i -lt {n} ]; do echo "$0-$i" > "$d/f$i.tmp" && mv "$d/f$i.tmp" "$d/f$i" || exit 4; i=$((i+1)); done; '
    'echo "$(ls "$d" | wc -l) $(cat "$d"/f* | grep -c "^$0-")"'
).replace("{n}", str(FILES))


def test_concurrent_runs_write_rename_and_list_under_home_and_the_next_run_sees_all(home: Home) -> None:
    ws = home.ws("busy")
    before = _kernel_log()
    start = time.monotonic()
    procs = [
        home.sandgate.popen(
            cmd=["sh", "-c", WRITER, str(n)],
            cwd=ws,
            audit=ws / f"w{n}.jsonl",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(WRITERS)
    ]
    results = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    took = time.monotonic() - start
    bad = [(n, r) for n, r in enumerate(results) if r[0] != 0 or r[1].split() != [str(FILES), str(FILES)]]
    assert not bad, bad[:3]
    after = _kernel_log()
    if before is not None and after is not None:
        seen = set(before)
        new = [line for line in after if line not in seen and "overlayfs" in line]
        assert not [line for line in new if "in-use" in line], new[:3]
    # The next run of the workspace folds all 30 (overlapping) runs into its layer: every file is there.
    r = home.sh(ws, "ls ~/.cache/sgtest | wc -l; cat ~/.cache/sgtest/*/f* | wc -l")
    assert r.returncode == 0 and r.stdout.split() == [str(WRITERS), str(WRITERS * FILES)], (r.stdout, r.stderr, took)
    assert not any(ws.glob("f*")), "a write under ~ landed in the workspace"
    assert not (home.user.home / ".cache").exists(), "the real home changed"


PLANT = (
    "git config --global alias.sgmarker '!echo ALIAS-RAN-A' && "
    "git config --global core.fsmonitor 'echo FSMON-A >> \"$PWD/fsmonitor-ran\"; false' && "
    "echo 'echo BASHRC-A' >> ~/.bashrc && "
    "mkdir -p ~/.local/bin && printf '#!/bin/sh\\necho SHIM-A\\n' > ~/.local/bin/git && chmod +x ~/.local/bin/git && "
    "echo 'registry=http://evil.test/' > ~/.npmrc && "
    "mkdir -p ~/.npm/_cacache && echo cached-in-A > ~/.npm/_cacache/entry && echo planted"
)
LOOK = (
    "git config --global --get alias.sgmarker || echo no-alias; "
    "git config --global --get core.fsmonitor || echo no-fsmonitor; "
    "tail -1 ~/.bashrc; PATH=$HOME/.local/bin:$PATH; command -v git; "
    "cat ~/.npmrc 2>/dev/null || echo no-npmrc; cat ~/.npm/_cacache/entry 2>/dev/null || echo cold"
)

STATUS = "/usr/bin/git status --short >/dev/null 2>&1; test -e fsmonitor-ran && echo FSMON-RAN || echo quiet"


def test_what_a_run_plants_under_home_stays_in_its_workspace(home: Home) -> None:
    a, b = home.ws("a"), home.ws("b")
    for ws in (a, b):
        subprocess.run(["git", "init", "-q", str(ws)], check=True, timeout=30)
        subprocess.run(["chown", "-R", f"{home.user.uid}:{home.user.gid}", str(ws)], check=True, timeout=30)
    r = home.sh(a, PLANT)
    assert r.returncode == 0 and r.stdout.split() == ["planted"], (r.stdout, r.stderr)
    # In B: none of it, judged by what B's own tools read; and git status there runs no fsmonitor.
    r = home.sh(b, LOOK + "; " + STATUS)
    assert r.stdout.splitlines() == [
        "no-alias",
        "no-fsmonitor",
        "# the user's own",
        "/usr/bin/git",
        "no-npmrc",
        "cold",
        "quiet",
    ], (r.stdout, r.stderr)
    # The next run in A is warm, and (its own workspace's trust) sees what A's runs wrote: the
    # same look finds every plant, and the same git status runs the fsmonitor.
    r = home.sh(a, LOOK + "; " + STATUS)
    assert r.stdout.splitlines() == [
        "!echo ALIAS-RAN-A",
        'echo FSMON-A >> "$PWD/fsmonitor-ran"; false',
        "echo BASHRC-A",
        f"{home.user.home}/.local/bin/git",
        "registry=http://evil.test/",
        "cached-in-A",
        "FSMON-RAN",
    ], (r.stdout, r.stderr)
    # A directory made again where A was is another workspace: it starts from the real home.
    shutil.rmtree(a)
    a = home.ws("a")
    r = home.sh(a, "tail -1 ~/.bashrc; cat ~/.npm/_cacache/entry 2>/dev/null || echo cold")
    assert r.stdout.splitlines() == ["# the user's own", "cold"], (r.stdout, r.stderr)
    assert (home.user.home / ".bashrc").read_text() == "# the user's own\n"  # the real home never changed


def test_fresh_home_starts_from_the_real_home_and_drops_its_writes(home: Home) -> None:
    ws = home.ws("fresh")
    r = home.sh(ws, "echo kept > ~/.layer-file && echo 'echo LAYER' >> ~/.bashrc")
    assert r.returncode == 0, r.stderr
    r = home.sh(
        ws,
        "cat ~/.layer-file 2>/dev/null || echo none; tail -1 ~/.bashrc; echo dropped > ~/.fresh-file",
        "--fresh-home",
    )
    assert r.stdout.splitlines() == ["none", "# the user's own"], (r.stdout, r.stderr)
    r = home.sh(ws, "cat ~/.layer-file; cat ~/.fresh-file 2>/dev/null || echo none")
    assert r.stdout.splitlines() == ["kept", "none"], (r.stdout, r.stderr)


def test_cache_clear_refuses_in_one_line_while_a_run_lives_then_waits_and_clears(home: Home) -> None:
    ws = home.ws("clear")
    gate = ws / "go"
    script = (
        "mkdir -p ~/.cache/x && echo one > ~/.cache/x/a && touch started; "
        "while [ ! -e go ]; do sleep 0.05; done; echo two > ~/.cache/x/b && cat ~/.cache/x/a ~/.cache/x/b"
    )
    run = home.sandgate.popen(
        cmd=["sh", "-c", script],
        cwd=ws,
        audit=home.audit(ws),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (ws / "started").exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    r = home.cache(cwd=ws)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandgate: error: 1 running sandbox (pid "), lines
    assert str(ws) in lines[0] and "--wait" in lines[0], lines
    waiter = home.sandgate.where.popen(
        [*SANDGATE, "cache", "clear", "--wait"],
        cwd=ws,
        env=home.sandgate._env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    assert waiter.poll() is None, waiter.communicate()  # still waiting: the run lives
    gate.touch()
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and out.split() == ["one", "two"], (out, err)  # its home kept working
    _, werr = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and "waiting for 1 running sandbox" in werr and "removed" in werr, werr
    r = home.sh(ws, "cat ~/.cache/x/a 2>/dev/null || echo cold")
    assert r.stdout.split() == ["cold"], (r.stdout, r.stderr)


def test_read_only_trees_left_by_tools_are_folded_and_cleared_as_the_user(home: Home) -> None:
    ws = home.ws("ro")
    mod = "~/go/pkg/mod/example.test/m@v1"
    r = home.sh(ws, f"mkdir -p {mod}/sub && echo a > {mod}/a && echo s > {mod}/sub/s && chmod -R a-w ~/go/pkg/mod")
    assert r.returncode == 0, r.stderr
    # The next run (folding the first into a layer of 0555 directories) adds a file inside them.
    r = home.sh(
        ws, f"chmod u+w {mod} && echo b > {mod}/b && chmod a-w {mod} && mkdir -p ~/.cache/zero && chmod 0 ~/.cache/zero"
    )
    assert r.returncode == 0, r.stderr
    r = home.sh(ws, f"ls {mod}; stat -c %a {mod} {mod}/sub")
    assert r.stdout.split() == ["a", "b", "sub", "555", "555"], (r.stdout, r.stderr)
    r = home.cache(cwd=ws)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "removed" in r.stderr, r.stderr
    left = [p for p in home.store().rglob("*") if "ws-" in str(p)] if home.store().exists() else []
    assert not left, left[:5]
    r = home.sh(ws, f"ls {mod} 2>/dev/null || echo gone")
    assert r.stdout.split() == ["gone"], (r.stdout, r.stderr)


def test_the_store_of_layers_is_hidden_inside(home: Home) -> None:
    a, b = home.ws("seen"), home.ws("seer")
    r = home.sh(a, "echo secret-of-A > ~/.token")
    assert r.returncode == 0, r.stderr
    store = home.store().parent
    r = home.sh(b, f"ls -A {store} | wc -l; grep -rl secret-of-A {store} 2>/dev/null | wc -l")
    assert r.stdout.split() == ["0", "0"], (r.stdout, r.stderr)
    assert any(home.store().rglob(".token")), "the layer was not where the test looks"  # the test can fail
