"""Learning a policy from a real run, and human approval through the approvals socket, end to end."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from netguard.audit import read_records

from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import World, new_world

HOSTS = {
    "reg.test": "198.51.100.10",
    "files.reg.test": "198.51.100.11",
    "a.cdn.test": "198.51.100.12",
    "b.cdn.test": "198.51.100.13",
    "c.cdn.test": "198.51.100.14",
    "ask.test": "198.51.100.15",
    "other.test": "198.51.100.16",
}


@dataclass
class Net:
    world: World

    @property
    def sg(self) -> Sandgate:
        """`sandgate run` as root in the world's tmp directory; each test brings its own policy."""
        return Sandgate(self.world, cwd=self.world.tmp)

    def curl(self, url: str) -> str:
        return f"curl -sS -m 20 --cacert {self.world.ca_pem} -o /dev/null -w '{url} %{{http_code}}\\n' {url}"

    def run(
        self, policy: Path, script: str, *extra: str, audit: Path | None = None, timeout: float = 90
    ) -> tuple[subprocess.CompletedProcess[str], Path]:
        audit = audit or self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"
        r = self.sg.run(*extra, policy=policy, audit=audit, cmd=["sh", "-c", script], timeout=timeout)
        return r, audit


def records(path: Path, event: str = "decision") -> list[Any]:
    return [r for r in read_records(path) if r["event"] == event]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    with new_world() as w:
        for name, ip in HOSTS.items():
            w.add_host(name, ip)
            w.serve("https", ip, 443, name)
        w.serve("https", HOSTS["files.reg.test"], 8443, "files.reg.test")
        yield Net(w)


def policy(net: Net, text: str, name: str) -> Path:
    p = net.world.tmp / f"{name}.yaml"
    p.write_text(text)
    return p


# ---- learn -> suggest -> enforce ---------------------------------------------------------------


def test_learn_suggest_enforce_round_trip(net: Net) -> None:
    script = "; ".join(
        net.curl(u)
        for u in (
            "https://reg.test/simple/",
            "https://files.reg.test:8443/pkg.whl",
            "https://a.cdn.test/x",
            "https://b.cdn.test/y",
            "https://c.cdn.test/z",
        )
    )
    empty = policy(net, "version: 1\n", "empty")
    learned, log = net.run(empty, script, "--learn")
    assert learned.returncode == 0, learned.stderr
    assert "sandgate: 5 allowed (5 would have been denied), 0 denied" in learned.stderr
    assert all(line.endswith(" 200") for line in learned.stdout.splitlines()), learned.stdout
    decisions = [r for r in records(log) if r["kind"] != "dns"]
    assert {(r["action"], r["would"], r["rule"]) for r in decisions} == {("allow", "deny", None)}

    # Direct IPs and UDP stay blocked in learn mode: they were never proxy-able.
    udp = "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('198.51.100.10', 9))\""
    _, log2 = net.run(empty, udp, "--learn")
    assert [(x["kind"], x["action"]) for x in records(log2)] == [("packet", "deny")]

    suggested = net.world.run([*SANDGATE, "audit", "suggest", str(log), "--name", "learned"], env=env())
    assert suggested.returncode == 0, suggested.stderr
    doc = yaml.safe_load(suggested.stdout)
    assert {"host": "*.cdn.test", "ports": [443]} in doc["network"]["allow"] or "*.cdn.test" in str(doc)
    assert "files.reg.test" in suggested.stdout and "8443" in suggested.stdout
    enforced_policy = policy(net, suggested.stdout, "suggested")
    enforced, log3 = net.run(enforced_policy, script)
    assert enforced.stdout == learned.stdout  # same outcome...
    assert [r for r in records(log3) if r["action"] == "deny"] == []  # ...and zero denies
    other, _ = net.run(enforced_policy, net.curl("https://other.test/"))
    assert " 403" in other.stdout or " 000" in other.stdout  # the suggestion is not an allow-all


