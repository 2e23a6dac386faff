"""One proxy daemon, many sandboxes (issue 9): separate policies, fail closed together, no leftovers.

sandgate runs inside a test World; the daemon it starts lives there and dies with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.runner import SANDGATE, Sandgate, env, write_policy
from ..support.world import World, new_world

A_HOST, A_IP, B_HOST, B_IP = "a.test", "198.51.100.31", "b.test", "198.51.100.32"


@pytest.fixture(scope="module")
def w() -> Iterator[World]:
    with new_world() as world:
        for name, ip in ((A_HOST, A_IP), (B_HOST, B_IP)):
            world.add_host(name, ip)
            world.serve("http", ip, 80, name)
        yield world


def status(w: World) -> dict[str, object]:
    r = w.run([*SANDGATE, "daemon", "status", "--json"], cwd=w.tmp, env=env())
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def bindings(w: World) -> int:
    """How many sandboxes the daemon serves; -1 while none is running (a cold one is starting)."""
    r = w.run([*SANDGATE, "daemon", "status", "--json"], cwd=w.tmp, env=env())
    return len(json.loads(r.stdout)["bindings"]) if r.returncode == 0 else -1


def wait_for(pred: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.1)
    assert pred(), "timed out"  # type: ignore[operator]


def start(w: World, name: str, allow: str, script: str) -> tuple[subprocess.Popen[str], Path]:
    policy = write_policy(w, f"version: 1\nnetwork:\n  allow: [{allow}]\n", f"pol-{name}")
    audit = w.tmp / f"audit-{name}-{time.monotonic_ns()}.jsonl"
    p = Sandgate(w, policy=policy, audit=audit, cwd=w.tmp).popen(
        cmd=["sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return p, audit


def curl(host: str) -> str:
    return f"curl -s -m 5 -o /dev/null -w '{host}=%{{http_code}}\\n' http://{host}/"


def test_two_concurrent_runs_get_their_own_policy_from_one_daemon(w: World) -> None:
    go = w.tmp / f"go-{time.monotonic_ns()}"
    script = f"while [ ! -e {go} ]; do sleep 0.05; done; {curl(A_HOST)}; {curl(B_HOST)}"
    pa, audit_a = start(w, "a", A_HOST, script)
    pb, audit_b = start(w, "b", B_HOST, script)
    try:
        wait_for(lambda: bindings(w) == 2)
        pid = status(w)["pid"]
        go.touch()
        out_a, _ = pa.communicate(timeout=30)
        out_b, _ = pb.communicate(timeout=30)
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                p.kill()
    assert out_a.split() == [f"{A_HOST}=200", f"{B_HOST}=403"], out_a
    assert out_b.split() == [f"{A_HOST}=403", f"{B_HOST}=200"], out_b
    assert status(w)["pid"] == pid  # one daemon served both
    for audit, allowed, denied in ((audit_a, A_HOST, B_HOST), (audit_b, B_HOST, A_HOST)):
        recs: list[Any] = read_records(audit)
        got = {(r["host"], r["action"]) for r in recs if r["event"] == "decision" and r["kind"] == "http"}
        assert got == {(allowed, "allow"), (denied, "deny")}, got  # each log holds only its own run


def test_killing_the_daemon_fails_every_sandbox_closed_and_each_launcher_says_so(w: World) -> None:
    go = w.tmp / f"go-{time.monotonic_ns()}"
    script = (
        f"{curl(A_HOST)}; while [ ! -e {go} ]; do sleep 0.05; done; {curl(A_HOST)}; "
        f"getent hosts {A_HOST} || echo dns=failed"
    )
    runs = [start(w, f"k{i}", A_HOST, script) for i in range(2)]
    try:
        wait_for(lambda: bindings(w) == 2)
        os.kill(int(str(status(w)["pid"])), signal.SIGKILL)
        time.sleep(0.3)
        go.touch()
        outs = [p.communicate(timeout=30) for p, _ in runs]
    finally:
        for p, _ in runs:
            if p.poll() is None:
                p.kill()
    for out, err in outs:
        lines = out.split()
        assert lines[0] == f"{A_HOST}=200" and lines[1] == f"{A_HOST}=000" and "dns=failed" in lines, out
        assert "the proxy daemon exited" in err and "fail closed" in err, err


def test_a_fresh_daemon_is_started_on_demand_and_stops_on_request(w: World) -> None:
    r = w.run([*SANDGATE, "daemon", "stop"], cwd=w.tmp, env=env())
    assert r.returncode == 0
    r = w.run([*SANDGATE, "daemon", "status"], cwd=w.tmp, env=env())
    assert r.returncode == 3 and "no daemon running" in r.stderr
    pol = write_policy(w, f"version: 1\nnetwork:\n  allow: [{A_HOST}]\n", "ondemand")
    sg = Sandgate(w, policy=pol, audit=w.tmp / "od.jsonl", quiet=True, cwd=w.tmp)
    r = sg.run(cmd=["sh", "-c", curl(A_HOST)])
    assert r.stdout.split() == [f"{A_HOST}=200"], r.stderr  # the first request waited for the cold daemon
    st = status(w)
    assert st["bindings"] == []  # the run ended: its binding is gone
    r = w.run([*SANDGATE, "daemon", "stop"], cwd=w.tmp, env=env())
    assert r.returncode == 0 and "stopped" in r.stderr
    wait_for(lambda: subprocess.run(["kill", "-0", str(st["pid"])], capture_output=True).returncode != 0)


def test_cleanup_removes_a_dead_daemons_socket(w: World) -> None:
    assert w.run([*SANDGATE, "daemon", "start"], cwd=w.tmp, env=env()).returncode == 0
    ino = w.run(["stat", "-L", "-c", "%i", "/proc/self/ns/net"]).stdout.strip()
    (sock,) = Path("/run/sandgate").glob(f"daemon-{ino}-*.sock")
    os.kill(int(str(status(w)["pid"])), signal.SIGKILL)
    wait_for(lambda: bindings(w) == -1)
    assert sock.exists()  # SIGKILL: no chance to remove it
    r = w.run([*SANDGATE, "cleanup"], cwd=w.tmp, env=env())
    assert r.returncode == 0 and f"removed dead daemon socket {sock}" in r.stderr, r.stderr
    assert not sock.exists()


def test_a_stop_right_after_a_cold_run_finds_the_daemon_that_run_started(w: World) -> None:
    """A cold run does not wait for its daemon (it spawns it first thing, launcher/prestart.py): a `daemon
    stop` at once after it must still find that daemon, never leave it running unseen for its idle time."""
    assert w.run([*SANDGATE, "daemon", "stop"], cwd=w.tmp, env=env()).returncode == 0
    assert bindings(w) == -1  # cold
    r = Sandgate(w, audit=w.tmp / "cold-true.jsonl", quiet=True, cwd=w.tmp).run(cmd=["true"])
    assert r.returncode == 0, r.stderr
    r = w.run([*SANDGATE, "daemon", "stop"], cwd=w.tmp, env=env())
    assert r.returncode == 0 and "daemon stopped" in r.stderr, r.stderr  # not "no daemon running"
    wait_for(lambda: bindings(w) == -1)


def test_a_run_that_fails_on_its_policy_leaves_no_daemon_behind(w: World) -> None:
    """`sandgate run` spawns a cold daemon first thing (launcher/prestart.py); a run refused before its
    sandbox exists stops that daemon again instead of leaving it to serve nobody for its idle time."""
    assert w.run([*SANDGATE, "daemon", "stop"], cwd=w.tmp, env=env()).returncode == 0
    bad = write_policy(w, 'version: 1\nnetwork:\n  allow: ["*"]\n', "bad")
    r = Sandgate(w, policy=bad, quiet=True, cwd=w.tmp).run(cmd=["true"])
    assert r.returncode == 125 and "sandgate: error:" in r.stderr, r.stderr
    no_daemon_for_a_while(w)
    r = w.run([*SANDGATE, "run", "--no-such-option", "--", "true"], cwd=w.tmp, env=env())  # refused by the CLI
    assert r.returncode == 125 and "unrecognized arguments" in r.stderr, r.stderr
    no_daemon_for_a_while(w)
    good = write_policy(w, f"version: 1\nnetwork:\n  allow: [{A_HOST}]\n", "good")
    r = Sandgate(w, policy=good, quiet=True, cwd=w.tmp).run(cmd=["sh", "-c", curl(A_HOST)])
    assert r.stdout.split() == [f"{A_HOST}=200"], r.stderr  # and the next run starts one as ever


def no_daemon_for_a_while(w: World) -> None:
    """A daemon left behind would be up within ~0.2 s: none answers for 1.5 s."""
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert bindings(w) == -1
        time.sleep(0.1)


def test_daemon_stop_also_stops_an_older_sandgates_daemon_of_this_netns(w: World) -> None:
    """An upgrade changes the daemon's socket name (its code id): the old daemon must not outlive a `daemon
    stop` that says it stopped every daemon, serving nobody until its idle exit."""
    assert w.run([*SANDGATE, "daemon", "start"], cwd=w.tmp, env=env()).returncode == 0
    ino = w.run(["stat", "-L", "-c", "%i", "/proc/self/ns/net"]).stdout.strip()
    (current,) = Path("/run/sandgate").glob(f"daemon-{ino}-*.sock")
    older = current.with_name(f"daemon-{ino}-0000000000.sock")  # what an older code id names
    old = w.popen(
        [SANDGATE[0], "-m", "netguard.daemon", "--socket", str(older)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: older.exists())
        r = w.run([*SANDGATE, "daemon", "stop"], cwd=w.tmp, env=env())
        assert r.returncode == 0, r.stderr
        assert "sandgate: daemon stopped\n" in r.stderr and f"an older sandgate's, {older}" in r.stderr, r.stderr
        assert old.wait(20) == 0  # the older daemon exited by itself, asked to
        wait_for(lambda: bindings(w) == -1)  # and this sandgate's too
        assert not older.exists()
    finally:
        if old.poll() is None:
            old.kill()
            old.wait(5)
        older.unlink(missing_ok=True)
