"""`sandgate audit summary|suggest` with no LOG read the last run of the workspace you stand in
(issue 23, item 5), never the newest log of the audit directory, which another workspace's run,
started later and still running, may own; and they say which run they read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import World, new_world


@pytest.fixture
def two() -> Iterator[tuple[World, Path, Path, list[Path]]]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-audws-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    made: list[Path] = []  # the runs' logs in the default directory, removed afterwards
    try:
        with new_world() as w:
            for d in ("a", "b", "home"):
                (base / d).mkdir()
            yield w, base / "a", base / "b", made
    finally:
        for log in made:
            log.unlink(missing_ok=True)
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)


def _log_of(stderr: str) -> Path:
    """The exit line names the run's log: `sandgate: N allowed, M denied -> LOG`."""
    line = next(x for x in stderr.splitlines() if " -> " in x)
    return Path(line.rsplit(" -> ", 1)[1])


def test_summary_in_a_reads_as_last_run_while_a_later_run_of_b_is_still_going(
    two: tuple[World, Path, Path, list[Path]],
) -> None:
    world, a, b, made = two
    run_env = {**env(), "HOME": str(a.parent / "home")}
    sg = Sandgate(world, env=run_env, timeout=60)  # no --audit-log: the default directory, where summary looks
    curl = "curl -s -o /dev/null -w '%{http_code}' -m 5"
    r = sg.run("--allow", "pypi.test", cmd=["sh", "-c", f"{curl} http://a-side.test/"], cwd=a)
    assert r.returncode == 0 and r.stdout == "403", r.stderr  # refused by the proxy, recorded in A's log
    made.append(a_log := _log_of(r.stderr))
    stop = a.parent / "stop"
    later = sg.popen(
        "--allow",
        "pypi.test",
        cmd=["sh", "-c", f"{curl} http://b-side.test/; while [ ! -e {stop} ]; do sleep 0.05; done"],
        cwd=b,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _has_b(a_log.parent, a_log):
            time.sleep(0.1)
        assert _has_b(a_log.parent, a_log), "positive control: B's run logged its request, in a newer log"
        s = world.run([*SANDGATE, "audit", "summary", "--json"], cwd=a, env=run_env)
        assert s.returncode == 0, s.stderr
        hosts = {row["host"] for row in json.loads(s.stdout)}
        assert hosts == {"a-side.test"}, (hosts, s.stderr)  # A's run only, not the newer B log
        assert s.stderr.splitlines() == [
            f"sandgate: reading the last run of {a} (task {_task(a_log)}, started {_started(a_log)}): {a_log}"
        ]
    finally:
        stop.touch()
        _, err = later.communicate(timeout=30)
    made.append(b_log := _log_of(err))
    s = world.run([*SANDGATE, "audit", "suggest"], cwd=b, env=run_env)
    assert s.returncode == 0 and "b-side.test" in s.stdout and "a-side.test" not in s.stdout, s.stdout
    assert s.stderr.endswith(f": {b_log}\n") and str(b) in s.stderr, s.stderr
    # A --learn run that reached nothing says caches may have served everything.
    r = sg.run("--learn", cmd=["true"], cwd=a)
    assert r.returncode == 0, r.stderr
    made.append(_log_of(r.stderr))
    s = world.run([*SANDGATE, "audit", "summary"], cwd=a, env=run_env)
    assert s.returncode == 0 and "--learn" in s.stderr, s.stderr
    assert "sandgate: note: a --learn run without a single network connection" in s.stdout, s.stdout


def _has_b(d: Path, a_log: Path) -> bool:
    for p in d.glob("audit-*.jsonl"):
        if p != a_log and p.stat().st_mtime >= a_log.stat().st_mtime and "b-side.test" in p.read_text():
            return True
    return False


def _first(log: Path) -> dict[str, object]:
    rec: dict[str, object] = json.loads(log.read_text().splitlines()[0])
    assert rec["event"] == "policy"
    return rec


def _task(log: Path) -> object:
    return _first(log)["task"]


def _started(log: Path) -> object:
    return _first(log)["ts"]
