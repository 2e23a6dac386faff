"""A warm `sandgate run` served by the fork server (launcher/forkserver/, issue 25), tried the way it is
used: beside the full path, signalled, killed, many at once, beside a hostile sandbox, after a change.

Each test warms its world up until a run is served (SANDGATE_TIMINGS=1 shows the worker's "forked"
stamp), then compares with SANDGATE_FORKSERVER=0, the launcher's own full path, in the same world.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..support.daemonfake import REPO, eventually
from ..support.runner import Sandgate, env
from ..support.world import World

TIMED = {"SANDGATE_TIMINGS": "1"}
FULL = {"SANDGATE_FORKSERVER": "0"}


def served(r: subprocess.CompletedProcess[str]) -> bool:
    return "sandgate-timing forked " in r.stderr


def plain(stderr: str) -> str:
    """stderr without the timing stamps."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("sandgate-timing"))


def warm(sg: Sandgate, extra: dict[str, str] | None = None) -> None:
    """Run until a run is served: the first starts the daemon, a warm one the fork server."""
    for _ in range(40):
        if served(sg.run(cmd=["true"], env={**env(), **(extra or {}), **TIMED})):
            return
        time.sleep(0.2)
    pytest.fail("no run was served by a fork server")


def servers(world: World) -> list[int]:
    """The fork servers living in the world's network namespace."""
    pids = subprocess.run(["ip", "netns", "pids", world.ns], capture_output=True, text=True, check=True).stdout.split()
    out = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"launcher.forkserver" in cmdline:
            out.append(int(pid))
    return out


@pytest.fixture
def sg(world: World) -> Sandgate:
    (world.tmp / "ws").mkdir()
    return Sandgate(world, quiet=True, cwd=world.tmp / "ws", timeout=60)


SHOW = (
    'printf "%s|" "$@"; echo; pwd; umask; echo "FOO=$FOO"; cat; echo to-stderr >&2; '
    "test -t 0 && echo tty || echo no-tty; exit 7"
)


def test_a_served_run_is_the_full_paths_run(world: World, sg: Sandgate) -> None:
    warm(sg)
    results = {}
    for name, extra in (("served", TIMED), ("full", {**TIMED, **FULL})):
        line = ["sh", "-c", 'umask 027; exec "$@"', "sh", *sg.argv(cmd=["sh", "-c", SHOW, "sh", "a b", "", "c\nd"])]
        results[name] = world.run(
            line, input="from-stdin\n", cwd=world.tmp / "ws", env={**env(), **extra, "FOO": "bar baz"}, timeout=60
        )
    s, f = results["served"], results["full"]
    assert served(s) and not served(f)
    assert (s.returncode, s.stdout, plain(s.stderr)) == (f.returncode, f.stdout, plain(f.stderr))
    assert s.returncode == 7
    assert s.stdout.splitlines() == [
        "a b||c",
        "d|",
        str(world.tmp / "ws"),
        "0027",
        "FOO=bar baz",
        "from-stdin",
        "no-tty",
    ]
    assert "to-stderr" in s.stderr


