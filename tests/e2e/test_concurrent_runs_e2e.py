"""Many `sandgate run` at once in one git workspace (issue 23, item 1): every run starts, every
missing protected path stays covered while any run that relies on it lives, and nothing is left
in the workspace once the last run ends.

The failure this guards against: one run removed its placeholders (`.git/remotes`, `.zed`,
`.sandgate.yaml`...) while another was mounting them (`sandbox setup: mount ...: No such file or
directory`, exit 125), or after it had mounted them: a directory removed on the host is
unmounted in every other mount namespace, so a live run's protected name became creatable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import World, new_world

#: Protected names a fresh repository lacks: each gets a placeholder while a run lives.
#: `.git/objects/info` holds two (alternates, http-alternates): a later run uses the earlier one's
#: directory, never creating inside it.
MISSING = (".git/remotes", ".git/branches", ".git/objects/info", ".zed", ".vscode", ".sandgate.yaml", ".mcp.json")
PARALLEL = 60


@dataclass
class Ws:
    world: World
    base: Path
    ws: Path
    home: Path
    policy: Path

    def sandgate(self) -> Sandgate:
        return Sandgate(self.world, policy=self.policy, quiet=True, cwd=self.ws, timeout=240, env=self.env())

    def env(self) -> dict[str, str]:
        return {**env(), "HOME": str(self.home)}

    def audit(self, name: str) -> Path:
        return self.base / "audit" / f"{name}.jsonl"


def _git(ws: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True, check=True, timeout=60)
    return r.stdout


def tree(root: Path) -> set[str]:
    """Every path below root (a placeholder left anywhere shows up here)."""
    out: set[str] = set()
    for d, dirs, files in os.walk(root):
        out.update(os.path.relpath(os.path.join(d, n), root) for n in (*dirs, *files))
    return out


@pytest.fixture(scope="module")
def w() -> Iterator[Ws]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-conc-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    try:
        with new_world() as world:
            ws, home = base / "ws", base / "home"
            for d in (ws, home, base / "audit"):
                d.mkdir()
            _git(ws, "init", "-q")
            for name in ("remotes", "branches", "objects/info"):  # the test needs them missing
                shutil.rmtree(ws / ".git" / name, ignore_errors=True)
            (ws / "README").write_text("hi\n")
            _git(ws, "add", "README")
            _git(ws, "-c", "user.name=t", "-c", "user.email=t@sandgate.test", "commit", "-qm", "init")
            policy = base / "policy.yaml"
            policy.write_text("version: 1\nnetwork:\n  allow: [pypi.test]\n")
            yield Ws(world, base, ws, home, policy)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))  # the fake home's sandbox layer too
        shutil.rmtree(base, ignore_errors=True)


def _start(w: Ws, n: int, tag: str, cmd: list[str]) -> list[subprocess.Popen[str]]:
    sg = w.sandgate()
    return [
        sg.popen(audit=w.audit(f"{tag}-{i}"), cmd=cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(n)
    ]


def _finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        _, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        out.append((p.returncode, err))
    return out


def test_sixty_runs_at_once_in_one_workspace_all_start_and_leave_nothing(w: Ws) -> None:
    assert not any((w.ws / m).exists() for m in MISSING), "the protected names must be missing to begin with"
    before = tree(w.ws)
    t0 = time.monotonic()
    results = _finish(_start(w, PARALLEL, "sixty", ["true"]), timeout=240)
    took = time.monotonic() - t0
    failed = [(code, err) for code, err in results if code != 0]
    assert not failed, f"{len(failed)} of {PARALLEL} runs failed, e.g. {failed[:3]}"
    assert tree(w.ws) == before  # no placeholder (nor anything else) left
    assert _git(w.ws, "status", "--porcelain", "--untracked-files=all", "--ignored") == ""
    print(f"{PARALLEL} runs at once: {took:.1f} s")


#: Runs inside the long sandbox: tries to fill every missing protected name (and one existing file)
#: over and over while other runs start and end; the write into the workspace must keep working.
CHECKER = textwrap.dedent("""\
    import errno, json, os, sys, time
    stop, names = sys.argv[1], sys.argv[2:]
    tries = [(n + "/x", os.O_CREAT | os.O_WRONLY) for n in names] + [(".git/config", os.O_WRONLY | os.O_APPEND)]
    rounds, bad = 0, []
    print("ready", flush=True)
    while not os.path.exists(stop) and rounds < 100000:
        rounds += 1
        for path, flags in tries:
            try:
                os.close(os.open(path, flags, 0o644))
                bad.append(f"{path} WRITTEN")
            except OSError as e:
                if e.errno != errno.EROFS:  # ENOENT: the placeholder vanished, the name is free
                    bad.append(f"{path} {errno.errorcode.get(e.errno, e.errno)}")
        with open("permitted.txt", "w") as f:  # the matching permitted write, each round
            f.write("ok")
        os.unlink("permitted.txt")
        time.sleep(0.02)
    print(json.dumps({"rounds": rounds, "bad": bad[:20]}))
