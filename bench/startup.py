#!/usr/bin/env python3
"""What `sandgate run` adds to starting a command: median wall time of `sandgate run -- true`
against bare `true`, measured in the same run.

Why: an agent runs hundreds of short commands; if the wrapper costs seconds each, people turn
it off. The figure covers the whole launch sequence (policy, veth, proxy process start,
nftables, namespaces, teardown). Needs root; creates and removes one sandbox per iteration.
No pass/fail threshold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="iterations of each (default 10)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/startup.py: needs root (sandgate run builds namespaces)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-") as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text("version: 1\nnetwork:\n  allow:\n    - example.test\n")
        sandgate = [sys.executable, "-m", "launcher.cli", "run", "-q", "--policy", str(policy),
                    "--audit-log", str(Path(tmp) / "audit.jsonl"), "--", "true"]
        bare, wrapped = [], []
        timed(sandgate, REPO)  # warm the page cache for the imports
        for _ in range(args.n):  # interleaved, so drift in machine load hits both alike
            bare.append(timed(["true"], REPO))
            wrapped.append(timed(sandgate, REPO))
    b, w = statistics.median(bare), statistics.median(wrapped)
    print(f"iterations: {args.n}")
    print(f"bare `true`:              median {b * 1000:8.1f} ms")
    print(f"`sandgate run -- true`:   median {w * 1000:8.1f} ms  (max {max(wrapped) * 1000:.1f} ms)")
    print(f"added: {(w - b) * 1000:.1f} ms; ratio {w / b:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
