"""The probe runner of `sandgate verify` (selftest/probes/), without a sandbox.

Unit tests only: no namespaces, no sandgate. Without a sandbox the boundary is missing, so the
filesystem probes here must report "permitted": that is what shows they can see a missing
boundary. Network tests talk only to 127.0.0.1 listeners started here (a guard turns any other
address into a test failure); the process probes that touch pid 1 and the terminal probe are
not run here, nor are the grandchild and daemon machinery (sandgate verify exercises those).
The host-boundary probes that would change the host (sethostname, netns_tamper) run in a forked
child with a private UTS / network namespace; the others touch only what the test planted.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from selftest import markers
from selftest import planted as outside
from selftest.probes import core, dnswire, netio, runner, syscalls
from selftest.spec import dump_spec, load_spec

from ..support.probespec import SECRET, make_spec

REPO = Path(__file__).resolve().parent.parent.parent


# ---- safety net: nothing but loopback --------------------------------------------------------------


LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _check_addr(addr: Any) -> None:
    if isinstance(addr, (str, bytes)):  # AF_UNIX
        return
    if addr[0] not in LOOPBACK:
        raise AssertionError(f"a unit test tried to reach {addr!r}")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connect/sendto/lookup of a non-loopback address fails the test instead of leaving the machine."""
    orig_connect, orig_sendto, orig_gai = socket.socket.connect, socket.socket.sendto, socket.getaddrinfo

    def connect(self: socket.socket, addr: Any) -> None:
        _check_addr(addr)
        return orig_connect(self, addr)

    def sendto(self: socket.socket, data: bytes, *args: Any) -> int:
        _check_addr(args[-1])
        return orig_sendto(self, data, *args)

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        if host is not None and (host.decode() if isinstance(host, bytes) else host) not in LOOPBACK:
            raise AssertionError(f"a unit test tried to resolve {host!r}")
        return orig_gai(host, *args, **kw)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "sendto", sendto)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)


def run(name: str, spec: dict[str, Any], context: str = "child") -> core.Record:
    return core.run_one(core.REGISTRY[name], make_spec(**spec), context, watchdog=10)


# ---- registry ----------------------------------------------------------------------------------


def test_probe_list_is_complete_and_unique() -> None:
    rows = core.probe_list()
    assert rows
    names = [name for _, name, _ in rows]
    assert len(names) == len(set(names))
    assert {group for group, _, _ in rows} == set(core.GROUPS)
    assert {expected for _, _, expected in rows} == set(core.EXPECTED)
    for _group, name, _expected in rows:
        assert core.REGISTRY[name].threat, f"{name} has no docstring naming its threat"
    for name in (
        "https_proxy_vars",
        "sni_spoof",
        "dns_txt_exfil",
        "write_workspace",
        "git_hooks",
        "tiocsti",
        "ptrace_outside",
        "setuid_gain",
    ):
        assert name in names


def test_contexts_skip_terminal_probe_outside_child() -> None:
    child = {p.name for p in core.select_probes("child")}
    heavy = {"git_fetch_inspected", "git_push_refused", "secret_brokered", "ca_key_hidden"}  # INSPECTION_CONTEXTS
    heavy |= {"other_daemon_control", "starvation", "endless_head"}  # the shared daemon's: the command only
    heavy |= {"host_fronting", "keepalive_blocked_host"}  # the daemon refuses them whoever asks
    heavy |= {"path_spellings", "method_override", "websocket_upgrade", "sentinel_prefix"}  # issue 24, inspection
    for ctx in ("grandchild", "daemon"):
        assert {p.name for p in core.select_probes(ctx)} == child - {"tiocsti"} - heavy
    assert "tiocsti" in child and heavy <= child
    assert {p.group for p in core.select_probes("child", ["filesystem"])} == {"filesystem"}
    assert [p.name for p in core.select_probes("daemon", ["udp", "secret_env"])] == ["udp", "secret_env"]
    with pytest.raises(ValueError, match="nosuch"):
        core.select_probes("child", ["nosuch"])


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        core.probe("network", "udp", "blocked")(lambda c: ("blocked", ""))
    with pytest.raises(ValueError, match="bad probe"):
        core.probe("network", "x_new", "maybe")
    with pytest.raises(ValueError, match="bad probe"):
        core.probe("network", "x_new", "blocked", contexts=("sidecar",))


def test_markers() -> None:
    c = core.Ctx(make_spec(exfil_domain="exfil.test"), "grandchild", "dns_udp_rogue")
    assert c.path == "/verify/grandchild/dns_udp_rogue"
    assert c.marker == b"verify:grandchild:dns_udp_rogue\n"
    assert c.dns_name() == "dns-udp-rogue-grandchild.exfil.test"
    assert c.url("https", "a.test") == "https://a.test/verify/grandchild/dns_udp_rogue"


def test_the_judge_finds_every_marker_a_probe_sends() -> None:
    """One definition of the markers: what a probe sends is what verify searches the canary logs for."""
    c = core.Ctx(make_spec(exfil_domain="exfil.test", marker_tag="root"), "grandchild", "dns_txt_exfil")
    wanted = markers.in_logs(c.probe, c.mark)
    for sent in (c.path, c.marker.decode(), c.dns_name(), markers.exfil_name(SECRET, c.context, c.dns_name())):
        assert any(m in sent for m in wanted), sent


def test_every_probe_has_a_place_in_the_run_order() -> None:
    assert set(core.ORDER) == set(core.REGISTRY) and len(core.ORDER) == len(set(core.ORDER))
    with pytest.raises(ValueError, match="no place in ORDER"):
        core.probe("network", "x_unordered", "blocked")


