"""The probe runner of `sandgate verify`: every permitted action and every known bypass, tried for real.

Run INSIDE a sandbox (`sandgate verify` starts it with `sandgate run`), from the workspace:

    python -m selftest.probes SPEC.json [--context child|grandchild|daemon] [--only NAME ...] [--no-spawn]

Stdlib only: the sandbox's python may have nothing else. One JSON object per line on stdout:

    {"group", "probe", "context", "expected", "observed", "detail"}

The orchestrator also checks the canary servers' logs, so every network probe carries a marker
(selftest/markers.py); <ctx> there is the context, or `<context>-<tag>` when the spec
has a marker_tag (one per verify pass).

Contexts: the runner (context "child") runs every probe, then itself again through `sh -c` as a
"grandchild" (output relayed), then forks a "daemon" (double fork + setsid, stdio on /dev/null)
that writes `<results_dir>/daemon-<token>.jsonl`, renames it to `daemon-<token>.done.jsonl`
(relayed by the parent, which waits up to DAEMON_WAIT s), names itself `<daemon_token>` and
then keeps appending "alive <time> <ok|fail>" to `daemon-<token>.heartbeat` every 0.5 s for up to
120 s: the orchestrator checks after the run that the sandbox killed it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftest.probes.core import CONTEXTS, REGISTRY, probe_list, run_probes, select_probes
from selftest.probes.syscalls import fresh_libc
from selftest.spec import VerifySpec, load_spec

DAEMON_WAIT = 30.0
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_DURATION = 120.0
GRANDCHILD_TIMEOUT = 300.0


def emit(record: Mapping[str, Any], out: Any = None) -> None:
    """One record as one JSON line, flushed (a killed runner leaves only complete lines)."""
    out = out or sys.stdout
    out.write(json.dumps(record) + "\n")
    out.flush()


def relay_line(line: str) -> bool:
    """Print `line` if it is one JSON record; anything else goes to stderr. True if relayed."""
    line = line.strip()
    if not line:
        return False
    try:
        rec = json.loads(line)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        print(f"sandgate-probes: not a record: {line[:200]}", file=sys.stderr, flush=True)
        return False
    emit(rec)
    return True


def runner_argv(spec_path: str, spec: VerifySpec, context: str, only: list[str] | None) -> list[str]:
    """The command line that runs this runner again (spec.python, else this interpreter)."""
    argv = [spec.python or sys.executable, "-m", "selftest.probes", spec_path, "--context", context]
    for name in only or ():
        argv += ["--only", name]
    return argv


def run_grandchild(spec_path: str, spec: VerifySpec, only: list[str] | None) -> None:
    """Run the probes again from `sh -c` (a grandchild of the command) and relay its records."""
    proc = subprocess.Popen(
        ["sh", "-c", shlex.join(runner_argv(spec_path, spec, "grandchild", only))], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    count = sum(relay_line(line) for line in proc.stdout)
    try:
        rc = proc.wait(GRANDCHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    if rc != 0 or count == 0:
        print(f"sandgate-probes: grandchild exited {rc} after {count} records", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DaemonFiles:
    partial: Path  # written while the daemon probes run
    done: Path  # the same file once complete (os.replace: the parent never sees half a file)
    heartbeat: Path
    log: Path  # the daemon's stderr

    @classmethod
    def of(cls, spec: VerifySpec) -> DaemonFiles:
        results, stem = Path(spec.results_dir), f"daemon-{spec.daemon_token}"
        return cls(*(results / f"{stem}{ext}" for ext in (".jsonl", ".done.jsonl", ".heartbeat", ".log")))


def set_process_name(name: str) -> None:
    """prctl(PR_SET_NAME): the comm shown by ps / /proc/<pid>/comm (15 bytes at most)."""
    fresh_libc().prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def heartbeat(spec: VerifySpec, path: Path, duration: float = HEARTBEAT_DURATION) -> None:
    """Every HEARTBEAT_INTERVAL s: try allowed_ip:80 and append 'alive <time> <ok|fail>' to `path`."""
    end = time.monotonic() + duration
    target = (spec.allowed_ip, 80)
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            with socket.create_connection(target, timeout=HEARTBEAT_INTERVAL * 0.8):
                ok = "ok"
        except OSError:
            ok = "fail"
        try:
            with open(path, "a") as f:
                f.write(f"alive {time.time():.3f} {ok}\n")
        except OSError:
            pass  # keep trying: the orchestrator looks for writes after the run
        time.sleep(max(0.0, HEARTBEAT_INTERVAL - (time.monotonic() - start)))


def daemon_role(spec: VerifySpec, only: list[str] | None) -> None:
    """What the (already detached) daemon does: probes -> results file -> rename -> name -> heartbeat."""
    files = DaemonFiles.of(spec)
    with open(files.partial, "w") as f:
        for rec in run_probes(spec, "daemon", only):
            emit(rec, f)
    os.replace(files.partial, files.done)
    set_process_name(spec.daemon_token)
    heartbeat(spec, files.heartbeat)


def spawn_daemon(spec_path: str, spec: VerifySpec, only: list[str] | None) -> None:
    """Double fork + setsid, stdio away from the command, then exec the runner as the daemon.

    The exec gives the daemon a fresh interpreter and puts its token on its command line, so
    both `ps -o comm` (PR_SET_NAME) and `pgrep -f TOKEN` find it.
    """
    files = DaemonFiles.of(spec)
    argv = [*runner_argv(spec_path, spec, "daemon", only), "--tag", spec.daemon_token]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the intermediate: new session, fork the daemon, exit
        code = 1
        try:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                log = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(null, 0)
                os.dup2(null, 1)
                os.dup2(log, 2)
                os.execv(argv[0], argv)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def relay_daemon(spec: VerifySpec, wait: float = DAEMON_WAIT) -> int:
    """Wait up to `wait` s for the daemon's finished results and relay them; the number relayed."""
    files = DaemonFiles.of(spec)
    deadline = time.monotonic() + wait
    while not files.done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not files.done.exists():
        print(f"sandgate-probes: no daemon results ({files.done}) within {wait:g} s", file=sys.stderr, flush=True)
        return 0
    return sum(relay_line(line) for line in files.done.read_text().splitlines())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m selftest.probes", description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", help="SPEC.json written by `sandgate verify`")
    ap.add_argument(
        "--context",
        choices=CONTEXTS,
        default="child",
        help="child (default): run, then spawn the grandchild and the daemon; "
        "grandchild: run only; daemon: run into the results file, then heartbeat",
    )
    ap.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="only this probe or group (repeatable); default: the spec's 'only'",
    )
    ap.add_argument("--no-spawn", action="store_true", help="child: no grandchild, no daemon")
    ap.add_argument("--tag", help="ignored: puts the daemon token on the daemon's command line")
    ap.add_argument("--list", action="store_true", help="print the probe list as JSON lines and exit")
    args = ap.parse_args(argv)
    if args.list:
        for group, name, expected in probe_list():
            emit({"group": group, "probe": name, "expected": expected, "threat": REGISTRY[name].threat})
        return 0
    if args.spec is None:
        ap.error("SPEC is required")
    try:
        spec = load_spec(Path(args.spec).read_text())
        only = args.only or list(spec.only) or None
        select_probes(args.context, only)
    except (OSError, ValueError) as e:
        print(f"sandgate-probes: {args.spec}: {e}", file=sys.stderr)
        return 2
    if args.context == "daemon":
        daemon_role(spec, only)
        return 0
    for rec in run_probes(spec, args.context, only):
        emit(rec)
    if args.context == "child" and not args.no_spawn:
        run_grandchild(args.spec, spec, only)
        spawn_daemon(args.spec, spec, only)
        relay_daemon(spec)
    return 0