""")


def test_protected_paths_of_a_live_run_stay_protected_while_runs_start_and_end(w: Ws) -> None:
    checker = w.base / "checker.py"
    checker.write_text(CHECKER)
    stops = [w.base / "stop-first", w.base / "stop-long"]
    for s in stops:
        s.unlink(missing_ok=True)
    sg = w.sandgate()
    wait = f"while [ ! -e {stops[0]} ]; do sleep 0.05; done"
    first = sg.popen(audit=w.audit("first"), cmd=["sh", "-c", wait], stderr=subprocess.PIPE, text=True)
    long: subprocess.Popen[str] | None = None
    results: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 60
        while not all(os.path.lexists(w.ws / m) for m in MISSING) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(os.path.lexists(w.ws / m) for m in MISSING), "positive control: the first run covers them"
        # The long run finds them there (the first run's), then the first run ends.
        long = sg.popen(
            audit=w.audit("long"),
            cmd=[sys.executable, str(checker), str(stops[1]), *MISSING],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert long.stdout is not None
        assert long.stdout.readline() == "ready\n", long.stderr.read() if long.stderr else ""
        stops[0].touch()
        assert first.wait(60) == 0, first.stderr.read() if first.stderr else ""
        for wave in range(3):  # runs that start and end (each removing what it may) under the long run
            results += _finish(_start(w, 10, f"wave{wave}", ["true"]), timeout=120)
        held = all(os.path.lexists(w.ws / m) for m in MISSING)  # still there: the long run lives
    finally:
        for s in stops:
            s.touch()
        out, err = long.communicate(timeout=60) if long else ("", "")
        first.wait(60)
        for s in stops:
            s.unlink()
    assert long.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["bad"] == [] and report["rounds"] > 5, report  # every attempt refused (EROFS), many rounds
    assert len(results) == 30 and all(code == 0 for code, _ in results), [e for c, e in results if c != 0][:3]
    assert held
    assert not (w.ws / "permitted.txt").exists()
    assert not any(os.path.lexists(w.ws / m) for m in MISSING)  # the last run out removed the placeholders
    assert _git(w.ws, "status", "--porcelain", "--untracked-files=all", "--ignored") == ""


def test_a_users_run_keeps_its_protection_when_roots_run_that_made_the_placeholders_ends(w: Ws) -> None:
    """Two users, one workspace: root's run made the placeholders, the user's run (another runtime
    directory, another registry) finds them there; root's runs end and sweep, yet the user's protected
    names stay covered. What root's run made and the user's used is removed by root's next cleanup."""
    from ..support.rootless import UnprivilegedUser

    with UnprivilegedUser(base_dir="/var/tmp") as u:
        ws = u.base / "ws"
        ws.mkdir()
        _git(ws, "init", "-q")
        for name in ("remotes", "branches", "objects/info"):
            shutil.rmtree(ws / ".git" / name, ignore_errors=True)
        subprocess.run(["chown", "-R", f"{u.uid}:{u.gid}", str(ws)], check=True)
        for name, text in (("checker.py", CHECKER), ("policy.yaml", w.policy.read_text())):
            (u.base / name).write_text(text)
            (u.base / name).chmod(0o644)
        stops = [u.base / "stop-root", u.base / "stop-user"]
        as_root = Sandgate(w.world, policy=w.policy, quiet=True, cwd=ws, timeout=120, env=w.env())
        as_user = Sandgate(
            u.runner(w.world), policy=u.base / "policy.yaml", quiet=True, cwd=ws, timeout=120,
            env={**env(), "HOME": str(u.home)},
        )  # fmt: skip
        wait = f"while [ ! -e {stops[0]} ]; do sleep 0.05; done"
        first = as_root.popen(audit=w.audit("x-root"), cmd=["sh", "-c", wait])
        user: subprocess.Popen[str] | None = None
        try:
            deadline = time.monotonic() + 60
            while not all(os.path.lexists(ws / m) for m in MISSING) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert all(os.path.lexists(ws / m) for m in MISSING), "positive control: root's run covers them"
            user = as_user.popen(
                cmd=[sys.executable, str(u.base / "checker.py"), str(stops[1]), *MISSING],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert user.stdout is not None
            assert user.stdout.readline() == "ready\n", user.stderr.read() if user.stderr else ""
            stops[0].touch()
            assert first.wait(60) == 0
            again = as_root.run(audit=w.audit("x-root2"), cmd=["true"])  # its start and end sweep too
            assert again.returncode == 0, again.stderr
            held = all(os.path.lexists(ws / m) for m in MISSING)
            time.sleep(0.3)  # the checker's rounds after both sweeps (a served run ends in ~50 ms)
        finally:
            for s in stops:
                s.touch()
            out, err = user.communicate(timeout=60) if user else ("", "")
            first.wait(60)
        assert user.returncode == 0, err
        report = json.loads(out.splitlines()[-1])
        assert report["bad"] == [] and report["rounds"] > 5, report
        assert held
        r = w.world.run([*SANDGATE, "cleanup"], cwd=w.base, env=w.env())
        assert r.returncode == 0, r.stderr
        assert not any(os.path.lexists(ws / m) for m in MISSING), r.stderr
        assert _git(ws, "-c", f"safe.directory={ws}", "status", "--porcelain", "--untracked-files=all") == ""