def test_the_spec_round_trips_and_refuses_what_it_does_not_know() -> None:
    spec = make_spec(only=("network", "udp"), marker_tag="user")
    assert load_spec(dump_spec(spec)) == spec
    raw = json.loads(dump_spec(spec))
    for bad, why in (
        ({**raw, "blocked_hots": "x"}, "unknown spec key"),
        ({k: v for k, v in raw.items() if k != "blocked_host"}, "incomplete spec"),
        ({**raw, "tcp_port": "9000"}, "'tcp_port'"),
        ({**raw, "root_dev": [1]}, "'root_dev'"),
        ({**raw, "ssh_key_handle": {"hex": ""}}, "'ssh_key_handle'"),
    ):
        with pytest.raises(ValueError, match=why):
            load_spec(json.dumps(bad))
    with pytest.raises(ValueError, match="JSON object"):
        load_spec("[1, 2]")


# ---- classification: a broken probe never reads as a pass ----------------------------------------


def _raises(exc: BaseException) -> Callable[[core.Ctx], core.Result]:
    def fn(c: core.Ctx) -> core.Result:
        raise exc

    return fn


@pytest.mark.parametrize(
    ("exc", "observed", "fragment"),
    [
        (PermissionError(errno.EACCES, "Permission denied"), "blocked", "EACCES"),
        (OSError(errno.EROFS, "Read-only file system"), "blocked", "EROFS"),
        (OSError(errno.EXDEV, "Invalid cross-device link"), "blocked", "EXDEV"),
        (OSError(errno.EBUSY, "busy"), "blocked", "EBUSY"),
        (OSError(errno.ENETUNREACH, "unreachable"), "blocked", "ENETUNREACH"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "blocked", "ECONNREFUSED"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "blocked", "ECONNRESET"),
        (TimeoutError("timed out"), "blocked", "timed out"),
        (TimeoutError("timed out"), "blocked", "timed out"),
        (core.Blocked("proxy said no"), "blocked", "proxy said no"),
        (core.Unsupported("no terminal"), "unsupported", "no terminal"),
        (OSError(errno.ENOENT, "No such file"), "unsupported", "FileNotFoundError"),
        (OSError(errno.EINVAL, "Invalid argument"), "unsupported", "Invalid argument"),
        (ValueError("bad packet"), "unsupported", "ValueError: bad packet"),
        (KeyError("ca"), "unsupported", "KeyError: 'ca'"),
    ],
)
def test_exceptions_are_classified(exc: BaseException, observed: str, fragment: str) -> None:
    p = core.Probe("network", "fake", "blocked", frozenset(core.CONTEXTS), _raises(exc))
    rec = core.run_one(p, make_spec(), "daemon", watchdog=None)
    assert rec == {
        "group": "network",
        "probe": "fake",
        "context": "daemon",
        "expected": "blocked",
        "observed": observed,
        "detail": rec["detail"],
    }
    assert fragment in rec["detail"]
    if observed == "unsupported" and not isinstance(exc, core.Unsupported):
        assert "unexpected" in rec["detail"] and "test_probes.py" in rec["detail"]


def test_nonsense_result_and_hang_are_unsupported() -> None:
    p = core.Probe("process", "odd", "blocked", frozenset(core.CONTEXTS), lambda c: ("maybe", "?"))
    assert core.run_one(p, make_spec(), "child", watchdog=None)["observed"] == "unsupported"

    def hang(c: core.Ctx) -> core.Result:
        time.sleep(5)
        return "blocked", "slept"

    start = time.monotonic()
    rec = core.run_one(
        core.Probe("process", "hang", "blocked", frozenset(core.CONTEXTS), hang), make_spec(), "child", watchdog=0.2
    )
    assert rec["observed"] == "unsupported" and "still running" in rec["detail"]
    assert time.monotonic() - start < 2


def test_detail_is_one_short_line() -> None:
    p = core.Probe("network", "long", "blocked", frozenset(core.CONTEXTS), lambda c: ("blocked", "x\n" * 1000))
    detail = core.run_one(p, make_spec(), "child", watchdog=None)["detail"]
    assert "\n" not in detail and len(detail) <= core.DETAIL_LIMIT


def test_combine_and_attempt() -> None:
    ok, no, na = ("permitted", "a"), ("blocked", "b"), ("unsupported", "c")
    assert core.combine([("x", no), ("y", ok)], need="any")[0] == "permitted"
    assert core.combine([("x", no), ("y", na)], need="any")[0] == "unsupported"
    assert core.combine([("x", no), ("y", no)], need="any") == ("blocked", "x: b; y: b")
    assert core.combine([("x", ok), ("y", no)], need="all")[0] == "blocked"
    assert core.combine([("x", ok), ("y", na)], need="all")[0] == "unsupported"
    assert core.combine([("x", ok), ("y", ok)], need="all")[0] == "permitted"
    assert core.attempt(_raises(PermissionError(errno.EPERM, "no")), None)[0] == "blocked"
    observed, detail = core.attempt(_raises(ZeroDivisionError("boom")), None)
    assert observed == "unsupported" and "ZeroDivisionError" in detail


# ---- DNS wire format ---------------------------------------------------------------------------


def test_query_round_trips() -> None:
    wire = dnswire.build_query("Dns-UDP-rogue-child.exfil.test", dnswire.QTYPE_TXT, qid=0x1234)
    msg = dnswire.parse_message(wire)
    assert msg.id == 0x1234 and not msg.is_response and msg.flags & 0x0100  # RD
    assert msg.questions == [("Dns-UDP-rogue-child.exfil.test", dnswire.QTYPE_TXT)] and msg.answers == []


def _response(qid: int, rcode: int, name: str, answers: bytes = b"", ancount: int = 0) -> bytes:
    return (
        struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, ancount, 0, 0)
        + dnswire.encode_name(name)
        + struct.pack("!HH", 1, 1)
        + answers
    )


