"""The daemon as a process: sandboxes bound over passed listeners, each with its own policy and log.

Every test starts its own `python -m netguard.daemon` on a temporary socket and stops it by
PID. Listeners are created here (127.0.0.1, ephemeral ports) exactly as the launcher creates
them inside a sandbox, handed over, and our copies closed: from then on only the daemon holds
them, so its death must make them refuse connections.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import pytest

from netguard.audit import read_records
from netguard.daemon import control
from netguard.daemon.control import ControlClient, ControlError
from netguard.policy import parse_network
from netguard.spec import BindingSpec, encode

from ..support.daemonfake import REPO, Box, Daemon, Web, eventually, listener, raw, refused
from ..support.dnsfake import FakeDns, tcp_ask, udp_ask


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sgd"))  # AF_UNIX paths are short; pytest's tmp_path may not be
    d.chmod(0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(base: Path) -> Iterator[Daemon]:
    d = Daemon(base)
    try:
        yield d
    finally:
        d.stop()


def allow_web(web: Web) -> dict[str, Any]:
    # Loopback is vetoed for names (SSRF); an explicit cidr rule for it is what opens it.
    return {"allow": [{"cidr": "127.0.0.0/8", "ports": [web.port]}]}


# ---- two sandboxes, one daemon -----------------------------------------------------------------


def test_two_sandboxes_keep_their_own_policy_and_audit_log(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    b = Box(daemon, "b", {"allow": ["other.test"]})
    url = f"http://127.0.0.1:{web.port}/"
    assert a.get(url) == (200, "hello from web") and web.hits == [1]
    status, body = b.get(url)
    assert status == 403 and "IP address not in any allowed cidr" in body and web.hits == [1]
    assert [(r["task"], r["action"], r["host"], r["port"]) for r in a.decisions()] == [
        ("a", "allow", "127.0.0.1", web.port)
    ]
    assert [(r["task"], r["action"]) for r in b.decisions()] == [("b", "deny")]
    assert eventually(lambda: any(r["event"] == "close" for r in read_records(a.audit)))
    st = a.client.status()
    assert st["pid"] == daemon.proc.pid and st["uptime"] > 0
    assert sorted(x["task"] for x in st["bindings"]) == ["a", "b"]
    assert all(x["since"].endswith("Z") for x in st["bindings"])


def test_dns_is_served_on_the_passed_sockets(daemon: Daemon) -> None:
    upstream = FakeDns()
    try:
        a = Box(daemon, "a", {"allow": ["allowed.test"], "resolver": f"127.0.0.1:{upstream.port}"})
        ok = udp_ask(a.dns_udp, dns.message.make_query("allowed.test", "A"))
        assert ok.rcode() == dns.rcode.NOERROR and ok.answer[0][0].to_text() == "192.0.2.1"
        blocked, ok_tcp = tcp_ask(
            a.dns_tcp, [dns.message.make_query("blocked.test", "A"), dns.message.make_query("allowed.test", "AAAA")]
        )
        assert blocked.rcode() == dns.rcode.REFUSED and ok_tcp.rcode() == dns.rcode.NOERROR
        assert upstream.names() == ["allowed.test.", "allowed.test."]
        assert [(r["kind"], r["host"], r["action"]) for r in a.decisions()] == [
            ("dns", "allowed.test", "allow"),
            ("dns", "blocked.test", "deny"),
            ("dns", "allowed.test", "allow"),
        ]
    finally:
        upstream.close()


def test_end_closes_only_that_sandbox(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    b = Box(daemon, "b", allow_web(web))
    a.client.end()  # returns once the listeners are closed
    assert refused(a.regular) and refused(a.transparent) and refused(a.dns_tcp)
    assert b.get(f"http://127.0.0.1:{web.port}/")[0] == 200
    assert [x["task"] for x in b.client.status()["bindings"]] == ["b"]
    a.client.end()  # idempotent: nothing left to end
    assert "end task=a (end;" in daemon.log() and "bind task=b" in daemon.log()


def test_a_closed_connection_drops_its_binding(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    b = Box(daemon, "b", allow_web(web))
    a.client.close()  # as if the launcher had been SIGKILLed: no end
    assert eventually(lambda: refused(a.regular))
    assert [x["task"] for x in b.client.status()["bindings"]] == ["b"]
    assert b.get(f"http://127.0.0.1:{web.port}/")[0] == 200
    assert "end task=a (connection closed" in daemon.log()


def test_end_cuts_open_connections_of_that_sandbox(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    s = socket.create_connection(("127.0.0.1", a.regular), timeout=5)
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % web.port)  # a tunnel stays open
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    a.client.end()
    s.settimeout(5)
    try:
        rest = s.recv(65536)
        while rest and (more := s.recv(65536)):
            rest = more
    except ConnectionResetError:
        rest = b""
    assert rest == b""  # the daemon hung up on it
    s.close()


# ---- bad input from one launcher -----------------------------------------------------------


def test_malformed_binds_are_refused_and_others_keep_working(daemon: Daemon, web: Web, base: Path) -> None:
    b = Box(daemon, "b", allow_web(web))
    # mitmproxy loads after "ready" (issue 25): count once it and the relay workers are up
    assert eventually(lambda: raw(b.client, {"op": "status"})["mitmproxy"] == "ready")
    fd_dir = Path(f"/proc/{daemon.proc.pid}/fd")
    before = len(list(fd_dir.iterdir()))
    spec = BindingSpec("x", parse_network({"allow": ["a.test"]}, "x.yaml"))
    with daemon.client() as c:
        r, w = os.pipe()
        assert "bind needs 5 fds" in raw(c, {"op": "bind", "spec": encode(spec)}, [r, w])["error"]
        assert raw(c, {"op": "bind", "spec": {"task": "x"}}, [r])["error"].startswith("invalid spec: spec: missing")
        afd = os.open(base / "x.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        unlistening = socket.socket()
        with pytest.raises(ControlError, match="regular fd is not a listening socket"):
            c.bind(spec, [afd, unlistening.fileno(), r, w, r])
        assert raw(c, {"op": "frobnicate"})["error"].startswith("unknown op 'frobnicate'")
        assert raw(c, {"op": "status", "x": 1})["error"] == "unexpected keys in 'status': x"
        c._sock.send(b"\xff not json")
        assert control.recv_raw(c._sock)[0] == b'{"ok":false,"error":"message is not JSON"}'
        assert c.status()["ok"] is True  # the same connection is still served
        control.close_fds([r, w, afd])
        unlistening.close()
    assert b.get(f"http://127.0.0.1:{web.port}/")[0] == 200
    assert eventually(lambda: len(list(fd_dir.iterdir())) == before)  # nothing leaked into the daemon
    assert daemon.proc.poll() is None


def test_a_spec_edited_after_the_launcher_made_it_is_refused_by_the_daemon(daemon: Daemon, web: Web) -> None:
    """The daemon only decodes into the rule types; their constructors refuse what the parser never makes."""
    b = Box(daemon, "b", allow_web(web))
    wire = encode(BindingSpec("x", parse_network({"allow": ["a.test"], "deny": ["evil.test"]}, "x.yaml")))
    edits = {"inspect": True}, {"value": "Evil.test"}, {"origin": ["x.yaml", 0]}
    with daemon.client() as c:
        r, w = os.pipe()
        assert "bind needs 5 fds" in raw(c, {"op": "bind", "spec": wire}, [r])["error"]  # unedited: decoded
        for edit in edits:
            bad = copy.deepcopy(wire)
            bad["policy"]["deny"][0].update(edit)
            assert raw(c, {"op": "bind", "spec": bad}, [r])["error"].startswith("invalid spec: policy")
        control.close_fds([r, w])
    assert b.get(f"http://127.0.0.1:{web.port}/")[0] == 200 and daemon.proc.poll() is None


def test_one_binding_per_connection(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    socks = [listener(), listener(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM), listener()]
    socks[2].bind(("127.0.0.1", 0))
    afd = os.open(a.audit, os.O_WRONLY | os.O_APPEND)
    with pytest.raises(ControlError, match="already has a binding"):
        a.client.bind(BindingSpec("a2", parse_network({}, "x")), [afd, *(s.fileno() for s in socks)])
    os.close(afd)
    for s in socks:
        s.close()
    assert a.get(f"http://127.0.0.1:{web.port}/")[0] == 200


def test_other_users_are_refused(daemon: Daemon) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (it connects as another uid)", pytrace=False)
    daemon.path.parent.chmod(0o711)
    daemon.path.chmod(0o666)  # only the SO_PEERCRED check is left in the way

    def as_nobody() -> str:  # a process of another user; no exec (the venv's python may not be readable to it)
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        return str(ControlClient.connect(daemon.path, timeout=10).status())

    out = in_child(as_nobody)
    assert out.startswith("refused: refused: uid 65534 is not the daemon's"), out  # told why: no status
    assert "refused a control connection: uid 65534" in daemon.log()
    with daemon.client() as c:
        assert c.status()["ok"]


# ---- lifecycle ------------------------------------------------------------------------------


def test_stop_exits_and_removes_the_socket(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    with daemon.client() as c:
        c.stop()
    assert daemon.proc.wait(10) == 0
    assert not daemon.path.exists() and refused(a.regular)
    assert a.decisions() == []


def test_a_second_daemon_exits_quietly_while_the_first_lives(daemon: Daemon) -> None:
    proc, ready = daemon.spawn()
    assert proc.wait(20) == 0 and ready == b"ready\n"  # "ready" means: PATH is served
    with daemon.client() as c:
        assert c.status()["pid"] == daemon.proc.pid


def test_sigkill_closes_every_passed_listener(daemon: Daemon, web: Web) -> None:
    a = Box(daemon, "a", allow_web(web))
    b = Box(daemon, "b", {"allow": ["other.test"]})
    daemon.proc.kill()
    daemon.proc.wait(10)
    for port in (a.regular, a.transparent, a.dns_tcp, b.regular):
        assert refused(port), port  # nobody else holds them: fail closed
    with pytest.raises(ControlError):
        a.client.status()
    # The stale socket is replaced by the next daemon.
    assert daemon.path.exists()
    daemon.proc, ready = daemon.spawn()
    assert ready == b"ready\n"
    with daemon.client() as c:
        assert c.status()["pid"] == daemon.proc.pid


def test_idle_exit_and_sigterm_remove_the_socket(base: Path) -> None:
    d = Daemon(base, idle=0.5)
    try:
        with d.client() as c:
            time.sleep(1)  # an open control connection keeps it alive
            assert c.status()["bindings"] == []
        assert d.proc.wait(10) == 0 and not d.path.exists()
        assert "exiting (idle)" in d.log()
        d.proc, _ = d.spawn()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(10) == 0 and not d.path.exists()
    finally:
        d.stop()


def test_a_path_that_is_not_a_socket_is_left_alone(base: Path) -> None:
    path = base / "d.sock"
    path.write_text("precious")
    out = subprocess.run(
        [sys.executable, "-m", "netguard.daemon", "--socket", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert out.returncode == 1 and "not a socket" in out.stderr
    assert path.read_text() == "precious"


# ---- a real sandbox namespace -------------------------------------------------------------------

INSIDE = textwrap.dedent("""\
    # Runs in a fresh network namespace: lo, a default route into it, an nft redirect, the four
    # listeners (as the launcher makes them), sent to the test; then a client that knows no proxy.
    import array, json, socket, subprocess, sys
    import dns.message, dns.query
    ctl = socket.socket(fileno=int(sys.argv[1]))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "route", "add", "default", "dev", "lo", "src", "127.0.0.1"], check=True)
    subprocess.run(["nft", "-f", "-"], input=b'''table ip t {
        chain out {
            type nat hook output priority -100;
            ip daddr 192.0.2.0/24 meta l4proto tcp redirect to :3129
        }
    }''', check=True)
    socks = []
    for port, kind in ((3128, socket.SOCK_STREAM), (3129, socket.SOCK_STREAM), (53, socket.SOCK_DGRAM),
                       (53, socket.SOCK_STREAM)):
        s = socket.socket(socket.AF_INET, kind)
        s.bind(("127.0.0.1", port))
        if kind == socket.SOCK_STREAM:
            s.listen(64)
        socks.append(s)
    ctl.sendmsg([b"fds"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno() for s in socks]))])
    for s in socks:
        s.close()
    ctl.recv(10)  # bound
    def get(host):
        c = socket.create_connection(("192.0.2.1", int(sys.argv[2])), timeout=10)
        c.sendall(f"GET / HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n".encode())
        f = c.makefile("rb")  # by Content-Length: a transparent keep-alive need not close first
        status = f.readline().decode().strip()
        length = 0
        while (line := f.readline()) not in (b"\\r\\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return status, f.read(length).decode()
    out = {"allowed": get(f"127.0.0.1:{sys.argv[2]}"), "blocked": get("blocked.test")}
    r = dns.query.udp(dns.message.make_query("allowed.test", "A"), "127.0.0.1", port=53, timeout=5)
    out["dns"] = [rr.to_text() for a in r.answer for rr in a]
    print(json.dumps(out))
    """)


def test_transparent_and_dns_from_inside_a_sandbox_namespace(daemon: Daemon, web: Web) -> None:
    if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"):
        pytest.fail("this test needs root, unshare and nft (it builds a network namespace)", pytrace=False)
    upstream = FakeDns()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = subprocess.Popen(
        ["unshare", "--net", sys.executable, "-c", INSIDE, str(theirs.fileno()), str(web.port)],
        pass_fds=(theirs.fileno(),),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    theirs.close()
    try:
        ours.settimeout(20)
        _, fds, _ = control.recv_raw(ours)
        assert len(fds) == 4, child.communicate(timeout=5)
        audit = daemon.path.parent / "ns.jsonl"
        afd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        net = {
            "allow": [{"cidr": "127.0.0.0/8", "ports": [web.port]}, "allowed.test"],
            "resolver": f"127.0.0.1:{upstream.port}",
        }
        with daemon.client() as c:
            c.bind(BindingSpec("ns", parse_network(net, "ns.yaml")), [afd, *fds])
            control.close_fds([afd, *fds])
            ours.send(b"go")
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
        got = json.loads(out)
        # The daemon, in the host's namespace, reached 127.0.0.1 there: the sandbox's own loopback has no server.
        assert got["allowed"] == ["HTTP/1.0 200 OK", "hello from web"] and web.hits == [1]
        assert got["blocked"][0].startswith("HTTP/1.1 403")
        assert got["dns"] == ["192.0.2.1"]
        recs = [(r["kind"], r["host"], r["action"]) for r in read_records(audit) if r["event"] == "decision"]
        assert recs == [
            ("http", "127.0.0.1", "allow"),
            ("http", "blocked.test", "deny"),
            ("dns", "allowed.test", "allow"),
        ]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        ours.close()
        upstream.close()


def test_a_socket_named_for_another_network_namespace_is_refused(base: Path) -> None:
    ino = os.stat("/proc/self/ns/net").st_ino
    out = subprocess.run(
        [sys.executable, "-m", "netguard.daemon", "--socket", str(base / f"daemon-{ino + 1}.sock")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert out.returncode == 1 and "another network namespace" in out.stderr
    assert list(base.iterdir()) == []


def in_child(act: Callable[[], str]) -> str:
    """`act()` in a forked child (no exec: this interpreter); what it returned, or "refused: <ControlError>"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                answer = act()
            except ControlError as e:
                answer = f"refused: {e}"
            os.write(w, answer.encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return f.read()


def _from_namespace(flags: int, daemon: Daemon, op: str) -> str:
    """Run `op` (status, stop or bind) from a forked child in new namespaces, as a sandboxed process would."""

    def act() -> str:
        socks = [listener(), listener(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM), listener()]
        socks[2].bind(("127.0.0.1", 0))  # before the unshare: a new netns has no lo up
        fd = os.open(daemon.path.parent / "evil.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.unshare(flags)  # the same uid, as SO_PEERCRED will report it: only the namespace differs
        with ControlClient.connect(daemon.path, timeout=10) as c:
            if op != "bind":
                return str(getattr(c, op)())
            policy = parse_network({"allow": [{"host": "blocked.test", "ports": [80]}]}, "x.yaml")
            c.bind(BindingSpec("evil", policy), [fd, *(s.fileno() for s in socks)])
            return "bound"

    return in_child(act)


@pytest.mark.parametrize("op", ["status", "bind", "stop"])
@pytest.mark.parametrize("flags", [os.CLONE_NEWUSER, os.CLONE_NEWNET], ids=["userns", "netns"])
def test_no_process_in_another_namespace_uses_the_control_protocol(daemon: Daemon, flags: int, op: str) -> None:
    """Issue 22: SO_PEERCRED gives a sandboxed process the daemon's own uid. From inside a sandbox (its own
    user namespace) or any other network namespace, nothing is bound, stopped or answered; the daemon logs it."""
    out = _from_namespace(flags, daemon, op)
    ns = "user" if flags == os.CLONE_NEWUSER else "net"
    assert out.startswith("refused: refused: pid "), out
    assert f"is in another {ns} namespace" in out and "only a launcher outside every sandbox" in out
    assert eventually(lambda: f"is in another {ns} namespace" in daemon.log())
    assert "bind task=evil" not in daemon.log() and "exiting" not in daemon.log()
    with daemon.client() as c:  # the launcher beside it is still served: same daemon, nothing bound
        st = c.status()
        assert st["ok"] and st["bindings"] == []


def test_stop_if_idle_leaves_a_daemon_that_another_launcher_uses(daemon: Daemon, web: Web) -> None:
    """What a run that failed before its bind sends (launcher/run/daemonctl.py abandon): never stops a
    daemon another sandbox depends on, stops one nobody else is connected to."""
    b = Box(daemon, "busy", allow_web(web))
    with daemon.client() as c:
        assert c.stop(if_idle=True) is False
    assert b.get(f"http://127.0.0.1:{web.port}/")[0] == 200  # still serving its sandbox
    b.client.close()
    with daemon.client() as c:
        assert eventually(lambda: c.status()["bindings"] == [])  # the closed connection's binding is gone
        assert c.stop(if_idle=True) is True
    daemon.proc.wait(10)