def test_audit_summary_over_two_runs(net: Net) -> None:
    p = policy(net, "version: 1\nnetwork:\n  allow: [reg.test]\n", "sum")
    _, log1 = net.run(p, net.curl("https://reg.test/") + "; " + net.curl("https://other.test/"))
    _, log2 = net.run(p, net.curl("https://reg.test/"))
    r = net.world.run([*SANDGATE, "audit", "summary", "--json", str(log1), str(log2)], env=env())
    rows = json.loads(r.stdout)
    first = rows[0]
    assert "other.test" in json.dumps(first)  # the denied destination comes first
    reg = next(x for x in rows if "reg.test" in json.dumps(x) and "other" not in json.dumps(x) and x.get("port") == 443)
    assert reg["count"] == 2 and reg["bytes_down"] > 0


# ---- approvals -------------------------------------------------------------------------------------


@dataclass
class Approver:
    """A test client of the --approvals socket protocol: answers each request with decide(request)."""

    path: Path
    decide: Callable[[dict[str, object]], str | None]
    delay: float = 0.0
    requests: list[dict[str, object]] = field(default_factory=list)
    connected: bool = False

    def start(self) -> None:
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 30
        while not self.path.exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(self.path))
        self.connected = True
        with s, s.makefile("rb") as f:
            for line in f:
                req = json.loads(line)
                self.requests.append(req)
                answer = self.decide(req)
                if answer is not None:
                    time.sleep(self.delay)
                    s.sendall((json.dumps({"type": "decision", "id": req["id"], "decision": answer}) + "\n").encode())


def ask_run(
    net: Net,
    script: str,
    decide: Callable[[dict[str, object]], str | None],
    *extra: str,
    delay: float = 0.0,
    policy_text: str = "version: 1\nnetwork:\n  ask: [ask.test]\n",
) -> tuple[subprocess.CompletedProcess[str], Path, Approver, Path]:
    sock = net.world.tmp / f"approvals-{time.monotonic_ns()}.sock"
    client = Approver(sock, decide, delay)
    client.start()
    pol = policy(net, policy_text, f"ask-{time.monotonic_ns()}")
    r, log = net.run(pol, script, "--approvals", f"unix:{sock}", *extra)
    return r, log, client, pol


def test_allow_once_then_asked_again(net: Net) -> None:
    twice = net.curl("https://ask.test/") + "; " + net.curl("https://ask.test/")
    r, log, client, _ = ask_run(net, twice, lambda req: "once")
    assert r.stdout.splitlines() == ["https://ask.test/ 200", "https://ask.test/ 200"], r.stderr
    assert len(client.requests) == 2 and client.requests[0]["host"] == "ask.test" and client.requests[0]["port"] == 443
    assert re.fullmatch(r"/\S*/curl\[\d+\]", str(client.requests[0]["asked_by"])), client.requests[0]  # the exe
    approvals = records(log, "approval")
    assert [(a["stage"], a["answer"], a["by"]) for a in approvals] == [
        ("question", None, None),
        ("answer", "once", "socket"),
    ] * 2


def test_allow_for_this_run_is_not_asked_again(net: Net) -> None:
    thrice = "; ".join([net.curl("https://ask.test/")] * 3)
    r, _, client, _ = ask_run(net, thrice, lambda req: "run")
    assert r.stdout.count(" 200") == 3 and len(client.requests) == 1


def test_deny_and_timeout_refuse_the_connection(net: Net) -> None:
    r, log, client, _ = ask_run(net, net.curl("https://ask.test/"), lambda req: "deny")
    assert r.stdout.strip() == "https://ask.test/ 000" and len(client.requests) == 1
    assert str(records(log)[-1]["reason"]).endswith("denied by a human")
    r, log, client, _ = ask_run(net, net.curl("https://ask.test/"), lambda req: None, "--ask-timeout", "1")
    assert r.stdout.strip() == "https://ask.test/ 000" and len(client.requests) == 1
    assert str(records(log)[-1]["reason"]).endswith("no answer in time")
    assert [a["by"] for a in records(log, "approval") if a["stage"] == "answer"] == ["timeout"]