def test_parse_hand_made_response_with_compression() -> None:
    a = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes([198, 51, 100, 10])
    txt = b"\xc0\x0c" + struct.pack("!HHIH", 16, 1, 30, 8) + b"\x03abc\x03def"
    msg = dnswire.parse_message(_response(7, 0, "allowed.test", a + txt, 2))
    assert msg.is_response and msg.rcode == 0 and msg.rcode_text == "NOERROR"
    assert [(r.name, r.rtype, r.ttl, r.data) for r in msg.answers] == [
        ("allowed.test", 1, 60, "198.51.100.10"),
        ("allowed.test", 16, 30, "abcdef"),
    ]
    assert dnswire.dns_verdict(msg) == ("permitted", "rcode NOERROR, 198.51.100.10, abcdef")
    refused = dnswire.parse_message(_response(7, 5, "x.exfil.test"))
    assert refused.rcode_text == "REFUSED" and dnswire.dns_verdict(refused)[0] == "blocked"
    assert dnswire.dns_verdict(dnswire.parse_message(_response(7, 3, "x.exfil.test")))[0] == "blocked"  # NXDOMAIN


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00\x01",  # shorter than a header
        struct.pack("!HHHHHH", 1, 0x8180, 1, 0, 0, 0) + b"\x05ab",  # truncated label
        struct.pack("!HHHHHH", 1, 0x8180, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",  # pointer to itself
        struct.pack("!HHHHHH", 1, 0x8180, 0, 1, 0, 0) + b"\x00" + struct.pack("!HHIH", 1, 1, 1, 4) + b"\x01",
    ],
)
def test_malformed_messages_are_rejected(wire: bytes) -> None:
    with pytest.raises(ValueError):
        dnswire.parse_message(wire)


def test_names_are_checked_and_exfil_labels_split() -> None:
    with pytest.raises(ValueError):
        dnswire.encode_name("a" * 64 + ".test")
    with pytest.raises(ValueError):
        dnswire.encode_name("a..test")
    with pytest.raises(ValueError):
        dnswire.encode_name(".".join(["a" * 60] * 5))
    assert markers.dns_label("Probe_Name-child") == "probe-name-child"
    name = markers.exfil_name("S" * 40, "grandchild", "dns-txt-exfil-grandchild.exfil.test")
    first = name.split(".")
    assert all(len(label) <= 63 for label in first)
    assert "".join(first[:2]) == ("S" * 40).encode().hex() + "-grandchild"
    assert name.endswith(".dns-txt-exfil-grandchild.exfil.test")
    dnswire.encode_name(name)  # valid wire name


# ---- local listeners (127.0.0.1 only) ----------------------------------------------------------------


class Listener:
    """A thread serving one kind of canary on 127.0.0.1 (or a unix address); records what it got."""

    def __init__(self, sock: socket.socket, handler: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.seen: list[bytes] = []
        self._handler = handler
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while True:
                self._handler(self.sock)
        except OSError:
            return

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(2)


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for x in made:
        x.close()


def tcp_server(
    made: list[Listener], reply: bytes | None, family: int = socket.AF_INET, address: Any = ("127.0.0.1", 0)
) -> Listener:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(address)
    s.listen()

    def handle(srv: socket.socket) -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(2)
            lst.seen.append(conn.recv(4096))
            if reply is not None:
                conn.sendall(reply)

    lst = Listener(s, handle)
    made.append(lst)
    return lst


def udp_server(made: list[Listener], reply: Callable[[bytes], bytes]) -> Listener:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))

    def handle(srv: socket.socket) -> None:
        data, peer = srv.recvfrom(4096)
        if not data:  # shut down
            raise OSError("closed")
        lst.seen.append(data)
        srv.sendto(reply(data), peer)

    lst = Listener(s, handle)
    made.append(lst)
    return lst


def test_tcp_probe_sees_canary_reply_with_marker(listeners: list[Listener]) -> None:
    canary = tcp_server(listeners, b"tcp-canary\n")
    rec = run("direct_tcp_ip", {"blocked_ip": "127.0.0.1", "tcp_port": canary.port})
    assert rec["observed"] == "permitted", rec
    assert canary.seen == [b"verify:child:direct_tcp_ip\n"]
    mute = tcp_server(listeners, None)  # accepts and closes, like the proxy refusing a nameless connection
    rec = run("allowed_ip_other_port", {"allowed_ip": "127.0.0.1", "other_port": mute.port}, "daemon")
    assert rec["observed"] == "blocked" and "reply b''" in rec["detail"], rec
    assert mute.seen == [b"verify:daemon:allowed_ip_other_port\n"]


def test_tcp_probe_refused_is_blocked(listeners: list[Listener]) -> None:
    port = tcp_server(listeners, None).port
    listeners.pop().close()
    rec = run("direct_tcp_ip", {"blocked_ip": "127.0.0.1", "tcp_port": port})
    assert rec["observed"] == "blocked" and "ECONNREFUSED" in rec["detail"], rec


def test_udp_probe_echo_and_silence(listeners: list[Listener]) -> None:
    echo = udp_server(listeners, lambda d: d)
    rec = run("udp", {"blocked_ip": "127.0.0.1", "udp_port": echo.port})
    assert rec["observed"] == "permitted" and echo.seen == [b"verify:child:udp\n"], rec
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never answers
    silent.bind(("127.0.0.1", 0))
    try:
        rec = run("quic", {"blocked_ip": "127.0.0.1", "quic_port": silent.getsockname()[1]})
    finally:
        silent.close()
    assert rec["observed"] == "blocked" and "no reply" in rec["detail"], rec


def _dns_answerer(rcode: int) -> Callable[[bytes], bytes]:
    def answer(query: bytes) -> bytes:
        q = dnswire.parse_message(query)
        name = q.questions[0][0]
        body = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 1, 4) + bytes([192, 0, 2, 1]) if rcode == 0 else b""
        return _response(q.id, rcode, name, body, 1 if rcode == 0 else 0)

    return answer


