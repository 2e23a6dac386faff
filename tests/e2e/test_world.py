"""Tests of the e2e harness itself: if these fail, no sandgate boundary test can be trusted.

Each check that something is blocked is paired with a positive control proving the same probe
would have seen it get through.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from selftest.certs import CA
from selftest.world import Canary

from ..support.world import NETNS_ETC, VERIFY_PREFIXES, Server, World, _NetnsRunner, cleanup_stale

PY = sys.executable

# Probes run inside a namespace with `python -c SCRIPT args...`; each prints one line.
TCP_PROBE = r"""
import socket, sys, time
ip, port, timeout, payload = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
t = time.monotonic()
try:
    s = socket.create_connection((ip, port), timeout=timeout)
    s.sendall(payload.encode())
    print("reply", s.recv(100).decode("latin-1").strip())
except OSError as e:
    print("error", type(e).__name__, e.errno, round(time.monotonic() - t, 3))
"""

UDP_PROBE = r"""
import socket, sys
ip, port, timeout, payload = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(timeout)
s.sendto(payload.encode(), (ip, port))
try:
    print("reply", s.recv(100).decode())
except OSError as e:
    print("error", type(e).__name__)
"""

# "@name" connects to the abstract socket NUL+name.
UNIX_PROBE = r"""
import socket, sys
addr, payload = sys.argv[1], sys.argv[2]
if addr.startswith("@"):
    addr = "\0" + addr[1:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(3)
try:
    s.connect(addr)
    s.sendall(payload.encode())
    print("reply", s.recv(100).decode("latin-1").strip())
except OSError as e:
    print("error", type(e).__name__, e.errno)
"""

# Verifies the server against ONLY the given CA with Python's ssl module, strict X.509 checks on.
TLS_PROBE = r"""
import socket, ssl, sys
cafile, host, ip, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl.create_default_context(cafile=cafile)
ctx.verify_flags |= ssl.VERIFY_X509_STRICT
try:
    with socket.create_connection((ip, port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
        version = s.version()
        s.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        reply = b"".join(iter(lambda: s.recv(4096), b""))  # HTTP/1.0: the server closes after its answer
        print("ok", version, reply.decode().splitlines()[-1])
except (OSError, ssl.SSLError) as e:
    print("error", type(e).__name__, getattr(e, "verify_message", "") or e)
"""

DNS_PROBE = r"""
import json, sys
import dns.message, dns.query, dns.rcode, dns.resolver
server, proto, name, rdtype = sys.argv[1:5]
if server == "resolv.conf":  # whatever /etc/resolv.conf (bind-mounted by ip netns exec) says
    server = dns.resolver.Resolver().nameservers[0]
q = dns.message.make_query(name, rdtype)
try:
    r = (dns.query.udp if proto == "udp" else dns.query.tcp)(q, server, port=53, timeout=2)
except Exception as e:
    print(json.dumps({"server": server, "error": type(e).__name__}))
else:
    print(json.dumps({"server": server, "rcode": dns.rcode.to_text(r.rcode()),
                      "answers": [rd.to_text() for rrset in r.answer for rd in rrset]}))
"""

# A transparent-proxy stand-in: reports the original destination the kernel recorded before redirect.
ORIG_DST_LISTENER = r"""
import json, socket, struct, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
s.settimeout(10)
c, peer = s.accept()
raw = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST -> struct sockaddr_in
port, = struct.unpack_from("!H", raw, 2)
c.settimeout(2)
data = c.recv(100)
c.sendall(b"redirected\n")
c.close()
print(json.dumps({"peer": peer[0], "orig": f"{socket.inet_ntoa(raw[4:8])}:{port}",
                  "data": data.decode("latin-1")}), flush=True)
"""


def probe(runner: _NetnsRunner, script: str, *args: object, timeout: float = 15) -> str:
    res = runner.run([PY, "-c", script, *map(str, args)], timeout=timeout)
    assert res.returncode == 0, res.stderr
    return str(res.stdout).strip()


def dns_probe(runner: _NetnsRunner, server: str, proto: str, name: str, rdtype: str) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(probe(runner, DNS_PROBE, server, proto, name, rdtype))
    return reply


def host_traces() -> list[str]:
    """Read-only scan of the HOST namespace for anything a World could have leaked into it.

    Deliberately narrow (our names and addresses only): other test runs may change the host concurrently.
    """

    def out(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    links = [ln.split(":")[1].strip() for ln in out("ip", "-o", "link").splitlines()]
    routes = out("ip", "-o", "addr").splitlines() + out("ip", "route", "show", "table", "all").splitlines()
    return (
        [f"link {name}" for name in links if name.startswith(("sgw", "sgc"))]
        + [f"addr/route {r}" for r in routes if "198.51.100." in r or "198.18." in r]
        + [f"nft {t}" for t in out("nft", "list", "tables").splitlines() if "sandgate_test" in t]
    )


def gone(pid: int) -> bool:
    """Dead or a zombie waiting for its (non-us) parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


# ---------------------------------------------------------------- inside the world


def test_http_through_fake_dns(world: World) -> None:
    world.add_host("a.test", "198.51.100.10")
    srv = world.serve("http", "198.51.100.10", 80, name="a")

    res = world.run(["curl", "-sS", "--max-time", "5", "http://a.test/"])
    assert (res.returncode, res.stdout) == (0, "hello from a\n"), res.stderr
    res = world.run(["curl", "-sS", "--max-time", "5", "-H", "Host: other.example", "http://a.test/echo-host"])
    assert res.stdout == "other.example"
    res = world.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{size_download}",
            "http://a.test/big?bytes=20000000",
        ]
    )
    assert res.stdout == "200 20000000", res.stderr

    reqs = srv.log_records("http")
    assert [(r["method"], r["path"], r["host"]) for r in reqs] == [
        ("GET", "/", "a.test"),
        ("GET", "/echo-host", "other.example"),
        ("GET", "/big?bytes=20000000", "a.test"),
    ]
    assert all(r["server"] == "a" and r["peer"].startswith("198.51.100.10:") for r in reqs)
    assert len(srv.log_records("connect")) == 3
    assert world.dns is not None
    queries = {(r["qname"], r["qtype"]) for r in world.dns.log_records("dns")}
    assert ("a.test", "A") in queries
    assert all(r["qtype"] != "PTR" for r in world.dns.log_records()), "servers must not do reverse lookups"


def test_https_with_world_ca_logs_sni(world: World) -> None:
    world.add_host("b.test", "198.51.100.11")
    srv = world.serve("https", "198.51.100.11", 443, name="b.test")

    res = world.run(["curl", "-sS", "--max-time", "5", "--cacert", str(world.ca_pem), "https://b.test/"])
    assert (res.returncode, res.stdout) == (0, "hello from b.test\n"), res.stderr
    tls = srv.log_records("tls")
    assert [(r["sni"], r["ok"]) for r in tls] == [("b.test", True)]
    assert [(r["sni"], r["host"], r["path"]) for r in srv.log_records("https")] == [("b.test", "b.test", "/")]

    # Without the world CA the handshake fails, and the attempt is still on record.
    res = world.run(["curl", "-sS", "--max-time", "5", "https://b.test/"])
    assert res.returncode != 0
    failed = srv.wait_for(lambda r: not r["ok"], kind="tls")
    assert failed["sni"] == "b.test"
    assert len(srv.log_records("https")) == 1


def test_https_leaf_verifies_against_world_ca_only(world: World) -> None:
    """selftest/certs.py: a leaf for a name and an IP, checked by curl and by the ssl module (strict)."""
    world.add_host("tls.test", "198.51.100.12")
    srv = world.serve("https", "198.51.100.12", 8443, name="tls.test")

    for host in ("tls.test", "198.51.100.12"):  # the DNS and the IP subjectAltName
        res = world.run(["curl", "-sS", "--max-time", "5", "--cacert", str(world.ca_pem), f"https://{host}:8443/"])
        assert (res.returncode, res.stdout) == (0, "hello from tls.test\n"), res.stderr
    out = probe(world, TLS_PROBE, world.ca_pem, "tls.test", "198.51.100.12", 8443)
    assert out.startswith("ok TLSv1.3 hello from tls.test"), out
    # Controls: a name the leaf was not issued for, and another world's CA, are both refused.
    out = probe(world, TLS_PROBE, world.ca_pem, "other.test", "198.51.100.12", 8443)
    assert out.startswith("error SSLCertVerificationError") and "mismatch" in out, out
    other_ca = CA().write_cert(world.tmp / "other-ca.pem")
    res = world.run(["curl", "-sS", "--max-time", "5", "--cacert", str(other_ca), "https://tls.test:8443/"])
    assert res.returncode == 60, (res.returncode, res.stderr)  # CURLE_PEER_FAILED_VERIFICATION
    out = probe(world, TLS_PROBE, other_ca, "tls.test", "198.51.100.12", 8443)
    assert out.startswith("error SSLCertVerificationError"), out
    assert len(srv.log_records("https")) == 3
    deadline = time.monotonic() + 5  # the server may log a failed handshake after the client has given up
    while [r["ok"] for r in srv.log_records("tls")].count(False) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [r["ok"] for r in srv.log_records("tls")] == [True] * 3 + [False] * 3


def test_dns_answers_and_logs_udp_and_tcp(world: World) -> None:
    world.add_host("a.test", "198.51.100.10")
    world.add_host("meta.test", "169.254.169.254")  # DNS-only: the world must not hold it
    assert world.dns is not None

    got = dns_probe(world, "resolv.conf", "udp", "a.test", "A")
    assert got == {"server": "198.51.100.53", "rcode": "NOERROR", "answers": ["198.51.100.10"]}
    assert dns_probe(world, "198.51.100.53", "tcp", "A.Test", "A")["answers"] == ["198.51.100.10"]
    assert dns_probe(world, "198.51.100.53", "udp", "a.test", "AAAA") == {
        "server": "198.51.100.53",
        "rcode": "NOERROR",
        "answers": [],
    }
    assert dns_probe(world, "198.51.100.53", "udp", "a.test", "TXT")["answers"] == ['"canary"']
    assert dns_probe(world, "198.51.100.53", "tcp", "nope.test", "A")["rcode"] == "NXDOMAIN"
    assert dns_probe(world, "198.51.100.53", "udp", "meta.test", "A")["answers"] == ["169.254.169.254"]
    world.add_host("a.test", "198.51.100.12")  # re-pointing takes effect on the next query
    assert dns_probe(world, "198.51.100.53", "udp", "a.test", "A")["answers"] == ["198.51.100.12"]

    seen = [(r["proto"], r["qname"], r["qtype"]) for r in world.dns.log_records("dns")]
    assert seen == [
        ("udp", "a.test", "A"),
        ("tcp", "a.test", "A"),
        ("udp", "a.test", "AAAA"),
        ("udp", "a.test", "TXT"),
        ("tcp", "nope.test", "A"),
        ("udp", "meta.test", "A"),
        ("udp", "a.test", "A"),
    ]
    addrs = world.run(["ip", "-o", "-4", "addr", "show", "dev", "sgw0"]).stdout
    assert "169.254.169.254" not in addrs and "198.51.100.10/32" in addrs


def test_udp_and_tcp_canaries(world: World) -> None:
    udp = world.serve("udp", "198.51.100.30", 5000)
    tcp = world.serve("tcp", "198.51.100.31", 7000)

    assert probe(world, UDP_PROBE, "198.51.100.30", 5000, 2, "ping-udp") == "reply ping-udp"
    assert probe(world, TCP_PROBE, "198.51.100.31", 7000, 2, "ping-tcp") == "reply tcp-canary"
    assert [r["data"] for r in udp.log_records("udp")] == ["ping-udp"]
    assert [r["data"] for r in tcp.log_records("tcp")] == ["ping-tcp"]


def test_unix_canary_logs_and_replies(world: World) -> None:
    path = str(world.tmp / "canary.sock")
    srv = world.serve_unix("unix", path)
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666  # only the sandbox may keep clients out

    assert probe(world, UNIX_PROBE, path, "ping-unix") == "reply unix-canary"
    rec = srv.wait_for(kind="unix")
    assert (rec["data"], rec["address"], rec["server"], rec["uid"]) == ("ping-unix", path, path, 0)
    assert rec["pid"] > 0
    # A filesystem socket is not tied to a network namespace: a client netns reaches it too.
    assert probe(world.sandbox(), UNIX_PROBE, path, "from-client") == "reply unix-canary"
    assert [r["data"] for r in srv.log_records("unix")] == ["ping-unix", "from-client"]
    srv.stop()
    assert not os.path.lexists(path), "the socket file must go with its server"
    assert probe(world, UNIX_PROBE, path, "x") == "error FileNotFoundError 2"


def test_abstract_canary_lives_in_the_world_netns_only(world: World) -> None:
    name = f"sandgate-test-{os.getpid()}-{world.id}"
    srv = world.serve_unix("abstract", name, name="abs")
    assert srv.address == f"@{name}"

    assert probe(world, UNIX_PROBE, f"@{name}", "ping-abstract") == "reply unix-canary"
    rec = srv.wait_for(kind="unix")
    assert (rec["data"], rec["address"], rec["server"]) == ("ping-abstract", f"@{name}", "abs")
    # Abstract names are per network namespace: neither a client netns nor the host sees this one.
    assert probe(world.sandbox(), UNIX_PROBE, f"@{name}", "from-client") == "error ConnectionRefusedError 111"
    assert f"@{name}" not in Path("/proc/net/unix").read_text()
    assert [r["data"] for r in srv.log_records("unix")] == ["ping-abstract"]


def test_serve_unix_rejects_bad_arguments(world: World) -> None:
    with pytest.raises(ValueError, match="unknown unix server kind"):
        world.serve_unix("tcp", "/x")
    with pytest.raises(ValueError, match="absolute"):
        world.serve_unix("unix", "relative.sock")
    with pytest.raises(ValueError, match="too long"):
        world.serve_unix("abstract", "x" * 200)


def test_canary_runs_from_the_package_root(world: World) -> None:
    """`python -P -m selftest.canary` with PYTHONPATH=<root of launcher/>: no install, no cwd needed."""
    srv = world.serve("tcp", "198.51.100.33", 7001)
    cmdline = Path(f"/proc/{srv.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[:4] == [sys.executable.encode(), b"-P", b"-m", b"selftest.canary"]
    environ = Path(f"/proc/{srv.pid}/environ").read_bytes().split(b"\0")
    root = str(Path(__file__).resolve().parent.parent.parent).encode()
    assert any(e == b"PYTHONPATH=" + root or e.startswith(b"PYTHONPATH=" + root + b":") for e in environ)


def test_world_is_sealed(world: World) -> None:
    assert world.run(["ip", "route", "show", "default"]).stdout.strip() == ""
    assert world.run(["ip", "-6", "route", "show", "default"]).stdout.strip() == ""
    links = {line.split(":")[1].strip() for line in world.run(["ip", "-o", "link"]).stdout.splitlines()}
    assert links == {"lo", "sgw0"}
    # Never added to the world: fails at once with ENETUNREACH (101), no packet leaves anywhere.
    out = probe(world, TCP_PROBE, "198.51.100.250", 80, 3, "x").split()
    assert out[:3] == ["error", "OSError", "101"] and float(out[3]) < 1.0, out
    world.add_host("ghost.test", "198.51.100.251", hold=False)
    assert probe(world, TCP_PROBE, "ghost.test", 80, 3, "x").split()[:3] == ["error", "OSError", "101"]
    assert world.run(["curl", "-sS", "--max-time", "3", "http://ghost.test/"]).returncode == 7


def test_server_start_failure_reports_stderr(world: World) -> None:
    with pytest.raises(RuntimeError, match="Cannot assign requested address"):
        world.serve("tcp", "198.18.250.1", 80)  # not an address of the world


def test_serve_many_starts_the_whole_batch_before_waiting(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent start (verify's canaries): when the first is waited for, every one of the batch runs."""
    running_at_first_wait: list[int] = []
    real_wait = Server._wait_ready

    def spy(server: Server, timeout: float) -> None:
        if not running_at_first_wait:
            running_at_first_wait.append(sum(s.proc.poll() is None for s in world.servers[before:]))
        real_wait(server, timeout)

    monkeypatch.setattr(Server, "_wait_ready", spy)
    before = len(world.servers)
    sock = str(world.tmp / "many.sock")
    batch = [Canary("tcp", "198.51.100.34", 7002), Canary("udp", "198.51.100.35", 5002), Canary("unix", path=sock)]
    servers = world.serve_many(batch)
    assert running_at_first_wait == [3]
    assert world.servers[before:] == servers and [s.address for s in servers] == [
        "198.51.100.34:7002",
        "198.51.100.35:5002",
        sock,
    ]
    # every one is ready and answers (the addresses were held on sgw0 before the canaries bound them)
    assert probe(world, TCP_PROBE, "198.51.100.34", 7002, 2, "ping-tcp") == "reply tcp-canary"
    assert probe(world, UDP_PROBE, "198.51.100.35", 5002, 2, "ping-udp") == "reply ping-udp"
    assert probe(world, UNIX_PROBE, sock, "ping-unix") == "reply unix-canary"


def test_serve_many_failure_stops_the_rest_of_the_batch(world: World) -> None:
    """One canary of a batch fails: its stderr is the error; the ones not yet ready are stopped at once,
    the one already ready runs on (as after earlier serve()s) until the world closes."""
    before = len(world.servers)
    batch = [
        Canary("tcp", "198.51.100.36", 7004),
        Canary("tcp", "198.18.250.1", 80),  # not an address of the world
        Canary("tcp", "198.51.100.37", 7005),
    ]
    with pytest.raises(RuntimeError, match="Cannot assign requested address"):
        world.serve_many(batch)
    ready, failed, rest = world.servers[before:]
    assert ready.proc.poll() is None and failed.proc.returncode is not None and rest.proc.returncode is not None
    assert probe(world, TCP_PROBE, "198.51.100.36", 7004, 2, "x") == "reply tcp-canary"
    assert probe(world, TCP_PROBE, "198.51.100.37", 7005, 2, "x").split()[:2] == ["error", "ConnectionRefusedError"]
    # A bad canary is refused before any of the batch starts.
    with pytest.raises(ValueError, match="unknown server kind"):
        world.serve_many([Canary("tcp", "198.51.100.38", 7006), Canary("bogus", "198.51.100.38", 7007)])
    assert len(world.servers) == before + 3


def test_log_records_tolerate_partial_last_line(world: World) -> None:
    srv = world.serve("udp", "198.51.100.32", 5001)
    probe(world, UDP_PROBE, "198.51.100.32", 5001, 2, "one")
    srv.stop()
    with open(srv.log_path, "a") as f:
        f.write('{"kind": "udp", "da')
    assert [r["data"] for r in srv.log_records()] == ["one"]


# ---------------------------------------------------------------- sandbox clients


def test_client_reaches_world_directly_without_redirect(world: World) -> None:
    world.add_host("c.test", "198.51.100.20")
    http = world.serve("http", "198.51.100.20", 80, name="c")
    client = world.sandbox("direct")

    assert client.run(["ip", "route", "show", "default"]).stdout.split()[:3] == ["default", "via", client.world_ip]
    assert client.run(["cat", "/etc/resolv.conf"]).stdout.startswith(f"nameserver {client.world_ip}\n")
    res = client.run(["curl", "-sS", "--max-time", "5", "-H", "Host: c.test", "http://198.51.100.20/"])
    assert (res.returncode, res.stdout) == (0, "hello from c\n"), res.stderr
    assert http.log_records("http")[0]["peer"].startswith(f"{client.ip}:")


def test_redirect_tcp_lands_on_listener_with_original_dst(world: World) -> None:
    world.add_host("c.test", "198.51.100.20")
    http = world.serve("http", "198.51.100.20", 80, name="c")
    udp = world.serve("udp", "198.51.100.21", 5000)
    client = world.sandbox()
    # Positive controls: before the redirect both targets are reachable from the client.
    assert probe(client, TCP_PROBE, "198.51.100.20", 80, 2, "GET / HTTP/1.0\r\n\r\n").startswith("reply HTTP/1.1 200")
    assert probe(client, UDP_PROBE, "198.51.100.21", 5000, 2, "before") == "reply before"
    http_before, udp_before = len(http.log_records()), len(udp.log_records())

    port = 15001
    listener = world.popen([PY, "-c", ORIG_DST_LISTENER, str(port)], stdout=subprocess.PIPE, text=True)
    assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
    client.redirect(tcp_port=port, dns_port=None)

    assert probe(client, TCP_PROBE, "198.51.100.20", 80, 3, "GET / HTTP/1.0\r\n\r\n") == "reply redirected"
    out, _ = listener.communicate(timeout=10)
    seen = json.loads(out)
    assert seen["orig"] == "198.51.100.20:80" and seen["peer"] == client.ip
    assert seen["data"].startswith("GET / HTTP/1.0")
    # Direct UDP and TCP/53 are dropped in the world, and the canaries saw nothing new.
    assert probe(client, UDP_PROBE, "198.51.100.21", 5000, 0.7, "after") == "error TimeoutError"
    assert probe(client, TCP_PROBE, "198.51.100.53", 53, 0.7, "x").startswith("error TimeoutError")
    time.sleep(0.2)
    assert len(http.log_records()) == http_before
    assert len(udp.log_records()) == udp_before


def test_redirect_dns_to_interceptor(world: World) -> None:
    world.add_host("a.test", "198.51.100.10")
    world.serve("http", "198.51.100.10", 80)
    client = world.sandbox()
    client.redirect(tcp_port=None, dns_port=5353)
    interceptor = world.serve("dns", client.world_ip, 5353, name="interceptor")
    assert world.dns is not None
    main_dns_before = len(world.dns.log_records())

    # Whatever server the client asks, over UDP or TCP, the interceptor answers.
    assert dns_probe(client, "resolv.conf", "udp", "a.test", "A")["answers"] == ["198.51.100.10"]
    assert dns_probe(client, "198.51.100.53", "tcp", "a.test", "A")["answers"] == ["198.51.100.10"]
    assert dns_probe(client, "198.51.100.99", "udp", "a.test", "A")["answers"] == ["198.51.100.10"]
    assert [(r["proto"], r["peer"].split(":")[0]) for r in interceptor.log_records("dns")] == [
        ("udp", client.ip),
        ("tcp", client.ip),
        ("udp", client.ip),
    ]
    assert len(world.dns.log_records()) == main_dns_before
    # tcp_port=None: other TCP is not redirected, so it is dropped.
    assert probe(client, TCP_PROBE, "198.51.100.10", 80, 0.7, "x").startswith("error TimeoutError")


# ---------------------------------------------------------------- lifecycle


def test_prefixes_name_namespaces_and_are_validated() -> None:
    assert (World().prefix, World().client_prefix) == ("sandgate-w", "sandgate-c")
    assert World("sandgate-v").client_prefix == VERIFY_PREFIXES[1] == "sandgate-vc"
    w = World(*VERIFY_PREFIXES)
    assert w.ns == f"sandgate-v{os.getpid()}x{w.id}"
    with w:
        client = w.sandbox("p")
        assert client.ns.startswith(f"sandgate-vc{os.getpid()}x") and client.ns.endswith("-p")
        assert w.tmp.name.startswith(f"{w.ns}-")
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert w.ns in listed and client.ns in listed
    for bad in ("sandgate-w1", "other-w", "sandgate-", "sandgate-W"):
        with pytest.raises(ValueError, match="prefix"):
            World(prefix=bad)
    with pytest.raises(ValueError, match="differ"):
        World(prefix="sandgate-v", client_prefix="sandgate-v")
    with pytest.raises(ValueError, match="prefix"):
        cleanup_stale(["sandgate-"])


def test_exit_removes_everything_and_host_is_untouched() -> None:
    assert host_traces() == []
    with World() as w:
        w.add_host("a.test", "198.51.100.10")
        srv = w.serve("http", "198.51.100.10", 80)
        client = w.sandbox("life")
        sleeper = client.popen(["sleep", "60"])
        # A daemon that escaped its process group: only the per-namespace sweep can find it.
        escaped = int(w.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"]).stdout)
        during = host_traces()
        names = (w.ns, client.ns)
        tmp = w.tmp
        assert set(names) <= set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert during == [], "the world leaked into the host namespace"
    assert host_traces() == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
    assert not any((NETNS_ETC / n).exists() for n in names)
    assert not tmp.exists()
    assert sleeper.returncode is not None and srv.proc.returncode is not None
    deadline = time.monotonic() + 2
    while not gone(escaped) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(escaped)


def test_cleanup_stale_removes_dead_runs_only() -> None:
    true = subprocess.Popen(["true"])
    true.wait()
    dead = true.pid
    assert gone(dead)
    stale_ns, live_ns = f"sandgate-w{dead}x999", f"sandgate-w{os.getpid()}x998"
    # verify's names (world and client prefix), one dead and one live owner each
    stale_v, stale_vc = f"sandgate-v{dead}x997", f"sandgate-vc{dead}x996-probe"
    live_v, live_vc = f"sandgate-v{os.getpid()}x995", f"sandgate-vc{os.getpid()}x994"
    verify_names = (stale_v, stale_vc, live_v, live_vc)
    straggler = None
    try:
        for ns in verify_names:
            subprocess.run(["ip", "netns", "add", ns], check=True)
            (NETNS_ETC / ns).mkdir(parents=True)
        assert not any(n in r for r in cleanup_stale(["sandgate-w", "sandgate-c"]) for n in verify_names)
        removed = cleanup_stale()
        for ns in (stale_v, stale_vc):
            assert f"netns {ns}" in removed and str(NETNS_ETC / ns) in removed
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert stale_v not in listed and stale_vc not in listed and live_v in listed and live_vc in listed
        assert (NETNS_ETC / live_v).exists() and (NETNS_ETC / live_vc).exists()

        for ns in (stale_ns, live_ns):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            (NETNS_ETC / ns).mkdir(parents=True)
        straggler = subprocess.Popen(["ip", "netns", "exec", stale_ns, "sleep", "60"], start_new_session=True)
        deadline = time.monotonic() + 5
        while (
            str(straggler.pid)
            not in subprocess.run(["ip", "netns", "pids", stale_ns], capture_output=True, text=True).stdout
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)

        removed = cleanup_stale()

        assert f"netns {stale_ns}" in removed and str(NETNS_ETC / stale_ns) in removed
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert stale_ns not in listed and live_ns in listed
        assert not (NETNS_ETC / stale_ns).exists() and (NETNS_ETC / live_ns).exists()
        assert straggler.wait(5) is not None
    finally:
        if straggler is not None and straggler.poll() is None:
            os.killpg(straggler.pid, 9)
            straggler.wait()
        for ns in (stale_ns, live_ns, *verify_names):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            if (NETNS_ETC / ns).exists():
                (NETNS_ETC / ns).rmdir()


# ---------------------------------------------------------------- rootless mode (sandgate verify without sudo)


def test_a_rootless_world_serves_the_same_canaries_and_leaves_nothing_behind() -> None:
    """Forced here as root (the real unprivileged run is tests/e2e/test_verify.py's): the same harness
    through a user namespace of its own, with no /run/netns name and no /etc/netns files."""
    assert host_traces() == []
    netns_before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with World(rootless=True) as w:
        assert w.rootless and not (NETNS_ETC / w.ns).exists()
        w.add_host("a.test", "198.51.100.10")
        srv = w.serve("http", "198.51.100.10", 80, name="a")  # port 80 with no capability: unprivileged ports
        res = w.run(["curl", "-sS", "--max-time", "5", "http://a.test/"], cwd="/tmp")
        assert (res.returncode, res.stdout) == (0, "hello from a\n"), res.stderr
        assert w.run(["pwd"], cwd="/tmp").stdout.strip() == "/tmp"  # cwd survives entering the mount namespace
        assert w.run(["cat", "/etc/resolv.conf"]).stdout.startswith("nameserver 198.51.100.53")
        # Sealed like a root world: lo and the dummy only, no route out.
        assert w.run(["ip", "route", "show", "default"]).stdout.strip() == ""
        links = {line.split(":")[1].strip() for line in w.run(["ip", "-o", "link"]).stdout.splitlines()}
        assert links == {"lo", "sgw0"}
        # Entered processes live in the world's own user namespace (as root, uid 0 stays mapped to 0
        # there, so only the unprivileged run shows them holding no capability: test_verify.py).
        userns = w.run(["stat", "-L", "-c", "%i", "/proc/self/ns/user"]).stdout.strip()
        assert userns != str(os.stat("/proc/self/ns/user").st_ino)
        handle = w.netns_file(w.tmp / "netns")
        inside = w.run(["stat", "-L", "-c", "%i", str(handle)]).stdout.strip()
        assert inside == w.run(["stat", "-L", "-c", "%i", "/proc/self/ns/net"]).stdout.strip()
        escaped = int(w.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"]).stdout)
        helper, tmp = w._userns.pid if w._userns else 0, w.tmp
        with pytest.raises(RuntimeError, match="no clients"):
            w.sandbox()
        assert host_traces() == []
        assert srv.log_records("http")
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == netns_before
    assert not tmp.exists() and gone(helper) and srv.proc.returncode is not None
    deadline = time.monotonic() + 2
    while not gone(escaped) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(escaped)  # swept by the namespace it was in, though it left our process groups