def test_always_writes_a_valid_policy_line(net: Net) -> None:
    r, _, _, pol = ask_run(net, net.curl("https://ask.test/"), lambda req: "always")
    assert r.stdout.strip() == "https://ask.test/ 200"
    from launcher.config.load import build_policy
    from netguard.rules import compile_policy, decide

    amended = build_policy([pol], [], [])
    assert decide(compile_policy(amended.network), "ask.test", 443).allowed
    again, _ = net.run(pol, net.curl("https://ask.test/"))  # no approvals channel needed any more
    assert again.stdout.strip() == "https://ask.test/ 200"


def test_concurrent_connections_share_one_question(net: Net) -> None:
    both = f"({net.curl('https://ask.test/a')}) & ({net.curl('https://ask.test/b')}) & wait"
    r, _, client, _ = ask_run(net, both, lambda req: "once", delay=1.0)
    assert sorted(r.stdout.splitlines()) == ["https://ask.test/a 200", "https://ask.test/b 200"], r.stderr
    assert len(client.requests) == 1


def test_ask_flag_asks_for_every_non_allowed_destination(net: Net) -> None:
    _, _, client, _ = ask_run(
        net,
        net.curl("https://other.test/"),
        lambda req: "deny",
        "--ask",
        policy_text="version: 1\nnetwork:\n  allow: [reg.test]\n",
    )
    assert [q["host"] for q in client.requests] == ["other.test"]


def test_the_approvals_socket_is_absent_from_the_sandbox(net: Net) -> None:
    # The run lasts a second after its probe: the control client (outside) polls for the socket every
    # 50 ms, and a run shorter than that could end before it ever connected (a flaky control).
    probe = (
        'python3 -c "import socket, sys, os, time; '
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1]); print('reached')\n"
        "except OSError as e:\n    print('refused', e.strerror)\n"
        "print(sorted(os.listdir('/run/sandgate')), flush=True)\n"
        'time.sleep(1)" '
    )
    sock = net.world.tmp / f"approvals-{time.monotonic_ns()}.sock"
    client = Approver(sock, lambda req: "once")
    client.start()
    pol = policy(net, "version: 1\nnetwork:\n  ask: [ask.test]\n", "hidden")
    r, _ = net.run(pol, probe + str(sock), "--approvals", f"unix:{sock}")
    assert r.stdout.splitlines() == ["refused Connection refused", "[]"], (r.stdout, r.stderr)
    assert client.connected  # the control: outside the sandbox the same socket accepted a connection
    assert sock.exists() is False  # removed when the run ended


TERMINAL_DRIVER = """\
# A person at sandgate's terminal: reads the banner's code, answers the prompt that carries it.
import os, pty, re, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
out, answered, deadline = b"", False, time.time() + 60
while time.time() < deadline:
    if not select.select([fd], [], [], 1)[0]:
        continue
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
    code = re.search(rb"genuine prompts carry the code \\[([0-9A-F]{4})\\]", out)
    if code and not answered and re.search(rb"sandgate \\[" + code.group(1) + rb"\\] allow ask.test:443 .*\\?", out):
        os.write(fd, b"o\\n")
        answered = True
os.waitpid(pid, 0)
print(out.decode(errors="replace").replace("\\r", ""))
"""


def test_the_terminal_prompt_carries_the_runs_code_and_takes_the_answer(net: Net) -> None:
    pol = policy(net, "version: 1\nnetwork:\n  ask: [ask.test]\n", "tty")
    audit = net.world.tmp / f"audit-tty-{time.monotonic_ns()}.jsonl"
    r = net.world.run(
        [
            sys.executable,
            "-c",
            TERMINAL_DRIVER,
            *net.sg.argv(policy=pol, audit=audit, cmd=["sh", "-c", net.curl("https://ask.test/")]),
        ],
        cwd=net.world.tmp,
        env=env(),
        timeout=90,
    )
    assert "https://ask.test/ 200" in r.stdout, r.stdout
    answers = [a for a in records(audit, "approval") if a["stage"] == "answer"]
    assert [(a["answer"], a["by"]) for a in answers] == [("once", "terminal")]