@pytest.mark.parametrize(("rcode", "observed"), [(0, "permitted"), (5, "blocked"), (3, "blocked")])
def test_dns_exchange_udp_and_tcp(listeners: list[Listener], rcode: int, observed: str) -> None:
    udp = udp_server(listeners, _dns_answerer(rcode))
    assert dnswire.dns_verdict(dnswire.dns_exchange("127.0.0.1", "q-child.exfil.test", port=udp.port))[0] == observed
    assert dnswire.parse_message(udp.seen[0]).questions == [("q-child.exfil.test", dnswire.QTYPE_A)]

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()

    def handle(srv: socket.socket) -> None:
        conn, _ = srv.accept()
        with conn:
            size = struct.unpack("!H", conn.recv(2))[0]
            reply = _dns_answerer(rcode)(conn.recv(size))
            conn.sendall(struct.pack("!H", len(reply)) + reply)

    listeners.append(tcp := Listener(s, handle))
    reply = dnswire.dns_exchange("127.0.0.1", "q-child.exfil.test", dnswire.QTYPE_TXT, port=tcp.port, tcp=True)
    assert dnswire.dns_verdict(reply)[0] == observed


def test_dns_exchange_times_out(listeners: list[Listener]) -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(TimeoutError):
            dnswire.dns_exchange("127.0.0.1", "x.test", port=silent.getsockname()[1], timeout=0.3)
    finally:
        silent.close()


def test_unix_socket_probes(listeners: list[Listener], tmp_path: Path) -> None:
    name = f"sandgate-probes-test-{os.getpid()}-{time.monotonic_ns()}"
    abstract = tcp_server(listeners, b"unix-canary\n", socket.AF_UNIX, b"\0" + name.encode())
    rec = run("abstract_unix", {"abstract_socket": name})
    assert rec["observed"] == "permitted" and "unix-canary" in rec["detail"], rec
    assert abstract.seen == [b"verify:child:abstract_unix\n"]
    path = tmp_path / "agent.sock"
    rec = run("path_unix", {"path_socket": str(path)})
    assert rec["observed"] == "blocked" and "hidden" in rec["detail"], rec
    tcp_server(listeners, b"unix-canary\n", socket.AF_UNIX, str(path))
    assert run("path_unix", {"path_socket": str(path)})["observed"] == "permitted"
    rec = run("abstract_unix", {"abstract_socket": name + "-absent"})
    assert rec["observed"] == "blocked" and "ECONNREFUSED" in rec["detail"], rec


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every request (absolute-URI proxy requests and CONNECT included) with the server's canned reply."""

    protocol_version = "HTTP/1.1"

    def handle_any(self) -> None:
        srv: Any = self.server
        srv.seen.append(f"{self.command} {self.path} Host={self.headers.get('Host')}")
        status, body = srv.reply
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_GET = do_CONNECT = handle_any

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[Callable[..., Any]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: int, body: bytes, tls: ssl.SSLContext | None = None) -> Any:
        srv: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        srv.daemon_threads = True
        srv.seen, srv.reply = [], (status, body)
        if tls is not None:
            srv.socket = tls.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(("status", "observed"), [(403, "blocked"), (502, "blocked"), (200, "permitted")])
def test_proxy_probes_through_a_fake_proxy(
    http_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, status: int, observed: str
) -> None:
    proxy = http_server(status, b"from the fake proxy\n")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    rec = run("rebind_metadata", {"ca": "", "rebind_metadata_host": "metadata.test"})
    assert rec["observed"] == observed and f"HTTP {status}" in rec["detail"], rec
    assert proxy.seen == ["GET http://metadata.test/verify/child/rebind_metadata Host=metadata.test"]


def test_proxy_probes_without_proxy_variables_are_unsupported() -> None:
    rec = run("http_proxy_vars", {"ca": "", "allowed_host": "allowed.test"})
    assert rec["observed"] == "unsupported" and "HTTP_PROXY is not set" in rec["detail"], rec


