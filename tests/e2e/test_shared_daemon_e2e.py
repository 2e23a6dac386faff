"""One user, many sandboxes, one daemon (issue 22): no sandbox uses a daemon's control protocol or starves the others.

Judged by what the fake upstreams saw, by the daemons' own answers and logs, and by the audit logs;
every blocked case has its permitted twin in the same run (an honest sandbox beside the hostile one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records
from selftest.servers import Server

from ..support.rootless import UnprivilegedUser, UserRunner
from ..support.runner import REPO, Sandgate, env, write_policy
from ..support.world import World, new_world

OK_HOST, OK_IP, BLOCKED_HOST, BLOCKED_IP = "ok.test", "198.51.100.41", "blocked.test", "198.51.100.42"

#: Run inside a sandbox with this checkout's interpreter: sandgate's own control client against a socket.
ATTACK = r"""
import json, os, socket, sys
from netguard.policy import parse_network
from netguard.daemon.control import ControlClient, ControlError
from netguard.spec import BindingSpec
path, blocked, audit = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
for op in ("status", "bind", "stop"):
    try:
        with ControlClient.connect(path, timeout=5) as c:
            if op == "bind":  # a policy of our choosing, on listeners we made ourselves on loopback
                socks = [socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0)),
                         socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.create_server(("127.0.0.1", 0))]
                socks[2].bind(("127.0.0.1", 0))
                fd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                spec = BindingSpec("evil", parse_network({"allow": [{"host": blocked, "ports": [80]}]}, "evil.yaml"))
                c.bind(spec, [fd, *(s.fileno() for s in socks)])
                s = socket.create_connection(("127.0.0.1", socks[0].getsockname()[1]), timeout=3)
                s.sendall(f"GET http://{blocked}/ HTTP/1.1\r\nHost: {blocked}\r\n\r\n".encode())
                out[op] = "bound: " + s.recv(100).decode(errors="replace")
            else:
                out[op] = "answered: " + str(getattr(c, op)())
    except (ControlError, OSError) as e:
        out[op] = f"refused: {e}"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def w() -> Iterator[World]:
    with new_world() as world:
        for name, ip in ((OK_HOST, OK_IP), (BLOCKED_HOST, BLOCKED_IP)):
            world.add_host(name, ip)
        world.tmp.chmod(0o755)  # the unprivileged side reads the policy here
        yield world


@pytest.fixture(scope="module")
def servers(w: World) -> dict[str, Server]:
    return {OK_HOST: w.serve("http", OK_IP, 80, OK_HOST), BLOCKED_HOST: w.serve("http", BLOCKED_IP, 80, BLOCKED_HOST)}


@pytest.fixture(scope="module")
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser() as u:
        yield u


@dataclass
class Side:
    """Who runs sandgate (root, or the throwaway user) and where its files live."""

    name: str
    runner: World | UserRunner
    work: Path
    uid: int


@pytest.fixture(scope="module", params=["root", "user"])
def side(request: pytest.FixtureRequest, w: World) -> Side:
    if request.param == "root":
        work = w.tmp / "root-work"
        work.mkdir(exist_ok=True)
        return Side("root", w, work, 0)
    u: UnprivilegedUser = request.getfixturevalue("user")
    work = u.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, u.uid, u.gid)
    return Side("user", u.runner(w), work, u.uid)


def policy(w: World, name: str) -> Path:
    p = write_policy(w, f"version: 1\nnetwork:\n  allow: [{OK_HOST}]\n", name)
    p.chmod(0o644)
    return p


def other_daemon(side: Side) -> tuple[subprocess.Popen[Any], Path]:
    """A second daemon of the same user, as a login session's runtime directory would hold it."""
    rt = side.work / f"other-rt-{time.monotonic_ns()}"
    rt.mkdir(mode=0o700)
    os.chown(rt, side.uid, side.uid if side.uid else 0)
    sock = rt / "d.sock"
    argv = [sys.executable, "-m", "netguard.daemon", "--socket", str(sock), "--idle-exit", "120"]
    log = open(rt / "daemon.log", "wb")  # noqa: SIM115  # the daemon writes it until it is stopped
    os.chown(rt / "daemon.log", side.uid, side.uid if side.uid else 0)
    proc = side.runner.popen(argv, cwd=str(REPO), env={**env(), "PYTHONPATH": str(REPO)}, stdout=log, stderr=log)
    log.close()
    return proc, sock


def ask_outside(side: Side, sock: Path, op: str = "status") -> str:
    """The same client as a launcher beside the sandbox: the permitted twin of the attack."""
    code = f"from netguard.daemon.control import ControlClient as C; print(C.connect({str(sock)!r}).{op}())"
    r = side.runner.run([sys.executable, "-c", code], cwd=str(REPO), env={**env(), "PYTHONPATH": str(REPO)})
    return str(r.stdout.strip() or r.stderr.strip())


def wait(pred: Any, timeout: float = 20) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return bool(pred())