def test_signals_sent_to_sandgate_reach_the_command(world: World, sg: Sandgate) -> None:
    warm(sg)
    script = 'trap "echo got-$1; exit 9" "$1"; echo ready; sleep 30 & wait'
    for sig, name in ((signal.SIGTERM, "TERM"), (signal.SIGINT, "INT"), (signal.SIGHUP, "HUP")):
        p = sg.popen(
            cmd=["sh", "-c", script, "sh", name],
            env={**env(), **TIMED},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        assert "sandgate-timing forked" in err, err  # served
        assert (p.returncode, out) == (9, f"got-{name}\n"), err


def test_a_killed_caller_takes_its_run_down(world: World, sg: Sandgate) -> None:
    warm(sg)
    token = "1234.5"  # a sleep nobody else runs
    p = sg.popen(
        cmd=["sh", "-c", f"echo ready; exec sleep {token}"],
        env={**env(), **TIMED},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"

    def alive() -> bool:
        return subprocess.run(["pgrep", "-f", f"sleep {token}"], capture_output=True).returncode == 0

    assert alive()
    p.kill()  # SIGKILL: nothing of sandgate's may handle it
    p.wait(timeout=10)
    assert eventually(lambda: not alive(), timeout=10), "the command outlived its killed sandgate"
    assert servers(world), "the fork server itself lives on"
    runs = Path("/run/sandgate/runs")
    stale = [f for f in runs.glob("*.json") if not Path(f"/proc/{json.loads(f.read_text())['pid']}").exists()]
    assert stale  # what the SIGKILLed worker left, as a SIGKILLed launcher leaves it
    assert sg.run(cmd=["true"]).returncode == 0  # the next run sweeps it
    assert not any(f.exists() for f in stale)


def test_many_served_runs_at_once_each_get_their_own_status(world: World, sg: Sandgate) -> None:
    warm(sg)
    procs = [
        sg.popen(
            cmd=["sh", "-c", 'echo "run $1"; exit "$1"', "sh", str(i)],
            env={**env(), **TIMED},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(10)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == list(range(10))
    assert [o for o, _ in outs] == [f"run {i}\n" for i in range(10)]
    assert sum("sandgate-timing forked" in e for _, e in outs) >= 5  # most served (a slow accept takes the full path)


HOSTILE = """
import os, socket, sys
seen = sorted(os.listdir(sys.argv[1])) if os.path.isdir(sys.argv[1]) else "absent"
print("listing", seen)
for path in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as e:
        print("refused", type(e).__name__)
"""


def test_no_sandbox_reaches_a_fork_server_while_an_honest_run_is_served(world: World, sg: Sandgate) -> None:
    warm(sg)
    socks = sorted(str(p) for p in Path("/run/sandgate").glob("fork-*.sock"))
    assert socks
    honest = sg.popen(
        cmd=["sh", "-c", "sleep 1; echo honest"],
        env={**env(), **TIMED},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    hostile = sg.run(cmd=["python3", "-c", HOSTILE, "/run/sandgate", *socks], env={**env(), **TIMED})
    out, err = honest.communicate(timeout=60)
    assert (honest.returncode, out) == (0, "honest\n") and "sandgate-timing forked" in err
    assert served(hostile) and hostile.returncode == 0, hostile.stderr
    assert "listing []" in hostile.stdout  # the runtime directory: an empty tmpfs in every sandbox
    assert "CONNECTED" not in hostile.stdout and hostile.stdout.count("refused FileNotFoundError") == len(socks)


def test_a_caller_in_another_context_is_not_served_by_this_server(world: World, sg: Sandgate) -> None:
    warm(sg)
    line = ["sh", "-c", 'ulimit -n 1000; exec "$@"', "sh", *sg.argv(cmd=["true"])]
    r = world.run(line, cwd=world.tmp / "ws", env={**env(), **TIMED}, timeout=60)
    assert r.returncode == 0 and not served(r)  # its limits would not be the run's: the full path
    assert served(sg.run(cmd=["true"], env={**env(), **TIMED}))  # the first context still is


def test_daemon_stop_stops_the_fork_server(world: World, sg: Sandgate) -> None:
    warm(sg)
    pids = servers(world)
    assert pids
    r = world.run([*_sandgate(), "daemon", "stop"], env=env(), timeout=30)
    assert r.returncode == 0 and "fork servers stopped" in r.stderr, r.stderr
    assert eventually(lambda: not any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids), timeout=10)
    assert not served(sg.run(cmd=["true"], env={**env(), **TIMED}))


def test_a_change_to_the_code_ends_the_server_before_it_serves_stale_code(world: World, sg: Sandgate) -> None:
    tree = world.tmp / "tree"
    for part in ("launcher", "fsguard", "netguard", "sgbase", "allowlists"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    other = {"PYTHONPATH": str(tree)}
    warm(sg, other)
    pids = [p for p in servers(world) if str(tree).encode() in Path(f"/proc/{p}/environ").read_bytes()]
    assert pids
    with open(tree / "launcher" / "errors.py", "a") as f:
        f.write("# changed\n")
    r = sg.run(cmd=["true"], env={**env(), **other, **TIMED})
    assert r.returncode == 0 and not served(r)  # the full path, with the new code
    assert eventually(lambda: not any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids), timeout=10)


ROOTLESS = """
mkdir -p proj && cd proj || exit 1
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    SANDGATE_TIMINGS=1 "$@" true 2>&1 | grep -q "sandgate-timing forked" && break
    sleep 0.2
done
SANDGATE_TIMINGS=1 "$@" sh -c 'id -u; exit 3' 2>timings
echo "status $?"; grep -v "^sandgate-timing" timings >&2
grep -c "sandgate-timing forked" timings
"""


def test_the_throwaway_user_is_served_too(world: World, unprivileged: object) -> None:
    from ..support.rootless import UnprivilegedUser

    assert isinstance(unprivileged, UnprivilegedUser)
    runner = unprivileged.runner(world)
    # One helper process for all the runs: each of its invocations makes a mount namespace with fresh
    # covers (another view, so another key), as a context made anew per command would.
    line = Sandgate(runner, quiet=True, view=False).argv(cmd=None)
    r = runner.run(["sh", "-c", ROOTLESS, "sh", *line, "--"], cwd=unprivileged.home, env=env(), timeout=120)
    assert r.stdout.split() == [str(unprivileged.uid), "status", "3", "1"], r.stdout + r.stderr


def _sandgate() -> list[str]:
    from ..support.runner import SANDGATE

    return list(SANDGATE)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