def test_connect_ip_literal_refused_and_accepted(
    http_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    refusing = http_server(403, b"no\n")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{refusing.server_address[1]}")
    rec = run("connect_ip_literal", {"blocked_ip": "192.0.2.20"})  # only ever written into the CONNECT line
    assert rec["observed"] == "blocked" and "403" in rec["detail"], rec
    assert refusing.seen == ["CONNECT 192.0.2.20:443 Host=192.0.2.20:443"]
    accepting = http_server(200, b"")  # says 200, then closes: the tunnel "opened"
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{accepting.server_address[1]}")
    assert run("connect_ip_literal", {"blocked_ip": "192.0.2.20"})["observed"] == "permitted"


@pytest.fixture
def tls_pair(tmp_path: Path) -> tuple[ssl.SSLContext, Path, Path]:
    """Server context for localhost, the CA that signed it, and an unrelated CA."""
    from selftest.certs import CA

    ca, other = CA(), CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    chain, key = ca.issue("localhost", "127.0.0.1").write(tmp_path / "chain.pem", tmp_path / "key.pem")
    server.load_cert_chain(chain, key)
    ca.write_cert(tmp_path / "ca.pem")
    other.write_cert(tmp_path / "other.pem")
    return server, tmp_path / "ca.pem", tmp_path / "other.pem"


def test_https_transparent_and_raw_tls(
    http_server: Callable[..., Any], tls_pair: tuple[ssl.SSLContext, Path, Path]
) -> None:
    server_ctx, ca, other = tls_pair
    srv = http_server(200, b"hello from blocked.test\n", server_ctx)
    host = f"localhost:{srv.server_address[1]}"
    rec = run("https_transparent", {"ca": str(ca), "allowed_host": host})
    assert rec["observed"] == "permitted" and "hello from blocked.test" in rec["detail"], rec
    rec = run("https_transparent", {"ca": str(other), "allowed_host": host})  # untrusted certificate
    assert rec["observed"] == "blocked" and "TLS failed" in rec["detail"], rec
    # The hand-made TLS request used by sni_spoof / blocked_transparent: any SNI, no verification.
    status, body = netio.raw_http(
        "127.0.0.1", srv.server_address[1], "/verify/child/sni_spoof", "allowed.test", sni="allowed.test"
    )
    assert status == 200 and netio.says(body, "blocked.test") and not netio.says(body, "allowed.test")
    assert "GET /verify/child/sni_spoof Host=allowed.test" in srv.seen


# ---- filesystem probes: no sandbox, so every boundary is missing and must be reported -----------------------


@pytest.fixture
def fs_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    ws, home, outside = tmp_path / "ws", tmp_path / "home", tmp_path / "outside"
    for d in (ws / ".git" / "hooks", home / ".ssh", outside):
        d.mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (home / ".ssh" / "id_ed25519").write_text(SECRET + "\n")
    (home / ".bashrc").write_text("# rc\n")
    (outside / "victim.txt").write_text("original\n")
    monkeypatch.chdir(ws)
    return {
        "home": str(home),
        "outside_file": str(outside / "victim.txt"),
        "outside_dir": str(outside),
        "secret_marker": SECRET,
        "secret_env": "SANDGATE_PROBES_TEST_TOKEN",
    }


def test_write_workspace_leaves_nothing(fs_spec: dict[str, Any]) -> None:
    before = sorted(os.listdir("."))
    rec = run("write_workspace", fs_spec)
    assert rec["observed"] == "permitted", rec
    assert sorted(os.listdir(".")) == before
    assert not [n for n in os.listdir("/tmp") if n.startswith(f"sandgate-verify-child-{os.getpid()}")]


def test_write_outside_detects_a_missing_boundary(fs_spec: dict[str, Any]) -> None:
    rec = run("write_outside", fs_spec, "grandchild")
    assert rec["observed"] == "permitted", rec
    outside = Path(fs_spec["outside_dir"])
    assert (outside / "victim.txt").read_text() == "original\n# verify:grandchild:write_outside\n"
    assert (outside / "verify-grandchild.txt").exists()
    assert "write_outside" in (Path(fs_spec["home"]) / ".bashrc").read_text()


def test_git_probes_detect_writable_git(fs_spec: dict[str, Any]) -> None:
    assert run("git_hooks", fs_spec)["observed"] == "permitted"
    assert Path(".git/hooks/pre-commit").read_text() == "# verify:child:git_hooks\n"
    assert run("git_config", fs_spec)["observed"] == "permitted"
    assert Path(".git/config").read_text() == "[core]\n# verify:child:git_config\n"
    rec = run("rename_protected", fs_spec, "daemon")
    assert rec["observed"] == "permitted" and "renamed .git/hooks" in rec["detail"], rec
    assert Path(".git/hooks").is_dir() and not Path(".git/hooks-daemon").exists()  # put back
    assert Path(".git/config").is_file() and not Path(".git-daemon").exists()


def test_git_probes_without_git_are_unsupported(
    fs_spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (bare := tmp_path / "bare").mkdir()
    monkeypatch.chdir(bare)
    for name in ("git_hooks", "git_config", "rename_protected"):
        rec = run(name, fs_spec)
        assert rec["observed"] == "unsupported" and ".git" in rec["detail"], rec


def test_create_protected_creates_and_cleans_up(fs_spec: dict[str, Any]) -> None:
    rec = run("create_protected", fs_spec)
    assert rec["observed"] == "permitted" and "created .sandgate.yaml" in rec["detail"], rec
    assert not Path(".sandgate.yaml").exists() and not Path(".sandgate-probe-child").exists()
    Path(".sandgate.yaml").write_text("version: 1\n")  # an existing policy is opened, never written
    Path(".sandgate").mkdir()
    rec = run("create_protected", fs_spec)
    assert rec["observed"] == "permitted" and "opened for writing" in rec["detail"], rec
    assert Path(".sandgate.yaml").read_text() == "version: 1\n" and os.listdir(".sandgate") == []


def test_link_escapes_detected_and_removed(fs_spec: dict[str, Any]) -> None:
    rec = run("symlink_escape", fs_spec)
    assert rec["observed"] == "permitted", rec
    assert Path(fs_spec["outside_file"]).read_text() == "original\n# verify:child:symlink_escape\n"
    rec = run("hardlink_escape", fs_spec)
    assert rec["observed"] == "permitted", rec
    assert [n for n in os.listdir(".") if n.startswith(("sl-", "hl-"))] == []


def test_read_ssh_key(fs_spec: dict[str, Any]) -> None:
    rec = run("read_ssh_key", fs_spec)
    assert rec["observed"] == "permitted" and SECRET not in rec["detail"], rec
    key = Path(fs_spec["home"]) / ".ssh" / "id_ed25519"
    key.write_text("")  # what a hidden (emptied) key looks like
    assert run("read_ssh_key", fs_spec)["observed"] == "blocked"
    key.unlink()
    rec = run("read_ssh_key", fs_spec)
    assert rec["observed"] == "blocked" and "hidden" in rec["detail"], rec


def test_secret_env(fs_spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDGATE_PROBES_TEST_TOKEN", "s3cr3t-value")
    rec = run("secret_env", fs_spec)
    assert rec["observed"] == "permitted" and "s3cr3t" not in rec["detail"], rec
    monkeypatch.delenv("SANDGATE_PROBES_TEST_TOKEN")
    assert run("secret_env", fs_spec)["observed"] == "blocked"


# ---- harmless process probes (read /proc only) -----------------------------------------------------


def test_read_only_process_probes() -> None:
    rec = run("setuid_gain", {})
    flag = next(
        line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("NoNewPrivs:")
    )
    assert rec["observed"] == ("blocked" if flag == "1" else "permitted") and f"NoNewPrivs: {flag}" in rec["detail"]
    rec = run("proc_root", {})
    assert rec["observed"] in ("permitted", "blocked") and "pids visible" in rec["detail"], rec


# ---- command line and relaying -------------------------------------------------------------------


def test_relay_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.relay_line('{"probe": "udp", "observed": "blocked"}\n')
    assert not runner.relay_line("Traceback (most recent call last):")
    assert not runner.relay_line("   ")
    out, err = capsys.readouterr()
    assert json.loads(out) == {"probe": "udp", "observed": "blocked"}
    assert "not a record" in err


def test_main_runs_selected_probes_and_rejects_bad_specs(
    fs_spec: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(dump_spec(make_spec(**fs_spec, only=("secret_env",))))
    assert runner.main([str(spec), "--context", "grandchild"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["probe"], r["context"], r["observed"]) for r in recs] == [("secret_env", "grandchild", "blocked")]
    assert runner.main([str(spec), "--context", "grandchild", "--only", "nosuch"]) == 2
    spec.write_text("[1, 2]")
    assert runner.main([str(spec)]) == 2
    assert runner.main([str(tmp_path / "missing.json")]) == 2
    capsys.readouterr()
    assert runner.main(["--list"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["group"], x["probe"], x["expected"]) for x in listed] == core.probe_list()


def test_daemon_files() -> None:
    f = runner.DaemonFiles.of(make_spec(results_dir="/r", daemon_token="sgvd.1"))
    assert (str(f.partial), str(f.done), str(f.heartbeat), str(f.log)) == (
        "/r/daemon-sgvd.1.jsonl",
        "/r/daemon-sgvd.1.done.jsonl",
        "/r/daemon-sgvd.1.heartbeat",
        "/r/daemon-sgvd.1.log",
    )


# ---- the v2 host-boundary probes (selftest/probes/host.py): without a sandbox they must see the host ------


def test_markers_carry_the_pass_tag_and_host_probes_are_registered_in_group_order() -> None:
    c = core.Ctx(make_spec(exfil_domain="exfil.test", marker_tag="user"), "daemon", "udp")
    assert (c.path, c.marker, c.dns_name()) == (
        "/verify/daemon-user/udp",
        b"verify:daemon-user:udp\n",
        "udp-daemon-user.exfil.test",
    )
    groups = [g for g, _, _ in core.probe_list()]
    assert groups == sorted(groups, key=core.GROUPS.index)
    names = {n for _, n, _ in core.probe_list()}
    assert {
        "setns_host_netns",
        "netns_tamper",
        "host_loopback_service",
        "open_by_handle",
        "mknod_disk",
        "proc_environ",
        "sysv_shm_host",
        "keyring_read",
        "sethostname",
        "bpf_map",
    } <= names
    assert "gateway_service" not in names  # v2 has no gateway


def test_planted_shm_and_key_are_reached_without_a_sandbox_and_the_host_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    token = f"t{os.getpid()}"
    planted = outside.Planted.plant(token)
    try:
        planted.controls()
        spec = {"shm_id": planted.shm_id, "host_key": planted.key, "host_key_description": planted.key_description}
        spec |= {"marker_tag": "t", "root_dev": (0, 0), "root_dev_path": ""}
        assert planted.evidence(tmp_path, "t") == {}  # nothing touched yet: no false alarm
        rec = run("sysv_shm_host", spec)
        assert rec["observed"] == "permitted" and f"sandgate-verify-shm-{token}" in rec["detail"], rec
        rec = run("keyring_read", spec)
        assert rec["observed"] == "permitted" and "keyctl answered" in rec["detail"], rec
        rec = run("mknod_disk", spec, "grandchild")  # block 0:0: a node nobody can open (ENXIO), safe to make
        assert rec["observed"] == "permitted" and "made sandgate-disk-grandchild-t" in rec["detail"], rec
        seen = planted.evidence(tmp_path, "t")
        assert {("sysv_shm_host", "child"), ("mknod_disk", "grandchild")} <= set(seen), seen
    finally:
        planted.remove()
    with pytest.raises(OSError):  # invalidated (the kernel's collector removes it from /proc/keys soon after)
        syscalls.syscall("keyctl", syscalls.KEYCTL_READ, planted.key, None, 0)
    assert str(planted.shm_id) not in [ln.split()[1] for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]


def test_open_by_handle_reads_the_key_its_path_no_longer_names(fs_spec: dict[str, Any]) -> None:
    key = Path(fs_spec["home"]) / ".ssh" / "id_ed25519"
    spec = {**fs_spec, "ssh_key_handle": outside.file_handle(key)}
    rec = run("open_by_handle", spec)
    assert rec["observed"] == "permitted" and "read the secret" in rec["detail"], rec
    key.rename(key.with_name("moved"))  # the handle names the inode, not the path
    assert "read the secret" in run("open_by_handle", spec)["detail"]


def test_bpf_and_sethostname_succeed_for_root_without_a_sandbox() -> None:
    rec = run("bpf_map", {})
    assert rec["observed"] == "permitted" and "BPF array map" in rec["detail"], rec
    hostname = socket.gethostname()

    def in_own_uts() -> core.Result:  # a private UTS namespace: the host's name is never touched
        os.unshare(os.CLONE_NEWUTS)
        r = run("sethostname", {"marker_tag": "t"})
        return r["observed"], r["detail"]

    observed, detail = syscalls.in_child(in_own_uts)
    assert observed == "permitted" and "verify-child-t" in detail, detail
    assert socket.gethostname() == hostname


def test_proc_environ_finds_a_secret_in_another_process(tmp_path: Path) -> None:
    secret = f"FAKE-SECRET-{os.getpid()}"
    spec = tmp_path / "spec.json"
    spec.write_text(dump_spec(make_spec(secret_marker=secret, visible_env="SANDGATE_T_VISIBLE=yes")))
    argv = [
        sys.executable,
        "-m",
        "selftest.probes",
        str(spec),
        "--context",
        "grandchild",
        "--only",
        "proc_environ",
    ]
    env = {"PYTHONPATH": str(REPO), "SANDGATE_T_VISIBLE": "yes", "PATH": "/usr/bin:/bin"}
    holder = subprocess.Popen(["sleep", "30"], env={"SANDGATE_T_SECRET": secret})
    try:
        rec = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60).stdout)
        assert rec["observed"] == "permitted" and str(holder.pid) in rec["detail"], rec
    finally:
        holder.kill()
        holder.wait()
    rec = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60).stdout)
    assert rec["observed"] == "blocked" and "none holds the secret" in rec["detail"], rec
    del env["SANDGATE_T_VISIBLE"]  # without the control variable it cannot tell
    rec = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60).stdout)
    assert rec["observed"] == "unsupported", rec


