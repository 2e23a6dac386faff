#!/usr/bin/env python3
"""What `sandgate run` adds to starting a command, measured in one run against its baselines.

Rows (median and p90 wall time, interleaved so machine drift hits all alike):
  bare `true`                       the floor
  `unshare -Urn true`               the kernel's price of a user + network namespace
  `sandgate run -- true`, warm      the proxy daemon and the fork server already running (the common
                                    case: an agent runs hundreds of commands per task; the run is
                                    forked by the pre-imported server, launcher/forkserver/)
  ..., warm, full path              the same with SANDGATE_FORKSERVER=0: the console script imports
                                    and runs everything itself (what a terminal run does)
  `sandgate run -- true`, cold      no daemon, no fork server: the run starts the daemon (and does not
                                    wait for it)
Targets on a 2-core machine (issue 9): warm <= 50 ms, cold <= 400 ms. No pass/fail: the
figures are printed with their ratios. Runs as root or as an ordinary user; it creates its
sandboxes and daemon itself and stops the daemon at the end.

Then where a warm run's time goes (issue 25), each figure the median over the same iterations:
  interpreter, bare     `python -S -c pass` with the interpreter sandgate runs under (own rows)
  site                  `python -c pass` minus the above: site-packages and their .pth files
    editable finder     if the install has a setuptools editable finder (a .pth that imports it at
                        every start), its share: `python -S -c "<site-packages on sys.path>; import
                        <finder>"` minus `python -S -c pass` (what the finder's import costs, pathlib
                        and re included; a plain path .pth costs next to nothing)
  modules sandgate needs  `python -c "import <list>"`: every module outside sandgate's own packages that
                        a run's imports load (stdlib and third party, listed by a helper that imports
                        launcher.cli and launcher.run.launch and reads sys.modules), imported plainly:
                        what a Python launcher of this design pays before its own code (`dataclasses`
                        brings `inspect` here; sandgate's run defers it, sgbase/dataclasscache.py);
                        minus `python -c pass`
  every phase below     a warm run with SANDGATE_TIMINGS=1: the launcher, the holder, init and CMD's
                        process write CLOCK_MONOTONIC stamps at the end of each phase (launcher/
                        timings.py); the bench stamps the same clock before it spawns the run and
                        after the run is reaped. The phases are the differences of consecutive
                        stamps; a timed run is not counted in the headline rows.
`--tree DIR` measures another checkout with the same interpreter (PYTHONPATH=DIR): run it with the
old and the new tree in turn, or give `--tree` twice to interleave both in one run.
"""

from __future__ import annotations

import argparse
import itertools
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
PREFIX = "sandgate-timing"  # launcher/timings.py's line prefix (not imported: --tree may be another checkout)

