"""`sandgate run` end to end: the kernel forces the whole process tree through the proxy.

sandgate runs inside a test World (its "host" namespace is the world), so its proxy daemon
lives there and vanishes with it; the sandbox's own namespaces hold everything else. Every blocked probe checks the canary saw
nothing, next to a permitted probe in the same module that shows the path works.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.runner import REPO, SANDGATE, Sandgate, env, write_policy
from ..support.world import Server, World, new_world

ALLOWED, BLOCKED, UDPHOST = "198.51.100.10", "198.51.100.20", "198.51.100.60"
POLICY = "version: 1\nnetwork:\n  allow:\n    - allowed.test\n"

PROBE = textwrap.dedent("""\
    # Network probes run inside the sandbox; prints one JSON object.
    import json, socket, sys
    kind, target = sys.argv[1], sys.argv[2]
    out = {"kind": kind}
    try:
        if kind == "tcp":
            host, port = target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=3)
            s.sendall(b"probe\\n")
            s.settimeout(3)
            out["reply"] = s.recv(100).decode("latin-1")
        elif kind == "udp":
            host, port = target.rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(1.5)
            s.sendto(b"probe", (host, int(port)))
            out["reply"] = s.recv(100).decode("latin-1")
        elif kind == "tcp6":
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect((target, 80))
            out["reply"] = "connected"
        elif kind == "dns":
            import dns.message, dns.query, dns.rcode
            name, server = target.split("@")
            r = dns.query.udp(dns.message.make_query(name, "A"), server, timeout=3)
            out["reply"] = dns.rcode.to_text(r.rcode())
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)
    """)


@dataclass
class Env:
    world: World
    policy: Path
    probe_py: Path
    servers: dict[str, Server]

    @property
    def sg(self) -> Sandgate:
        """`sandgate run` as root in the world's tmp directory under the module's policy."""
        return Sandgate(self.world, policy=self.policy, cwd=self.world.tmp)

    def sandgate(self, *args: str, timeout: float = 60, audit: Path | None = None) -> subprocess.CompletedProcess[str]:
        audit = audit or self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"
        self.last_audit = audit
        return self.sg.run(*args, audit=audit, timeout=timeout)

    def probe_cmd(self, kind: str, target: str) -> list[str]:
        return [sys.executable, str(self.probe_py), kind, target]

    def probe(self, kind: str, target: str, *, via_shell: bool = False) -> dict[str, str]:
        cmd = self.probe_cmd(kind, target)
        if via_shell:  # a grandchild: sandgate -> init -> sh -> python
            cmd = ["sh", "-c", " ".join(cmd)]
        r = self.sandgate("-q", "--", *cmd)
        assert r.returncode == 0, r.stderr
        out: dict[str, str] = json.loads(r.stdout.strip().splitlines()[-1])
        return out

    def records(self, audit: Path | None = None) -> list[Any]:
        return read_records(audit or self.last_audit)

    def mark(self) -> dict[str, int]:
        return {k: len(v.log_records()) for k, v in self.servers.items()}

    def untouched(self, mark: dict[str, int], *names: str) -> bool:
        return all(len(self.servers[n].log_records()) == mark[n] for n in names)


@pytest.fixture(scope="module")
def e() -> Iterator[Env]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        # Worst case for the boundary: a host that routes (Docker hosts, routers). Without our rules,
        # the sandbox's packets would be forwarded straight to the canaries.
        w.run(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], check=True)
        w.add_host("allowed.test", ALLOWED)
        w.add_host("blocked.test", BLOCKED)
        probe = w.tmp / "probe.py"
        probe.write_text(PROBE)
        servers = {
            "allowed": w.serve("http", ALLOWED, 80, "allowed.test"),
            "allowed_tls": w.serve("https", ALLOWED, 443, "allowed.test"),
            "blocked": w.serve("http", BLOCKED, 80, "blocked.test"),
            "blocked_tls": w.serve("https", BLOCKED, 443, "blocked.test"),
            "blocked_tcp": w.serve("tcp", BLOCKED, 9000, "blocked.test"),
            "udp": w.serve("udp", UDPHOST, 9999, "udp"),
            "udp443": w.serve("udp", BLOCKED, 443, "quic"),
            "hostsvc": w.serve("tcp", "0.0.0.0", 2222, "host-service"),
        }
        yield Env(w, write_policy(w, POLICY), probe, servers)


def curl_args(e: Env, url: str, *extra: str) -> list[str]:
    return ["curl", "-sS", "-m", "10", "--cacert", str(e.world.ca_pem), *extra, url]


# ---- permitted ---------------------------------------------------------------------------------


def test_allowed_https_and_http_via_proxy_variables(e: Env) -> None:
    r = e.sandgate(
        "--",
        "sh",
        "-c",
        " ; ".join(
            [
                " ".join(curl_args(e, "https://allowed.test/")),
                " ".join(curl_args(e, "http://allowed.test/")),
                'echo "proxy=$HTTPS_PROXY"',
            ]
        ),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("hello from allowed.test") == 2
    assert "proxy=http://127.0.0.1:3128" in r.stdout  # the listener born inside the sandbox
    kinds = {(x["kind"], x["action"]) for x in e.records() if x["event"] == "decision"}
    assert {("connect", "allow"), ("http", "allow")} <= kinds
    assert "sandgate: 2 allowed, 0 denied ->" in r.stderr


def test_allowed_host_without_proxy_variables_goes_transparently(e: Env) -> None:
    r = e.sandgate(
        "--",
        "env",
        "-u",
        "HTTPS_PROXY",
        "-u",
        "https_proxy",
        "-u",
        "HTTP_PROXY",
        "-u",
        "http_proxy",
        "-u",
        "ALL_PROXY",
        "-u",
        "all_proxy",
        *curl_args(e, "https://allowed.test/"),
    )
    assert r.returncode == 0 and r.stdout.strip() == "hello from allowed.test", r.stderr
    kinds = {(x["kind"], x["host"], x["action"]) for x in e.records() if x["event"] == "decision"}
    assert ("dns", "allowed.test", "allow") in kinds and ("tls", "allowed.test", "allow") in kinds


# ---- blocked -------------------------------------------------------------------------------------


def test_blocked_host_fails_with_and_without_proxy_variables(e: Env) -> None:
    before = e.mark()
    r = e.sandgate("--", *curl_args(e, "http://blocked.test/", "-o", "/dev/null", "-w", "%{http_code}"))
    assert r.stdout == "403"
    r = e.sandgate(
        "--", *curl_args(e, "https://blocked.test/", "--noproxy", "*", "--resolve", f"blocked.test:443:{BLOCKED}")
    )
    assert r.returncode != 0
    assert e.untouched(before, "blocked", "blocked_tls")
    denied = [x for x in e.records() if x["event"] == "decision" and x["action"] == "deny"]
    assert denied and denied[0]["kind"] == "tls" and denied[0]["host"] == "blocked.test"


@pytest.mark.parametrize("via_shell", [False, True], ids=["child", "grandchild"])
def test_direct_tcp_to_a_blocked_ip_reaches_only_the_proxy(e: Env, via_shell: bool) -> None:
    before = e.mark()
    out = e.probe("tcp", f"{BLOCKED}:9000", via_shell=via_shell)
    assert "tcp-canary" not in out.get("reply", ""), out
    assert e.untouched(before, "blocked_tcp")
    rec = [x for x in e.records() if x["event"] == "decision"][-1]
    assert (rec["kind"], rec["action"], rec["host"], rec["port"]) == ("tcp", "deny", BLOCKED, 9000)
    assert rec["reason"] == "IP address not in any allowed cidr"


def test_udp_and_quic_are_dropped_and_recorded(e: Env) -> None:
    before = e.mark()
    # Dropped in the sandbox's own output hook: the sender learns at once (EPERM), no retry timeouts.
    assert "operation not permitted" in e.probe("udp", f"{UDPHOST}:9999").get("error", "").lower()
    audit = e.last_audit
    assert "operation not permitted" in e.probe("udp", f"{BLOCKED}:443").get("error", "").lower()
    assert e.untouched(before, "udp", "udp443")
    pkts = [x for x in e.records(audit) if x["kind"] == "packet"]
    assert [(p["action"], p["proto"], p["host"], p["port"]) for p in pkts] == [("deny", "udp", UDPHOST, 9999)]
    # The canary is alive: from the world itself the datagram is echoed.
    direct = e.world.run([sys.executable, str(e.probe_py), "udp", f"{UDPHOST}:9999"], cwd=REPO)
    assert json.loads(direct.stdout)["reply"] == "probe"


def test_dns_to_another_resolver_is_answered_by_sandgate_only(e: Env) -> None:
    dns_canary = e.world.dns
    assert dns_canary is not None
    start = len(dns_canary.log_records())
    out = e.probe("dns", "blocked.test@198.51.100.53")  # straight at the canary resolver's address
    assert out.get("reply") == "REFUSED", out  # sandgate's answer: the canary never answers REFUSED
    assert not [x for x in dns_canary.log_records()[start:] if "blocked.test" in x["qname"]]
    out = e.probe("dns", "allowed.test@198.51.100.53")
    assert out.get("reply") == "NOERROR"
    assert any("allowed.test" in x["qname"] for x in dns_canary.log_records()[start:])


def test_ipv6_is_unavailable(e: Env) -> None:
    out = e.probe("tcp6", "2001:db8::1")
    assert "error" in out and ("unreachable" in out["error"] or "Cannot assign" in out["error"]), out
    r = e.sandgate("--", "cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6")
    assert r.stdout.strip() == "1"


def test_host_services_on_the_hosts_loopback_are_unreachable(e: Env) -> None:
    """The host's 127.0.0.1 services (sshd, databases, admin ports): the sandbox's 127.0.0.1 is its own."""
    before = e.mark()
    out = e.probe("tcp", "127.0.0.1:2222")
    assert "tcp-canary" not in out.get("reply", "") and "refused" in out.get("error", ""), out
    assert "tcp-canary" not in e.probe("tcp", f"{ALLOWED}:2222").get("reply", "")  # its public address: denied
    assert "timeout" in e.probe("udp", "127.0.0.1:2222").get("error", "").lower()
    assert e.untouched(before, "hostsvc")
    direct = e.world.run([sys.executable, str(e.probe_py), "tcp", "127.0.0.1:2222"], cwd=REPO)
    assert json.loads(direct.stdout)["reply"] == "tcp-canary\n"  # the service was up


def test_a_test_suites_own_local_server_works_inside(e: Env) -> None:
    script = (
        "import socket, threading; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "threading.Thread(target=lambda: s.accept()[0].sendall(b'local-ok'), daemon=True).start(); "
        "c = socket.create_connection(s.getsockname()); print(c.recv(10).decode())"
    )
    r = e.sandgate("-q", "--", sys.executable, "-c", script)
    assert r.stdout.strip() == "local-ok", r.stderr


# ---- the whole tree, lifetime, fail closed -------------------------------------------------------


def test_setsid_daemon_is_constrained_and_dies_with_the_run(e: Env) -> None:
    before = e.mark()
    out = e.world.tmp / f"daemon-{time.monotonic_ns()}.json"
    seen_alive = e.world.tmp / f"alive-{time.monotonic_ns()}"
    token = f"sgdaemon{time.monotonic_ns()}"
    inner = f"{' '.join(e.probe_cmd('tcp', f'{BLOCKED}:9000'))} > {out}; exec -a {token} sleep 300"
    # Double fork + setsid: the daemon is re-parented away from CMD and has its own session.
    script = (
        f"setsid bash -c '( {inner} ) &' </dev/null >/dev/null 2>&1; "
        f"for i in $(seq 100); do [ -s {out} ] && pgrep -f {token} >/dev/null && break; sleep 0.1; done; "
        f"pgrep -f {token} > {seen_alive}"
    )
    r = e.sandgate("--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert seen_alive.read_text().strip(), "the daemon never ran"
    result = json.loads(out.read_text())
    assert "tcp-canary" not in result.get("reply", ""), result
    assert e.untouched(before, "blocked_tcp")
    rec = [x for x in e.records() if x["event"] == "decision"][-1]
    assert (rec["kind"], rec["action"], rec["host"]) == ("tcp", "deny", BLOCKED)
    alive = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True)
    assert alive.stdout == "", f"daemon survived the run: {alive.stdout}"


def daemon_status(e: Env) -> dict[str, object]:
    r = e.world.run([*SANDGATE, "daemon", "status", "--json"], cwd=e.world.tmp, env=env())
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_killing_the_daemon_makes_further_connects_fail(e: Env) -> None:
    go, first = e.world.tmp / f"go-{time.monotonic_ns()}", e.world.tmp / f"first-{time.monotonic_ns()}"
    audit = e.world.tmp / f"audit-kill-{time.monotonic_ns()}.jsonl"
    curl = " ".join(curl_args(e, "https://allowed.test/"))
    script = f"{curl} > {first}; while [ ! -e {go} ]; do sleep 0.1; done; {curl}; echo rc=$?"
    p = e.sg.popen(
        audit=audit,
        cmd=["sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (first.exists() and first.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.read_text().strip() == "hello from allowed.test"
        pid = int(str(daemon_status(e)["pid"]))
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        go.touch()
        stdout, stderr = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    second = stdout.split("rc=")[0].replace(first.read_text(), "")
    assert "hello" not in second and "rc=0" not in stdout, stdout  # the second request got nothing
    assert "rc=" in stdout, stdout  # ... and the command itself ran to its end
    assert "the proxy daemon exited" in stderr and "fail closed" in stderr, stderr


def test_sigkill_of_sandgate_leaves_no_sandbox_and_the_daemon_drops_it(e: Env) -> None:
    ready = e.world.tmp / f"ready-{time.monotonic_ns()}"
    token = f"sgorphan{time.monotonic_ns()}"
    audit = e.world.tmp / f"audit-sigkill-{time.monotonic_ns()}.jsonl"
    p = e.sg.popen(audit=audit, cmd=["bash", "-c", f"touch {ready}; exec -a {token} sleep 300"])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists()
    time.sleep(0.3)
    assert subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 0  # it is running
    deadline = time.monotonic() + 20  # a cold daemon (the previous test killed it) binds a moment later
    while not (bound := len(daemon_status(e)["bindings"])) and time.monotonic() < deadline:  # type: ignore[arg-type]
        time.sleep(0.1)
    assert bound >= 1
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 1, "sandbox survived SIGKILL"
    deadline = time.monotonic() + 5
    while len(daemon_status(e)["bindings"]) >= bound and time.monotonic() < deadline:  # type: ignore[arg-type]
        time.sleep(0.1)
    assert len(daemon_status(e)["bindings"]) == bound - 1  # type: ignore[arg-type]
    r = e.world.run([*SANDGATE, "cleanup"], cwd=e.world.tmp, env=env())
    assert r.returncode == 0 and "removed run " in r.stderr, r.stderr  # the killed run's state and placeholders
    assert not list(Path("/run/sandgate/runs").glob("*.json")) or all(
        json.loads(f.read_text())["pid"] != p.pid for f in Path("/run/sandgate/runs").glob("*.json")
    )


# ---- exit codes, signals, errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmd,code",
    [
        (["true"], 0),
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "kill -INT $$"], 130),
        (["sh", "-c", "kill -TERM $$"], 143),
        (["/nonexistent/cmd"], 127),
    ],
)
def test_exit_codes_are_the_commands(e: Env, cmd: list[str], code: int) -> None:
    r = e.sandgate("-q", "--", *cmd)
    assert r.returncode == code, r.stderr


def test_sigterm_to_sandgate_reaches_the_command(e: Env) -> None:
    ready = e.world.tmp / f"ready-{time.monotonic_ns()}"
    audit = e.world.tmp / f"audit-term-{time.monotonic_ns()}.jsonl"
    p = e.sg.popen(
        quiet=True,
        audit=audit,
        cmd=["sh", "-c", f"trap 'echo got-term; exit 42' TERM; touch {ready}; while :; do sleep 0.1; done"],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == 42 and "got-term" in out


def test_sandgate_errors_exit_125_with_one_line(e: Env) -> None:
    bad = write_policy(e.world, 'version: 1\nnetwork:\n  allow: ["*"]\n', "bad")
    r = e.sg.run(policy=bad, cmd=["true"])
    assert r.returncode == 125
    assert r.stderr.strip().splitlines() == [
        f"sandgate: error: {bad}:3: '*' would match every host; list the hosts instead"
    ]
    r = replace(e.sg, policy=None).run("--allow", "pypi")
    assert r.returncode == 125 and "no command given" in r.stderr


def test_command_runs_as_the_sudo_caller_or_user(e: Env) -> None:
    nobody = pwd.getpwnam("nobody")
    r = e.sandgate("-q", "--user", "nobody", "--", "sh", "-c", 'id -u; echo "$HOME $USER"')
    assert r.stdout.split() == ["65534", nobody.pw_dir, "nobody"]
    r = e.sg.run(  # sudo's own environment: HOME stays root's, SUDO_UID names the caller
        quiet=True,
        audit=e.world.tmp / "u.jsonl",
        cmd=["sh", "-c", 'id -u; echo "$HOME $LOGNAME"'],
        env={**env(), "SUDO_UID": "65534", "SUDO_GID": "65534", "HOME": "/root"},
    )
    assert r.stdout.split() == ["65534", nobody.pw_dir, "nobody"], r.stderr


def test_audit_log_of_a_run_has_allowed_denied_and_packet_records(e: Env) -> None:
    script = "; ".join(
        [
            " ".join(curl_args(e, "https://allowed.test/")),
            " ".join(curl_args(e, "http://blocked.test/")),
            " ".join(e.probe_cmd("udp", f"{UDPHOST}:9999")),
        ]
    )
    r = e.sandgate("--", "sh", "-c", script)
    assert r.returncode == 0
    recs = e.records()
    got = {(x["kind"], x["action"]) for x in recs if x["event"] == "decision"}
    assert {("connect", "allow"), ("http", "deny"), ("packet", "deny")} <= got
    assert "sandgate: 1 allowed, 2 denied ->" in r.stderr


def test_stdin_and_stdout_pass_through(e: Env) -> None:
    r = e.sg.run(
        quiet=True,
        audit=e.world.tmp / "io.jsonl",
        cmd=["sh", "-c", "tr a-z A-Z; echo err >&2"],
        input="hello sandbox\n",
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "HELLO SANDBOX\n", "err\n")


def test_next_run_removes_what_a_killed_run_left(e: Env) -> None:
    ready = e.world.tmp / f"ready-{time.monotonic_ns()}"
    # The launcher's own process SIGKILLed: the full path (a served run's worker, SIGKILLed the same way
    # when its caller is, is tests/e2e/test_forkserver_e2e.py's).
    full = {**env(), "SANDGATE_FORKSERVER": "0"}
    p = e.sg.popen(audit=e.world.tmp / "k.jsonl", cmd=["sh", "-c", f"touch {ready}; sleep 300"], env=full)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    runs = Path("/run/sandgate/runs")
    stale = [f for f in runs.glob("*.json") if json.loads(f.read_text())["pid"] == p.pid]
    assert len(stale) == 1
    placeholders = json.loads(stale[0].read_text())["placeholders"]
    assert placeholders and all(os.path.lexists(ph) for ph in placeholders)  # e.g. the missing .git/hooks
    r = e.sandgate("-q", "--", "true")  # the next run cleans up first
    assert r.returncode == 0
    assert not stale[0].exists() and not (runs / stale[0].stem).exists()
    assert not any(os.path.lexists(ph) for ph in placeholders)


def test_dot_sandgate_yaml_is_the_default_policy(e: Env) -> None:
    """Used with no --policy; but it comes with the checkout, so it only narrows until `sandgate trust`."""
    proj = e.world.tmp / f"proj-{time.monotonic_ns()}"
    proj.mkdir()
    (proj / ".sandgate.yaml").write_text("version: 1\nnetwork:\n  allow: [blocked.test]\n")
    run_env = {**env(), "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(e.world.tmp / "state")}
    before = e.mark()
    sg = Sandgate(e.world, quiet=True, cwd=proj, env=run_env)  # no --policy: .sandgate.yaml is the policy
    r = sg.run(cmd=curl_args(e, "http://blocked.test/", "-o", "/dev/null", "-w", "%{http_code}"))
    assert r.stdout == "403" and e.untouched(before, "blocked"), r.stderr
    notice = (
        "sandgate: .sandgate.yaml is not trusted, so only what it forbids applies; ignored: network.allow; "
        "to trust it: sandgate trust .sandgate.yaml"
    )
    assert r.stderr.splitlines() == [notice]
    assert e.world.run([*SANDGATE, "trust"], cwd=proj, env=run_env).returncode == 0
    r = sg.run(cmd=curl_args(e, "http://blocked.test/"))
    assert r.stdout.strip() == "hello from blocked.test", r.stderr
    assert sorted(p.name for p in proj.iterdir()) == [".sandgate.yaml"]  # sandgate left nothing in the workspace


def test_default_audit_logs_live_outside_the_workspace_and_are_listed(e: Env) -> None:
    proj = e.world.tmp / f"logs-{time.monotonic_ns()}"
    proj.mkdir()
    pol = write_policy(e.world, "version: 1\nnetwork:\n  allow: [allowed.test]\n", f"logs{time.monotonic_ns()}")
    r = Sandgate(e.world, policy=pol, cwd=proj).run(cmd=curl_args(e, "http://blocked.test/", "-o", "/dev/null"))
    log = Path(r.stderr.strip().splitlines()[0].rsplit("-> ", 1)[1])
    assert log.parent == Path("/var/log/sandgate") and log.is_file(), r.stderr  # root's default
    assert list(proj.iterdir()) == []  # nothing of sandgate's in the workspace, during or after
    listed = e.world.run([*SANDGATE, "audit"], cwd=proj, env=env())
    assert str(log) in listed.stdout.splitlines()[0], listed.stdout  # newest first
    summary = e.world.run([*SANDGATE, "audit", "summary", "--json"], cwd=proj, env=env())  # no path: the last run
    assert any(row["host"] == "blocked.test" for row in json.loads(summary.stdout)), summary.stdout


def test_the_exit_line_names_each_denied_destination_and_the_flag_that_would_allow_it(e: Env) -> None:
    before = e.mark()
    r = e.sandgate(
        "--",
        "sh",
        "-c",
        " ; ".join(
            [
                " ".join(curl_args(e, "https://blocked.test/")),
                " ".join(curl_args(e, "https://blocked.test/")),
                " ".join(e.probe_cmd("tcp", f"{BLOCKED}:9000")),
                "true",
            ]
        ),
    )
    assert r.returncode == 0, r.stderr
    out = r.stderr.splitlines()
    exit_block = out[max(i for i, x in enumerate(out) if " -> " in x) :]  # live denial lines may come before it
    lines = [x for x in exit_block if x.startswith("sandgate: denied ")]
    assert lines[0] == "sandgate: denied blocked.test:443 (2x): allow it with --allow blocked.test", r.stderr
    assert lines[1] == f"sandgate: denied {BLOCKED}:9000: allow it with --allow {BLOCKED}/32:9000", r.stderr
    assert e.untouched(before, "blocked_tls", "blocked_tcp")  # and the destinations really saw nothing


def test_no_policy_means_no_network_and_says_so_in_one_line(e: Env) -> None:
    ws = e.world.tmp / f"nopol-{time.monotonic_ns()}"
    ws.mkdir()
    before = e.mark()
    r = Sandgate(e.world, audit=ws / "a.jsonl", cwd=ws).run(cmd=curl_args(e, "http://allowed.test/"))
    assert r.returncode != 0 or "hello" not in r.stdout
    assert r.stderr.splitlines()[0].startswith("sandgate: no policy given: the command gets no network"), r.stderr
    assert e.untouched(before, "allowed")


def test_learn_needs_no_policy(e: Env) -> None:
    ws = e.world.tmp / f"learn-{time.monotonic_ns()}"
    ws.mkdir()
    r = Sandgate(e.world, cwd=ws).run(
        "--learn", "--audit-log", str(ws / "a.jsonl"), cmd=curl_args(e, "http://allowed.test/")
    )
    assert r.stdout.strip() == "hello from allowed.test", r.stderr
    recs: list[Any] = read_records(ws / "a.jsonl")
    assert any(x["event"] == "decision" and x["would"] == "deny" and x["host"] == "allowed.test" for x in recs)


def test_a_command_under_the_hosts_tmp_gets_a_hint(e: Env) -> None:
    r = e.sandgate("-q", "--", "/tmp/sandgate-no-such-tool")
    assert r.returncode == 127 and "own, empty /tmp" in r.stderr, r.stderr
    # Found on the host through a PATH entry under /tmp: the same hint.
    r = e.sg.run(quiet=True, cmd=["sandgate-no-such-tool"], env={**env(), "PATH": f"/tmp/bin:{env()['PATH']}"})
    assert r.returncode == 127 and "own, empty /tmp" in r.stderr, r.stderr
    r = e.sandgate("-q", "--", "sandgate-no-such-tool")  # control: no /tmp on PATH, no hint
    assert r.returncode == 127 and "sandgate-no-such-tool: command not found\n" in r.stderr, r.stderr


def test_a_script_whose_interpreter_is_missing_says_so(e: Env) -> None:
    ws = e.world.tmp / f"shebang-{time.monotonic_ns()}"
    ws.mkdir()
    (ws / "tool").write_text("#!/nonexistent/interp\necho never\n")
    (ws / "tool").chmod(0o755)
    r = Sandgate(e.world, cwd=ws, quiet=True).run(audit=ws / "a.jsonl", cmd=["./tool"])
    assert r.returncode == 127 and "./tool: its interpreter (the #! line) was not found" in r.stderr, r.stderr


PTY_DRIVER = textwrap.dedent("""\
    # argv[1] times: sandgate on a real terminal, Ctrl-C once the command says tty=yes, like a person
    # would. Prints per trial: the exit status, whether it saw tty=yes, whether sandgate blamed its
    # proxy (it must not: the daemon lives in a session of its own).
    import os, pty, select, sys, time
    for trial in range(int(sys.argv[1])):
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
        buf, deadline = b"", time.time() + 30
        while b"tty=yes" not in buf and time.time() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    buf += os.read(fd, 1024)
                except OSError:
                    break
        os.write(fd, b"\\x03")
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), b"tty=yes" in buf, b"daemon exited" in buf or b"proxy exited" in buf,
              flush=True)
    """)


def on_a_terminal(e: Env, trials: int) -> list[str]:
    sandgate = e.sg.argv(
        quiet=True,
        audit=e.world.tmp / "pty.jsonl",
        cmd=["sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo tty=yes; exec sleep 30"],
    )
    r = e.world.run(
        [sys.executable, "-c", PTY_DRIVER, str(trials), *sandgate[1:]],  # the driver execs sys.executable itself
        cwd=e.world.tmp,
        env=env(),
        timeout=60 + 10 * trials,
    )
    lines: list[str] = r.stdout.splitlines()
    return lines


def test_terminal_passes_through_and_ctrl_c_reaches_the_command(e: Env) -> None:
    assert on_a_terminal(e, 1) == ["130 True False"]


def test_twenty_ctrl_c_never_blame_the_proxy_and_end_with_130(e: Env) -> None:
    assert on_a_terminal(e, 20) == ["130 True False"] * 20


def test_an_extra_write_root_gets_no_placeholders_and_nothing_is_left(e: Env) -> None:
    ws, extra = e.world.tmp / f"ws-{time.monotonic_ns()}", e.world.tmp / f"cache-{time.monotonic_ns()}"
    ws.mkdir()
    extra.mkdir()
    (extra / ".vscode").mkdir()  # an existing protected name is still protected there
    r = e.sg.run(
        "--write",
        str(extra),
        quiet=True,
        audit=e.world.tmp / "x.jsonl",
        cmd=["sh", "-c", f"ls -A {extra}; echo ---; ls -A .; touch {extra}/.vscode/x 2>/dev/null || echo ro"],
        cwd=ws,
    )
    extra_seen, ws_seen = r.stdout.split("---")
    assert extra_seen.split() == [".vscode"], r.stdout  # no .sandgate.yaml, .idea, .envrc... sprouted there
    assert ".sandgate.yaml" in ws_seen.split() and "ro" in ws_seen.split(), r.stdout  # the workspace: covered
    assert sorted(p.name for p in extra.iterdir()) == [".vscode"] and list(ws.iterdir()) == []