def test_host_loopback_service_reaches_a_local_listener(listeners: list[Listener]) -> None:
    canary = tcp_server(listeners, b"tcp-canary\n")
    rec = run("host_loopback_service", {"host_loopback_port": canary.port})
    assert rec["observed"] == "permitted" and canary.seen == [b"verify:child:host_loopback_service\n"], rec


def test_setns_into_the_world_reaches_its_canary(world: Any) -> None:
    canary = world.serve("tcp", "127.0.0.1", 9000, "world-loopback")  # exists only in the world's namespace
    spec = {"world_netns": f"/run/netns/{world.ns}", "blocked_ip": "127.0.0.1", "tcp_port": 9000}
    rec = run("setns_host_netns", spec, "daemon")
    assert rec["observed"] == "permitted" and "tcp-canary" in rec["detail"], rec
    assert canary.wait_for(lambda r: r.get("data") == "verify:daemon:setns_host_netns\n", timeout=5)
    rec = run("setns_host_netns", {**spec, "world_netns": "/run/netns/sandgate-none-such"})
    assert rec["observed"] == "blocked" and "not visible" in rec["detail"], rec


def test_netns_tamper_reports_each_change_and_undoes_it() -> None:
    def in_own_netns() -> core.Result:  # a throwaway network namespace: the host's table and links are never touched
        os.unshare(os.CLONE_NEWNET)
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        subprocess.run(["nft", "add", "table", "inet", "sgtest"], check=True)
        r = run("netns_tamper", {"blocked_ip": "127.0.0.1", "tcp_port": 9, "udp_port": 9})
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        table = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        return r["observed"], f"{r['detail']} | links: {links.count('sgvt')} | tables: {table.strip()}"

    observed, detail = syscalls.in_child(in_own_netns, timeout=30)
    assert observed == "blocked" and "ECONNREFUSED" in detail, detail  # nothing listens: the canary's verdict
    for change in ("nft flush ruleset: done", "ip link add veth: done", "ip route replace default: done"):
        assert change in detail, detail
    assert "links: 0" in detail and "table inet sgtest" in detail, detail  # all undone


