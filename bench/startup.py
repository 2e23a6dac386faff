#!/usr/bin/env python3
"""What `sandgate run` adds to starting a command, measured in one run against its baselines.

Rows (median and p90 wall time, interleaved so machine drift hits all alike):
  bare `true`                       the floor
  `unshare -Urn true`               the kernel's price of a user + network namespace
  `sandgate run -- true`, warm      the proxy daemon already running (the common case: an agent
                                    runs hundreds of commands per task)
  `sandgate run -- true`, cold      no daemon: the run starts one (and does not wait for it)
Targets on a 2-core machine (issue 9): warm <= 50 ms, cold <= 400 ms. No pass/fail: the
figures are printed with their ratios. Runs as root or as an ordinary user; it creates its
sandboxes and daemon itself and stops the daemon at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"warm": 0.050, "cold": 0.400}


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def stop_daemon(sandgate: list[str], cwd: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [*sandgate, "daemon", "stop"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def row(name: str, samples: list[float], base: float) -> str:
    med = statistics.median(samples)
    p90 = sorted(samples)[max(0, int(len(samples) * 0.9) - 1)]
    target = TARGETS.get(name.split()[-1])
    verdict = "" if target is None else f"  target <= {target * 1000:.0f} ms: {'met' if med <= target else 'NOT met'}"
    return (
        f"{name:<28} median {med * 1000:8.1f} ms  p90 {p90 * 1000:8.1f} ms  ratio to bare {med / base:7.1f}x{verdict}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="iterations of each (default 20)")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["PYTHONPATH"] = str(REPO)
    unshare = shutil.which("unshare")
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-") as tmp:
        work = Path(tmp)
        sandgate = [sys.executable, "-m", "launcher.cli"]
        run = [
            *sandgate,
            "run",
            "-q",
            "--allow",
            "example.test",
            "--audit-log",
            str(work / "audit.jsonl"),
            "--",
            "true",
        ]
        stop_daemon(sandgate, work, env)
        timed(run, work, env)  # warm the page cache for the imports (and start the daemon)
        rows: dict[str, list[float]] = {
            "bare `true`": [],
            "`unshare -Urn true`": [],
            "sandgate run, warm": [],
            "sandgate run, cold": [],
        }
        for _ in range(args.n):
            rows["bare `true`"].append(timed(["true"], work, env))
            if unshare:
                rows["`unshare -Urn true`"].append(timed([unshare, "-Urn", "true"], work, env))
            rows["sandgate run, warm"].append(timed(run, work, env))
        for _ in range(max(1, args.n // 2)):  # cold: each run finds no daemon and starts one
            stop_daemon(sandgate, work, env)
            rows["sandgate run, cold"].append(timed(run, work, env))
        stop_daemon(sandgate, work, env)
    base = statistics.median(rows["bare `true`"])
    print(f"iterations: {args.n} (cold: {max(1, args.n // 2)}); uid {os.getuid()}")
    for name, samples in rows.items():
        if samples:
            print(row(name, samples, base))
    warm = statistics.median(rows["sandgate run, warm"])
    print(f"added by sandgate (warm): {(warm - base) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