def test_a_sandbox_can_neither_bind_nor_stop_another_daemon_of_its_user(
    w: World, servers: dict[str, Server], side: Side
) -> None:
    proc, sock = other_daemon(side)
    assert wait(lambda: "'ok': True" in ask_outside(side, sock)), ask_outside(side, sock)
    before = len(servers[BLOCKED_HOST].log_records())
    audit = side.work / f"audit-{side.name}-{time.monotonic_ns()}.jsonl"
    script = f"curl -s -m 5 -o /dev/null -w 'ok=%{{http_code}}\\n' http://{OK_HOST}/; "
    script += f'{sys.executable} -c "$ATTACK" {sock} {BLOCKED_HOST} {side.work}/evil-{side.name}.jsonl'
    sg = Sandgate(side.runner, policy=policy(w, f"p22-{side.name}"), audit=audit, cwd=side.work, timeout=60)
    r = sg.run(cmd=["sh", "-c", script], env={**env(), "ATTACK": ATTACK})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "ok=200", r.stdout  # the honest part of the same run is served
    got = json.loads(lines[-1])
    for op in ("status", "bind", "stop"):
        assert got[op].startswith("refused:"), got
        assert "another user namespace" in got[op] and "only a launcher outside every sandbox" in got[op], got
    log = (sock.parent / "daemon.log").read_text()
    assert log.count("refused a control connection") == 3 and "bind task=evil" not in log, log
    assert "'ok': True" in ask_outside(side, sock)  # not stopped: a launcher beside it is still served
    assert len(servers[BLOCKED_HOST].log_records()) == before  # no byte reached the denied host
    recs: list[Any] = read_records(audit)
    assert [r["host"] for r in recs if r["event"] == "decision"] == [OK_HOST]
    ask_outside(side, sock, "stop")
    proc.wait(timeout=20)


# ---- fair share: a hostile sandbox beside an honest one -----------------------------------------

HOG = r"""
import os, resource, socket, sys, time
n, target, ready, go = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 100), hard))
held = []
for _ in range(n):  # silent connections: never a byte, so nothing can be decided
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((target, 80))
    held.append(s)
open(ready, "w").close()
end = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < end:
    time.sleep(0.05)
"""

STREAM = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=10)
s.sendall(f"GET / HTTP/1.1\r\nHost: {sys.argv[1]}\r\n".encode())
line, sent = b"X-Fill: " + b"a" * 1000 + b"\r\n", 0
try:
    while sent < 200 << 20:  # an endless head, as far as the proxy can tell: 200 MiB at most
        s.sendall(line * 64)
        sent += len(line) * 64
except OSError:
    pass
try:
    got = s.recv(100)
except OSError:
    got = b""
print(sent, got[:12].decode())
"""


def daemon_rss_kib(w: World) -> int:
    r = w.run([sys.executable, "-m", "launcher.cli", "daemon", "status", "--json"], cwd=str(REPO), env=env())
    pid = json.loads(r.stdout)["pid"]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def victim(w: World, work: Path) -> subprocess.CompletedProcess[str]:
    script = f"curl -s -m 10 -o /dev/null -w '%{{http_code}} %{{time_total}}' http://{OK_HOST}/"
    return Sandgate(w, policy=policy(w, "victim"), cwd=work, quiet=True).run(cmd=["sh", "-c", script])


def test_silent_connections_and_an_endless_head_do_not_starve_or_bloat_the_daemon(
    w: World, servers: dict[str, Server]
) -> None:
    work = w.tmp / "fair"
    work.mkdir(exist_ok=True)
    assert victim(w, work).stdout.startswith("200")  # warm: the daemon is up, its baseline measured
    rss0 = daemon_rss_kib(w)
    ready, go = work / "hog-ready", work / "hog-go"
    hog_audit, head_audit = work / "hog.jsonl", work / "head.jsonl"
    blocked_before, ok_before = len(servers[BLOCKED_HOST].log_records()), len(servers[OK_HOST].log_records("http"))
    n = 3000  # past the per-sandbox share (netguard.decision.limits.PER_SANDBOX)
    hog = Sandgate(w, policy=policy(w, "hog"), audit=hog_audit, cwd=work, timeout=90).popen(
        cmd=[sys.executable, "-c", HOG, str(n), BLOCKED_IP, str(ready), str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait(ready.exists, 60), "the hog did not open its connections"
        assert wait(lambda: sum(r.get("count", 0) for r in _limits(hog_audit)) >= n - 2048 - 64, 30)
        head = Sandgate(w, policy=policy(w, "head"), audit=head_audit, cwd=work, timeout=60).popen(
            cmd=[sys.executable, "-c", STREAM, OK_HOST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        honest = victim(w, work)  # while both attack
        head_out, head_err = head.communicate(timeout=60)
        rss1 = daemon_rss_kib(w)
    finally:
        go.touch()
        _, hog_err = hog.communicate(timeout=60)
    assert honest.returncode == 0 and honest.stdout.startswith("200"), (honest.stdout, honest.stderr)
    sent, status = (head_out.split() + ["", ""])[:2]  # noqa: RUF005
    assert head.returncode == 0, (head_out, head_err)
    assert status == "HTTP/1.1" and int(sent) < 8 << 20, head_out  # cut short, answered (431)
    assert rss1 - rss0 < 256 * 1024, (rss0, rss1)  # KiB: the daemon did not take the head or the fds
    assert len(servers[BLOCKED_HOST].log_records()) == blocked_before  # the hog reached nothing
    assert len(servers[OK_HOST].log_records("http")) == ok_before + 1  # only the victim's request arrived
    hog_limits = _limits(hog_audit)
    assert {r["limit"] for r in hog_limits} == {"connections"}, hog_limits
    assert "per-sandbox connection limit" in hog_limits[0]["reason"]
    assert "refused by limits" in hog_err and "by a limit of the shared daemon" in hog_err, hog_err
    (h,) = [(r["limit"], r["kind"], r["count"]) for r in _limits(head_audit)]
    assert h == ("head", "http", 1)
    assert wait(lambda: daemon_rss_kib(w) - rss0 < 64 * 1024, 20)  # and returns afterwards


def _limits(audit: Path) -> list[Any]:
    try:
        return [r for r in read_records(audit) if r["event"] == "limit"]
    except FileNotFoundError:
        return []