# ---- issue 13: the inspection probes, their upstream canaries and their evidence --------------------------------


def _canary(kind: str, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int, Path, Path]:
    """An upstream/git canary on 127.0.0.1 with a certificate for it; (process, port, log, CA file)."""
    from selftest.certs import CA

    ca = CA()
    chain, key = ca.issue("127.0.0.1").write(tmp_path / f"{kind}.pem", tmp_path / f"{kind}.key")
    ca.write_cert(tmp_path / "ca.pem")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / f"{kind}.jsonl"
    args = ["--ip", "127.0.0.1", "--port", str(port), "--log", str(log), "--cert", str(chain), "--key", str(key)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "selftest.canary", kind, *args, *extra],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc, port, log, tmp_path / "ca.pem"


def _records(log: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, log.read_text().split("\n")[:-1]) if r["kind"] == "request"]


def test_the_upstream_canary_records_every_header_and_never_echoes_one(tmp_path: Path) -> None:
    proc, port, log, ca = _canary("upstream", tmp_path, "--name", "api.test")
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=str(ca)))
        conn.request("POST", "/v1/x?q=1", body=b"payload", headers={"Authorization": "Bearer sk-real"})
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
    finally:
        proc.terminate()
        proc.wait(5)
    assert resp.status == 200 and body == b"hello from api.test\n"  # the secret never comes back
    (rec,) = _records(log)
    assert (rec["method"], rec["path"], rec["body"], rec["body_len"]) == ("POST", "/v1/x?q=1", "payload", 7)
    assert rec["headers"]["authorization"] == "Bearer sk-real"