# Each phase is the span between two consecutive stamps of one run (sorted by time): "spawn" is the bench's
# own stamp before it starts the run, "reaped" the one after; the others are named in launcher/timings.py's
# callers. A served run and a full-path run share most of them; the first few differ.
PHASES = {
    ("spawn", "interpreter"): "interpreter + site (spawn to first sandgate code)",
    ("interpreter", "forked"): "served: client imports, key, connect; server's fork",
    ("forked", "cli-imported"): "served: the worker takes over the caller's state",
    ("interpreter", "cli-imported"): "sandgate's imports (launcher.cli)",
    ("cli-imported", "parsed"): "argument parsing",
    ("parsed", "imports"): "sandgate's imports (launcher.run)",
    ("imports", "daemon-connect"): "daemon handshake: connect (or spawn a cold one)",
    ("daemon-connect", "policy"): "CLI work: policy, options, workspace checks",
    # The holder is forked before the plan: its namespaces and network are made while the launcher
    # plans, so these stamps interleave; whichever of "nft" and "prepare" comes last ends the overlap.
    ("policy", "unshare"): "holder forked + unshare (the launcher plans meanwhile)",
    ("unshare", "nft"): "nft table + listeners inside (the launcher plans meanwhile)",
    ("nft", "prepare"): "the rest of the plan: run state, lock, gitguard, placeholders",
    ("unshare", "prepare"): "the plan ends (the holder still makes its network)",
    ("prepare", "nft"): "the holder's network ends (the plan is done)",
    ("prepare", "handshake"): "id maps + listener handover",
    ("nft", "handshake"): "id maps + listener handover",
    ("policy", "prepare"): "run state, lock, confinement plan (gitguard), placeholders",
    ("prepare", "unshare"): "namespaces: fork holder + unshare",
    ("handshake", "bind"): "daemon handshake: bind",
    ("bind", "go"): "go",
    ("go", "mounts"): "init: mounts, /proc, keyring",
    ("mounts", "confine"): "CMD: caps, ids, Landlock, seccomp",
    ("confine", "cmd-exited"): "exec `true`, exit, reaped by init/holder/launcher",
    ("cmd-exited", "teardown"): "teardown (unbind, run state, placeholders)",
    ("teardown", "exit"): "summary, flush",
    ("exit", "reaped"): "process exit, reaped by the bench",
    ("teardown", "reaped"): "summary, status to the client, exits, reaped by the bench",
}


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def stamped(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, int]:
    """One run with SANDGATE_TIMINGS=1: its stamps by phase, plus the bench's spawn and reaped."""
    spawn = time.monotonic_ns()
    stamping = {**env, "SANDGATE_TIMINGS": "1"}
    done = subprocess.run(
        cmd, check=True, cwd=cwd, env=stamping, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    reaped = time.monotonic_ns()
    out = {"spawn": spawn, "reaped": reaped}
    for line in done.stderr.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == PREFIX and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
    return out


def stop_daemon(sandgate: list[str], cwd: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [*sandgate, "daemon", "stop"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[max(0, int(len(samples) * q) - 1)]


def row(name: str, samples: list[float], base: float) -> str:
    med = statistics.median(samples)
    target = TARGETS.get(name.split()[-1])
    verdict = "" if target is None else f"  target <= {target * 1000:.0f} ms: {'met' if med <= target else 'NOT met'}"
    return (
        f"{name:<34} median {med * 1000:8.1f} ms  p90 {pct(samples, 0.9) * 1000:8.1f} ms  "
        f"ratio to bare {med / base:7.1f}x{verdict}"
    )


def editable_finder(python: str) -> str | None:
    """The setuptools editable finder module `site` imports for this interpreter, if any."""
    code = (
        "import sys; print(next((m for m in sys.modules if m.startswith('__editable__') and m.endswith('finder')), ''))"
    )
    name = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False).stdout.strip()
    return name or None


def site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


# Prints the modules outside sandgate's packages that the run path loads (a fresh interpreter: sys.modules after).
FOREIGN = """
import sys
before = set(sys.modules)
import launcher.cli, launcher.run.launch
ours = ("launcher", "netguard", "fsguard", "sgbase", "selftest")
new = [m for m in set(sys.modules) - before if m.split(".")[0] not in ours and not m.startswith("_")]
print(" ".join(sorted(m for m in new if getattr(sys.modules[m], "__spec__", None) is not None)))  # not a stand-in"""


def foreign_modules(python: str, env: dict[str, str]) -> str:
    return subprocess.run([python, "-c", FOREIGN], capture_output=True, text=True, check=True, env=env).stdout.strip()


def sandgate_cmd(python: str) -> list[str]:
    """The console script next to the interpreter (what users run), else `python -m launcher.cli`."""
    script = Path(python).parent / "sandgate"
    return [python, str(script)] if script.is_file() else [python, "-m", "launcher.cli"]


class Tree:
    """One checkout under test: its command lines and its samples."""

    def __init__(self, tree: Path, python: str, env: dict[str, str], work: Path) -> None:
        self.tree, self.env = tree, {**env, "PYTHONPATH": str(tree)}
        self.full_env = {**self.env, "SANDGATE_FORKSERVER": "0"}
        self.sandgate = sandgate_cmd(python)
        audit = ["--audit-log", str(work / "audit.jsonl")]
        self.run = [*self.sandgate, "run", "-q", "--allow", "example.test", *audit, "--", "true"]
        self.warm: list[float] = []
        self.full: list[float] = []
        self.cold: list[float] = []
        self.stamps: list[dict[str, int]] = []
        self.full_stamps: list[dict[str, int]] = []

    def serve(self, work: Path) -> bool:
        """Warm runs until one is served (a tree without launcher/forkserver/ never is: False)."""
        for _ in range(10):
            if "forked" in stamped(self.run, work, self.env):
                return True
            time.sleep(0.3)  # the server's own start: its imports
        return False


def measure(trees: list[Tree], python: str, work: Path, n: int) -> dict[str, list[float]]:
    """The interleaved loop: baselines and every tree's warm runs, timed and stamped."""
    env = trees[0].env
    finder = editable_finder(python)
    purelib = site_packages(python)
    unshare = shutil.which("unshare")
    base: dict[str, list[float]] = {k: [] for k in ("bare `true`", "`unshare -Urn true`", "python -S", "python")}
    base["finder"], base["foreign"] = [], []
    foreign = [
        "-W",
        "ignore",
        "-c",
        "import sys\nfor m in sys.argv[1:]: __import__(m)",
        *foreign_modules(python, env).split(),
    ]
    for t in trees:
        timed(t.run, work, t.env)  # warm the page cache for the imports (and start the daemon)
        if not t.serve(work):
            print(f"note: no fork server served {t.tree}: its warm row is the full path", file=sys.stderr)
    for _ in range(n):
        base["bare `true`"].append(timed(["true"], work, env))
        if unshare:
            base["`unshare -Urn true`"].append(timed([unshare, "-Urn", "true"], work, env))
        base["python -S"].append(timed([python, "-S", "-c", "pass"], work, env))
        base["python"].append(timed([python, "-c", "pass"], work, env))
        base["foreign"].append(timed([python, *foreign], work, env))
        if finder:
            imp = f"import sys; sys.path.append({purelib!r}); import {finder}"
            base["finder"].append(timed([python, "-S", "-c", imp], work, env))
        for t in trees:
            t.warm.append(timed(t.run, work, t.env))
            t.stamps.append(stamped(t.run, work, t.env))
            t.full.append(timed(t.run, work, t.full_env))
            t.full_stamps.append(stamped(t.run, work, t.full_env))
    for _ in range(max(1, n // 2)):  # cold: each run finds no daemon (nor fork server) and starts one
        for t in trees:
            stop_daemon(t.sandgate, work, t.env)
            t.cold.append(timed(t.run, work, t.env))
    stop_daemon(trees[0].sandgate, work, env)
    return base


def interpreter_rows(base: dict[str, list[float]]) -> list[str]:
    """The interpreter's own rows: what any Python launcher pays before its first line."""
    med = statistics.median
    py_s, py = med(base["python -S"]), med(base["python"])
    lines = [
        f"  {'interpreter, bare (python -S -c pass)':<58} {py_s * 1000:7.1f} ms   (own rows)",
        f"  {'site (python -c pass minus the above)':<58} {(py - py_s) * 1000:7.1f} ms   (own rows)",
    ]
    if base["finder"]:
        finder = med(base["finder"]) - py_s
        lines.append(f"  {'  of which the setuptools editable finder':<58} {finder * 1000:7.1f} ms   (own rows)")
    foreign = med(base["foreign"]) - py
    lines.append(
        f"  {'(for scale) the stdlib + third-party modules a run loads':<58} {foreign * 1000:7.1f} ms   (own rows)"
    )
    return lines


def breakdown(stamps: list[dict[str, int]]) -> list[str]:
    """A run's phases: consecutive stamps of each run (ms, medians over the stamped runs)."""
    med = statistics.median
    spans: dict[tuple[str, str], list[float]] = {}
    for s in stamps:
        order = sorted(s, key=lambda k: s[k])
        for a, b in itertools.pairwise(order):
            spans.setdefault((a, b), []).append((s[b] - s[a]) / 1e6)
    lines, total = [], 0.0
    for pair, values in spans.items():
        label = PHASES.get(pair, f"{pair[0]} -> {pair[1]}")
        total += med(values) * len(values) / len(stamps)  # a phase some runs lack counts for its share
        lines.append(f"  {label:<58} {med(values):7.1f} ms   p90 {pct(values, 0.9):6.1f}")
    whole = [(s["reaped"] - s["spawn"]) / 1e6 for s in stamps]
    lines.append(
        f"  {'sum of the phase medians / median of the stamped runs':<58} {total:7.1f} ms / {med(whole):.1f} ms"
    )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="iterations of each (default 20)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter sandgate runs under (default: this one)")
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeatable; default: this one)")
    args = ap.parse_args()
    # PYTHONDONTWRITEBYTECODE would make every run compile the sources it imports: a user's run reads .pyc files.
    drop = ("SANDGATE_TIMINGS", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k not in drop}
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-") as tmp:
        work = Path(tmp)
        trees = [Tree(d.resolve(), args.python, env, work) for d in (args.tree or [REPO])]
        stop_daemon(trees[0].sandgate, work, trees[0].env)
        base = measure(trees, args.python, work, args.n)
    floor = statistics.median(base["bare `true`"])
    print(f"iterations: {args.n} (cold: {max(1, args.n // 2)}); uid {os.getuid()}; python {args.python}")
    for name in ("bare `true`", "`unshare -Urn true`"):
        if base[name]:
            print(row(name, base[name], floor))
    for t in trees:
        tag = "" if len(trees) == 1 else f" [{t.tree}]"
        print(row("sandgate run, warm", t.warm, floor) + tag)
        print(row("sandgate run, warm, full path", t.full, floor) + tag)
        print(row("sandgate run, cold", t.cold, floor) + tag)
        print(f"added by sandgate (warm): {(statistics.median(t.warm) - floor) * 1000:.1f} ms{tag}")
        print(f"where a warm run's time goes{tag}:")
        print("\n".join(interpreter_rows(base)))
        print("\n".join(breakdown(t.stamps)))
        print(f"and a warm run on the full path (SANDGATE_FORKSERVER=0){tag}:")
        print("\n".join(breakdown(t.full_stamps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