SERVED_DRIVER = """\
# TERMINAL_DRIVER's person, for a command whose streams do not go to the terminal: this driver keeps the
# terminal's other end open, or the master would read EIO as soon as no stream of the command is on it.
import fcntl, os, re, select, sys, termios, time
primary, secondary = os.openpty()
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(secondary, termios.TIOCSCTTY, 0)
    for i in range(3):
        os.dup2(secondary, i)
    os.execvp(sys.argv[1], sys.argv[1:])
out, answered, deadline = b"", False, time.time() + 60
while time.time() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
    if not select.select([primary], [], [], 0.2)[0]:
        continue
    out += os.read(primary, 4096)
    code = re.search(rb"genuine prompts carry the code \\[([0-9A-F]{4})\\]", out)
    if code and not answered and re.search(rb"sandgate \\[" + code.group(1) + rb"\\] allow ask.test:443 .*\\?", out):
        os.write(primary, b"o\\n")
        answered = True
print(out.decode(errors="replace").replace("\\r", ""))
"""


def test_a_served_run_prompts_on_the_terminal_its_caller_passed(net: Net) -> None:
    """An agent's case: a terminal in raw mode (no ISIG: it cannot signal sandgate), the streams
    redirected. The run is served by the fork server (launcher/forkserver/), whose worker has no
    terminal of its own: the prompt must reach the caller's, and the answer come back from it."""
    for _ in range(30):  # warm: the daemon, then a fork server for this context
        warmup = net.sg.run(cmd=["true"], env={**env(), "SANDGATE_TIMINGS": "1"})
        if "sandgate-timing forked" in warmup.stderr:
            break
        time.sleep(0.2)
    else:
        pytest.fail("no run was served by a fork server")
    pol = policy(net, "version: 1\nnetwork:\n  ask: [ask.test]\n", "served-tty")
    audit = net.world.tmp / f"audit-served-tty-{time.monotonic_ns()}.jsonl"
    out = net.world.tmp / f"served-tty-{time.monotonic_ns()}.out"
    line = net.sg.argv(policy=pol, audit=audit, cmd=["sh", "-c", net.curl("https://ask.test/")])
    shell = 'stty -isig; exec "$@" </dev/null >"$OUT" 2>&1'
    r = net.world.run(
        [sys.executable, "-c", SERVED_DRIVER, "sh", "-c", shell, "sh", *line],
        cwd=net.world.tmp,
        env={**env(), "OUT": str(out), "SANDGATE_TIMINGS": "1"},
        timeout=90,
    )
    text = out.read_text()
    assert "https://ask.test/ 200" in text, (text, r.stdout)
    assert "sandgate-timing forked" in text  # it was served, not the launcher's own run
    answers = [a for a in records(audit, "approval") if a["stage"] == "answer"]
    assert [(a["answer"], a["by"]) for a in answers] == [("once", "terminal")]


def test_without_a_terminal_or_channel_an_ask_is_denied_at_once(net: Net) -> None:
    pol = policy(net, "version: 1\nnetwork:\n  ask: [ask.test]\n", "notty")
    t0 = time.monotonic()
    r, log = net.run(pol, net.curl("https://ask.test/"))  # world.run gives sandgate no controlling terminal
    assert r.stdout.strip() == "https://ask.test/ 000" and time.monotonic() - t0 < 30
    assert [(a["answer"], a["by"]) for a in records(log, "approval") if a["stage"] == "answer"] == [
        ("deny", "no-terminal")
    ]
