"""The benchmarks still run (tiny sizes, inside a disposable world): figures are read by people, not asserted."""

from __future__ import annotations

import re
import sys

import pytest

from ..support.runner import REPO, env
from ..support.world import World

#: Issue 25's table at its smallest: every row once, the big policies at 100 names.
SCORECARD = "--n 2 --conns 5 --mb 2 --cold 1 --starts 2 --big-runs 1 --names 100 --host-list 100 --decisions 2000"
#: Each client's added ms on the transparent path, as response.py and as scorecard.py print it.
ADDED = {
    "response.py": r"^https transparent\s+{client}\s+[+-][\d.]+\s+[+-][\d.]+\s+[\d.]+x",
    "scorecard.py": r"^added ms, full https transparent response, new conn, {client}\s+[+-][\d.]+ \(p95",
}


@pytest.mark.parametrize(
    "script,args",
    [
        ("throughput.py", ["--mb", "2"]),
        ("latency.py", ["--n", "5"]),
        ("startup.py", ["--n", "1"]),
        ("datapath.py", ["--mb", "2", "--repeat", "1", "--n", "3", "--concurrency", "50"]),
        ("concurrency.py", ["--n", "50", "--sandboxes", "2"]),
        ("fairshare.py", ["--n", "5", "--hog", "2100"]),  # just past the share (PER_SANDBOX 2048)
        ("resolver.py", ["--n", "5", "--rounds", "1"]),
        ("response.py", ["--n", "2"]),
        ("scorecard.py", SCORECARD.split()),
    ],
)
def test_benchmark_runs(world: World, script: str, args: list[str]) -> None:
    r = world.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, env=env(), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ratio" in r.stdout or "proxied" in r.stdout or "added" in r.stdout or "RESULT" in r.stdout, r.stdout
    if script in ("datapath.py", "concurrency.py"):
        assert "RESULT 50 0" in r.stdout, r.stdout  # every tunnel delivered every byte
    # Issue 13's row: inspected HTTPS against passthrough through the same proxy, in the same run.
    if script == "throughput.py":
        assert re.search(r"^https \(inspected\)\s+[\d.]+\s+[\d.]+\s+[\d.]+", r.stdout, re.M), r.stdout
        assert re.search(r"inspected vs passthrough https, both proxied: .* ratio \d+\.\d\d", r.stdout), r.stdout
    if script == "fairshare.py":  # the victim served in every mode, beside a hog past its share and a streamer
        assert "RESULT 0" in r.stdout and re.search(r"^both\s+[\d.]+\s+[\d.]+\s+[\d.]+", r.stdout, re.M), r.stdout
        hog = re.search(r"mode hog, hog after 2 s: open (\d+), closed (\d+), connecting 0, of 2100", r.stdout)
        assert hog and int(hog[1]) <= 2048 and int(hog[1]) + int(hog[2]) == 2100, r.stdout  # cut to its share
    if script in ADDED:  # issue 25: full responses, with curl and with http.client
        for client in ("curl", "http.client"):
            assert re.search(ADDED[script].format(client=re.escape(client)), r.stdout, re.M), r.stdout
    if script == "scorecard.py":  # every row printed, a tool that is not installed skipped, not an error
        assert re.search(r"^warm start `sandgate run -q -- true`\s+[\d.]+ ms \(unshare", r.stdout, re.M), r.stdout
        assert re.search(r"^cold start \+ first HTTPS request \(curl\)\s+[\d.]+ s", r.stdout, re.M), r.stdout
        assert re.search(r"^warm start against srt\s+(not installed|[\d.]+ ms|fails: )", r.stdout, re.M), r.stdout
    if script == "latency.py":
        assert re.search(r"^https inspected\s+[\d.]+\s+[\d.]+$", r.stdout, re.M), r.stdout
        assert re.search(r"added by inspection over passthrough: median [+-][\d.]+ ms, p95 [+-][\d.]+ ms", r.stdout)
