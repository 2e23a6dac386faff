"""The notice channel to the agent (issue 27 item 5), end to end in a World.

An agent-like script inside reads $SANDGATE_NOTICES while it runs, makes an allowed and a denied
request, and finds one JSON line for the denied host with the `--allow` that would fix it before
it exits; every way it tries to write, truncate or replace the file fails (EROFS/EACCES/EBUSY) and
the line is still there afterwards. The fake servers are the evidence: the blocked one saw
nothing, the allowed one the request. Without --notices there is no variable and no file (even
when the caller's environment names one). Two runs at once in one workspace, one audit log, each
see only their own denial. The throwaway unprivileged user gets the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.rootless import UnprivilegedUser
from ..support.runner import Sandgate, env, write_policy
from ..support.threehosts import POLICY, ThreeHosts, three_hosts

ALLOWED, BLOCKED, BLOCKED2 = "198.51.100.30", "198.51.100.31", "198.51.100.32"
INSIDE = "/dev/sandgate-notices"
REFUSED = {"EROFS", "EACCES", "EBUSY"}

#: The agent: requests, then reads its notices until its denial is there, then tries to forge them.
AGENT = r"""
import errno, json, os, subprocess, sys, time

path = os.environ.get("SANDGATE_NOTICES")
host = sys.argv[1]

def curl(url):
    return subprocess.run(["curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", url],
                          capture_output=True, text=True).stdout

def read():
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]

codes = [curl("http://allowed.test/"), curl(f"http://{host}/")]
seen, deadline = [], time.monotonic() + 15
while path and time.monotonic() < deadline and not any(n["host"] == host for n in seen):
    time.sleep(0.05)
    seen = read()

def reopen():
    fd = os.open(path, os.O_RDONLY)
    os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)

tries = {}
for name, act in {
    "append": lambda: os.open(path, os.O_WRONLY | os.O_APPEND),
    "trunc": lambda: os.open(path, os.O_WRONLY | os.O_TRUNC),
    "truncate": lambda: os.truncate(path, 0),
    "reopen": reopen,
    "chmod": lambda: os.chmod(path, 0o666),
    "unlink": lambda: os.unlink(path),
    "rename": lambda: os.rename(path, path + "-moved"),
    "plant": lambda: open(path + "-forged", "w"),
}.items():
    if path is None:
        break
    try:
        act()
        tries[name] = "ok"
    except OSError as e:
        tries[name] = errno.errorcode.get(e.errno, str(e.errno))
if len(sys.argv) > 2:
    sys.stdin.readline()  # the test says when both runs have been denied