def test_the_git_canary_serves_clone_and_push_through_git_http_backend(tmp_path: Path) -> None:
    from selftest import inspectnet

    bare, head = inspectnet._repository(tmp_path / "git", tmp_path / "seed")
    proc, port, log, ca = _canary("git", tmp_path, "--git-root", str(tmp_path / "git"))
    git = ["git", "-c", f"http.sslCAInfo={ca}"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    url = f"https://127.0.0.1:{port}{inspectnet.REPO_PATH}"
    try:
        subprocess.run([*git, "clone", "-q", url, str(tmp_path / "c")], env=env, check=True, timeout=30)
        (tmp_path / "c" / "f").write_text("x\n")
        ident = ["-c", "user.name=t", "-c", "user.email=t@t.test"]
        subprocess.run(["git", "-C", str(tmp_path / "c"), "add", "f"], env=env, check=True)
        subprocess.run(["git", "-C", str(tmp_path / "c"), *ident, "commit", "-qm", "t"], env=env, check=True)
        push = [*git, "-C", str(tmp_path / "c"), "push", "-q", "origin", "HEAD:refs/heads/pushed"]
        subprocess.run(push, env=env, check=True, timeout=30)
    finally:
        proc.terminate()
        proc.wait(5)
    refs = subprocess.run(["git", "-C", str(bare), "for-each-ref"], capture_output=True, text=True).stdout
    assert "refs/heads/pushed" in refs and head != ""
    paths = [(r["method"], r["path"].split("?")[0]) for r in _records(log)]
    assert ("POST", f"{inspectnet.REPO_PATH}/git-upload-pack") in paths
    assert ("POST", f"{inspectnet.REPO_PATH}/git-receive-pack") in paths  # what the verify policy must refuse


def test_only_sandgates_403_with_its_reason_and_rule_counts_as_a_refusal() -> None:
    from selftest.probes import inspected

    why = inspected.REFUSED
    body = why + b"DELETE /x on api.test: DELETE /x not allowed (rule verify.yaml:14)\n"
    assert inspected.refusal(403, body, why)[0] == "blocked"
    assert inspected.refusal(200, b"hello", why)[0] == "permitted"
    assert inspected.refusal(403, b"Forbidden by upstream", why)[0] == "unsupported"  # not sandgate's
    assert inspected.refusal(403, why + b"no rule named", why)[0] == "unsupported"
    assert inspected.refusal(502, b"bad gateway", why)[0] == "unsupported"  # an upstream error is no refusal


@pytest.fixture
def no_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search reads the environment, this process and the given places, not the machine's /tmp, /run
    and every process's open files (inside a sandbox those are its own)."""
    from selftest.probes import readable

    monkeypatch.setattr(readable, "ROOTS", ())
    monkeypatch.setattr(readable, "pids", lambda: [str(os.getpid())])


def test_secret_brokered_finds_the_real_secret_wherever_it_is_readable(
    fs_spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch, no_roots: None
) -> None:
    import hashlib

    real = "sk-sgreal-" + "ab" * 16
    spec = {
        **fs_spec,
        "cred_env": "SANDGATE_PROBES_TEST_API_KEY",
        "cred_sha256": hashlib.sha256(real.encode()).hexdigest(),
    }
    monkeypatch.setenv("SANDGATE_PROBES_TEST_API_KEY", real)
    rec = run("secret_brokered", spec)
    assert rec["observed"] == "permitted" and "holds the real secret" in rec["detail"], rec
    monkeypatch.setenv("SANDGATE_PROBES_TEST_API_KEY", "sk-sandgate-sentinel-1234")
    (Path(fs_spec["home"]) / ".cache-token").write_text(f"token={real}\n")
    rec = run("secret_brokered", spec)
    assert rec["observed"] == "permitted" and ".cache-token" in rec["detail"], rec
    (Path(fs_spec["home"]) / ".cache-token").unlink()
    # A descriptor left open on an unlinked file (a memfd, a deleted temp file) is readable too.
    import tempfile

    with tempfile.TemporaryFile() as held:
        held.write(f"{real}\n".encode())
        held.flush()
        rec = run("secret_brokered", spec)
    assert rec["observed"] == "permitted" and f"/proc/{os.getpid()}/fd/" in rec["detail"], rec
    monkeypatch.delenv("SANDGATE_PROBES_TEST_API_KEY")
    assert run("secret_brokered", spec)["observed"] == "unsupported"  # no sentinel: an SDK would not start


def test_ca_key_hidden_finds_the_key_of_a_trusted_ca_only(
    fs_spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_roots: None
) -> None:
    from launcher.run.inspection import new_ca

    trusted, other = new_ca("t", ("a.test",)), new_ca("t", ("b.test",))  # PEM pairs, as the spec carries them
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(trusted.cert)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
        monkeypatch.delenv(var, raising=False)
    home = Path(fs_spec["home"])
    (home / "unrelated.pem").write_text(other.key)
    rec = run("ca_key_hidden", fs_spec)
    assert rec["observed"] == "blocked" and "1 private key(s)" in rec["detail"], rec
    # The run's CA key as a JSON spec would carry it (escaped newlines) is found and matched.
    (home / "spec.json").write_text(json.dumps({"key": trusted.key}))
    rec = run("ca_key_hidden", fs_spec)
    assert rec["observed"] == "permitted" and "spec.json" in rec["detail"], rec


def test_a_row_whose_outside_evidence_is_missing_fails() -> None:
    from selftest.judge import judge

    class NoWorld:
        servers: tuple[Any, ...] = ()
        dns = None

    r: core.Record = {
        "group": "network",
        "probe": "secret_brokered",
        "context": "child",
        "expected": "blocked",
        "observed": "blocked",
        "detail": "sentinel inside",
    }
    assert judge(NoWorld(), r, "root", {}).ok  # type: ignore[arg-type]
    row = judge(NoWorld(), r, "root", {}, {("secret_brokered", "child"): "the upstream got no secret"})  # type: ignore[arg-type]
    assert not row.ok and "the upstream got no secret" in row.evidence
    row = judge(NoWorld(), r, "root", {("secret_brokered", "*"): "the audit log holds it"})  # type: ignore[arg-type]
    assert not row.ok and row.observed == "permitted"


def test_attempted_leaks_must_each_be_in_the_audit_log(tmp_path: Path) -> None:
    from netguard import audit
    from selftest import inspectnet

    base = markers.http_path("child-root", "sentinel_leak")

    def log(name: str, *records: tuple[str, str | None]) -> Path:
        """A real audit log (netguard.audit's writer), read back by its one reader."""
        lines = [
            audit.request_record("t", "i", "connect", "deny", "api.test", 443, "GET", path, status=403, leak=leak)
            for path, leak in records
        ]
        (p := tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
        return p

    complete = log("complete", *((f"{base}/{x}", inspectnet.CRED_ENV) for x in ("header", "query", "plain")))
    assert inspectnet._leak_unrecorded(inspectnet._attempted_leaks(complete), "child-root") == ""
    partial = log("partial", (f"{base}/header", inspectnet.CRED_ENV), (f"{base}/query", None))
    why = inspectnet._leak_unrecorded(inspectnet._attempted_leaks(partial), "child-root")
    assert f"{base}/query" in why and f"{base}/plain" in why and f"{base}/header," not in why
    # A log that is not one (a forged line before the last) shows no refusal: every path is missing.
    (forged := tmp_path / "forged").write_text(complete.read_text().replace("\n", "\nnot json\n", 1))
    assert inspectnet._attempted_leaks(forged) == set()
    assert inspectnet._attempted_leaks(tmp_path / "absent") == set()