print(json.dumps({"env": path, "codes": codes, "seen": seen, "tries": tries, "after": read() if path else None}))
"""


@dataclass
class Env(ThreeHosts):
    agent: Path


@pytest.fixture(scope="module")
def e() -> Iterator[Env]:
    with three_hosts((ALLOWED, BLOCKED, BLOCKED2)) as h:
        agent = h.world.tmp / "sandgate-agent.py"
        agent.write_text(AGENT)
        agent.chmod(0o644)
        yield Env(h.world, h.sg, h.servers, agent)


def _result(stdout: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return got


def _check_agent(got: dict[str, Any], host: str, task: str) -> None:
    """The one notice for `host`, as the agent read it while running, and every forgery refused."""
    assert got["env"] == INSIDE and got["codes"] == ["200", "403"], got
    mine = [n for n in got["seen"] if n["host"] == host]
    assert len(mine) == 1, got["seen"]
    n = mine[0]
    assert (n["kind"], n["port"], n["allow"], n["task"]) == ("destination", 80, f"--allow {host}", task), n
    assert n["reason"] == "no allow rule matches" and n["message"].startswith(f"sandgate: denied {host}:80")
    assert not any(x["host"] == "allowed.test" for x in got["seen"])  # an allowed request is no notice
    assert all(v in REFUSED for v in got["tries"].values()), json.dumps(got["tries"])
    assert {got["tries"][k] for k in ("append", "trunc", "truncate", "reopen")} <= {"EROFS", "EACCES"}, got["tries"]
    assert got["after"][: len(got["seen"])] == got["seen"], got["after"]  # still there, unchanged


def _denial(audit: Path, host: str) -> dict[str, Any] | None:
    if not audit.exists():
        return None
    found = [r for r in read_records(audit) if r["event"] == "decision" and r["action"] == "deny" and r["host"] == host]
    return dict(found[0]) if found else None


def test_the_agent_reads_its_denial_while_it_runs_and_cannot_forge_it(e: Env) -> None:
    before = {n: e.seen(n) for n in e.servers}
    audit = e.audit()
    r = e.sg.run("--notices", cmd=["python3", str(e.agent), "blocked.test"], audit=audit)
    assert r.returncode == 0, r.stderr
    record = _denial(audit, "blocked.test")
    assert record is not None
    got = _result(r.stdout)
    _check_agent(got, "blocked.test", record["task"])
    assert [n["ts"] for n in got["seen"] if n["host"] == "blocked.test"] == [record["ts"]]
    assert e.seen("blocked") == before["blocked"] and e.seen("allowed") > before["allowed"]
    assert "sandgate: denied blocked.test:80" in r.stderr  # the terminal's line stays


def test_without_notices_there_is_no_variable_and_no_file(e: Env) -> None:
    look = f'echo "${{SANDGATE_NOTICES-unset}}"; test -e {INSIDE} && echo present || echo absent'
    caller = {**env(), "SANDGATE_NOTICES": "/etc/hostname"}  # the caller's own: never passed on
    off = e.sg.run(cmd=["sh", "-c", look], audit=e.audit(), env=caller)
    on = e.sg.run("--notices", cmd=["sh", "-c", look], audit=e.audit(), env=caller)
    assert off.returncode == 0 and off.stdout.split() == ["unset", "absent"], (off.stdout, off.stderr)
    assert on.returncode == 0 and on.stdout.split() == [INSIDE, "present"], (on.stdout, on.stderr)


def _start(e: Env, host: str, audit: Path) -> subprocess.Popen[str]:
    return e.sg.popen(
        "--notices",
        cmd=["python3", str(e.agent), host, "wait"],
        audit=audit,
        quiet=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_runs_at_once_in_one_workspace_see_only_their_own(e: Env) -> None:
    before = (e.seen("blocked"), e.seen("blocked2"))
    audit = e.audit()  # one log for both: the follower picks each run's records by its task
    one, two = _start(e, "blocked.test", audit), _start(e, "blocked2.test", audit)
    try:
        deadline = time.monotonic() + 30
        while not (_denial(audit, "blocked.test") and _denial(audit, "blocked2.test")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # five polls of each follower: the other's denial had its chance to show
        assert one.poll() is None and two.poll() is None
    finally:
        out_one, err_one = one.communicate("go\n", timeout=30)
        out_two, err_two = two.communicate("go\n", timeout=30)
    a, b = _denial(audit, "blocked.test"), _denial(audit, "blocked2.test")
    assert a is not None and b is not None and a["task"] != b["task"]
    got_one, got_two = _result(out_one), _result(out_two)
    _check_agent(got_one, "blocked.test", a["task"])
    _check_agent(got_two, "blocked2.test", b["task"])
    assert [n["host"] for n in got_one["after"]] == ["blocked.test"], got_one["after"]
    assert [n["host"] for n in got_two["after"]] == ["blocked2.test"], got_two["after"]
    assert "sandgate: denied" not in err_one + err_two  # -q: the terminal is quiet, the notices are not
    assert (e.seen("blocked"), e.seen("blocked2")) == before


def test_rootless_the_agent_reads_its_notices_too(e: Env, unprivileged: UnprivilegedUser) -> None:
    """The throwaway user (no sudo): its runtime directory under /tmp, its own launcher appending."""
    e.world.tmp.chmod(0o755)  # the user reads the policy and the agent here
    policy = write_policy(e.world, POLICY, "rootless")
    policy.chmod(0o644)
    work = unprivileged.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, unprivileged.uid, unprivileged.gid)
    sg = Sandgate(unprivileged.runner(e.world), policy=policy, cwd=work, env={**env(), "HOME": str(unprivileged.home)})
    agent = work / e.agent.name  # the world's directory is under the host's /tmp: not seen inside
    agent.write_text(AGENT)
    before = e.seen("blocked")
    audit = work / "audit.jsonl"
    r = sg.run("--notices", cmd=["python3", str(agent), "blocked.test"], audit=audit)
    assert r.returncode == 0, r.stderr
    record = _denial(audit, "blocked.test")
    assert record is not None
    _check_agent(_result(r.stdout), "blocked.test", record["task"])
    assert e.seen("blocked") == before
