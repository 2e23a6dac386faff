"""launcher/approvals/whoasked.py: socket table parsing (pure) and, in a network namespace of our own, the real lookup.

The real tests need root and ip(8); like the other namespace tests they fail, never skip, without
them. Everything they run stays on the loopback of the namespace they create (`sandgate-wa<pid>`),
every process they start is killed through its Popen, and the namespace is deleted even on failure.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from launcher.approvals.whoasked import CMDLINE_MAX, Asker, find_asker, parse_proc_net

# ---------------------------------------------------------------- pure: parse_proc_net

# Hand-written in the kernel's format (little-endian host): address words and port in hex.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1002 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 20 4 30 10 -1
   3: 0200000A:C350 0100000A:01BB 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 20 4 30 10 -1
   4: 0100007F:D431 0100007F:1F90 06 00000000:00000000 03:00000F9B 00000000     0        0 0 3 0000000000000000
"""
# ::ffff:127.0.0.1 is 00000000 00000000 FFFF0000 0100007F; fd00::2 is 000000FD 00000000 00000000 02000000;
# ::1 is ... 01000000; :: is all zeros.
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:C351 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2002 1 0000000000000000 20 4 30 10 -1
   2: 000000FD000000000000000002000000:C352 000000FD000000000000000001000000:01BB 01 00000000:00000000 00:00000000 00000000     0        0 2003 1 0000000000000000 20 4 30 10 -1
   3: 00000000000000000000000001000000:C353 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2004 1 0000000000000000 20 4 30 10 -1
"""


def parse(text: str, ip: str, port: int, **kw: bool) -> list[int]:
    return parse_proc_net(text, ip, port, byteorder="little", **kw)


def test_ipv4_local_address_only() -> None:
    # The client's socket (local :50000); the server's accepted socket has 50000 as its REMOTE port.
    assert parse(TCP, "127.0.0.1", 50000) == [1002]
    assert parse(TCP, "10.0.0.2", 50000) == [1004]
    assert parse(TCP, "10.0.0.1", 443) == []  # a remote address is never matched


def test_ipv4_several_sockets_on_one_local_address() -> None:
    # The listener and the accepted connection both have local 127.0.0.1:8080.
    assert parse(TCP, "127.0.0.1", 8080) == [1001, 1003]


def test_inode_zero_and_wrong_ip_or_port() -> None:
    assert parse(TCP, "127.0.0.1", 0xD431) == []  # TIME_WAIT: owned by nobody
    assert parse(TCP, "127.0.0.2", 50000) == []
    assert parse(TCP, "127.0.0.1", 50001) == []


def test_tcp6_ipv4_mapped_matches_plain_and_mapped_ipv4() -> None:
    assert parse(TCP6, "127.0.0.1", 50001) == [2002]
    assert parse(TCP6, "::ffff:127.0.0.1", 50001) == [2002]
    # ...and a mapped query finds a plain IPv4 socket too.
    assert parse(TCP, "::ffff:10.0.0.2", 50000) == [1004]


def test_tcp6_native_ipv6() -> None:
    assert parse(TCP6, "fd00::2", 50002) == [2003]
    assert parse(TCP6, "FD00:0:0::2", 50002) == [2003]
    assert parse(TCP6, "::1", 50003) == [2004]
    assert parse(TCP6, "fd00::1", 443) == []  # remote
    assert parse(TCP6, "::1", 50002) == []


def test_wildcard_only_when_asked() -> None:
    assert parse(TCP6, "::1", 8080) == []
    assert parse(TCP6, "::1", 8080, wildcard=True) == [2001]
    assert parse(TCP6, "10.1.2.3", 8080, wildcard=True) == [2001]
    assert parse(TCP, "127.0.0.1", 50000, wildcard=True) == [1002]  # specific matches still count
    udp = "   5: 00000000:D6D8 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 3001 2 0 0\n"
    assert parse(udp, "10.0.0.2", 0xD6D8) == []
    assert parse(udp, "10.0.0.2", 0xD6D8, wildcard=True) == [3001]


def test_big_endian_host() -> None:
    line = "   0: 7F000001:C350 7F000001:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4001 1 0\n"
    assert parse_proc_net(line, "127.0.0.1", 50000, byteorder="big") == [4001]
    assert parse_proc_net(line, "127.0.0.1", 50000, byteorder="little") == []


def test_malformed_lines_and_header_are_skipped() -> None:
    text = (
        "garbage\n\n   0: 0100007F:ZZZZ 0 0 0 0 0 0 0 5\n"
        "   1: 0100007F:C35 00000000:0000 0A 0 0 0 0 0 6\n"
        "   2: 0100007F:C350 00000000:0000 0A 0 0 0 0 0 x\n"
        "   3: 0100007F:C350 00000000:0000 01 0 0 0 0 0 7\n"
        "   4: 0100007F:C350 00000000:0000 01 0 0 0 0 0 7\n"
    )
    assert parse(text, "127.0.0.1", 50000) == [7]  # no duplicate either
    assert parse("", "127.0.0.1", 50000) == []


def test_invalid_ip_raises_in_the_pure_parser() -> None:
    with pytest.raises(ValueError):
        parse(TCP, "not-an-ip", 80)


def test_find_asker_never_raises_on_bad_input() -> None:
    me = os.getpid()
    assert find_asker(me, "not-an-ip", 80) is None
    assert find_asker(me, "127.0.0.1", 80, proto="raw") is None
    assert find_asker(me, "127.0.0.1", 70000) is None
    assert find_asker(0, "127.0.0.1", 80) is None
    assert find_asker(-1, "127.0.0.1", 80) is None


# ---------------------------------------------------------------- real: a namespace of our own

SERVER = r"""
import socket, sys, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
srv.settimeout(30)
conns = []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        conns.append(srv.accept()[0])
    except OSError:
        break
time.sleep(max(0.0, deadline - time.monotonic()))
"""

# Connects to the server (TCP), "connects" a UDP socket to it (no datagram is sent) and binds an
# unconnected UDP socket to the wildcard address, like a resolver using sendto; then reports and sleeps.
CLIENT = r"""
import json, os, socket, sys, time
port = int(sys.argv[1])
tcp = socket.create_connection(("127.0.0.1", port), timeout=10)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.connect(("127.0.0.1", port))
wild = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
wild.bind(("0.0.0.0", 0))
six = None
try:
    six = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    six.settimeout(10)
    six.connect(("::ffff:127.0.0.1", port))
    six_port = six.getsockname()[1]
except OSError:
    six_port = None
print(json.dumps({"pid": os.getpid(), "tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1],
                  "wild": wild.getsockname()[1], "six": six_port}), flush=True)
time.sleep(60)
"""


@dataclass
class Netns:
    name: str
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, script: str, *args: str) -> subprocess.Popen[str]:
        """`ip netns exec` setns()es and then execs the program: the Popen pid is the python's own pid."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-c", script, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc


def _readline(proc: subprocess.Popen[str], timeout: float = 15.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from pid {proc.pid} within {timeout}s (exit code {proc.poll()})"
    line = proc.stdout.readline()
    assert line, f"pid {proc.pid} exited without output (exit code {proc.wait()})"
    return line


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail(f"the whoasked namespace tests need root and ip(8); euid={os.geteuid()}", pytrace=False)
    ns = Netns(f"sandgate-wa{os.getpid()}")
    subprocess.run(["ip", "netns", "add", ns.name], check=True)
    try:
        subprocess.run(["ip", "-n", ns.name, "link", "set", "lo", "up"], check=True)
        yield ns
    finally:
        for proc in ns.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        subprocess.run(["ip", "netns", "delete", ns.name], check=True)
        assert ns.name not in _netns_list().split()


@dataclass
class Pair:
    server: subprocess.Popen[str]
    server_port: int
    client: subprocess.Popen[str]
    ports: dict[str, int | None]

    def port(self, name: str) -> int:
        """The client's source port of one kind; only "six" may be missing (checked where used)."""
        port = self.ports[name]
        assert port is not None, f"the client opened no {name} socket"
        return port


@pytest.fixture(scope="module")
def pair(netns: Netns) -> Pair:
    server = netns.start(SERVER)
    server_port = int(_readline(server))
    client = netns.start(CLIENT, str(server_port))
    info = json.loads(_readline(client))
    assert info["pid"] == client.pid  # ip netns exec really exec'd the python
    return Pair(server, server_port, client, info)


def _expected(pid: int, server_port: int) -> Asker:
    with open(f"/proc/{pid}/comm") as f:
        name = f.read().rstrip("\n")
    assert name == os.path.basename(sys.executable)[:15]  # "python3", "python", ... as exec'd
    cmdline = f"{sys.executable} -c {CLIENT} {server_port}"[:CMDLINE_MAX]
    return Asker(pid=pid, name=name, cmdline=cmdline, exe=os.readlink(f"/proc/{pid}/exe"))


def test_the_label_is_the_executable_and_a_chosen_name_is_marked_as_the_processs_claim() -> None:
    """prctl(PR_SET_NAME, "pip") once made a question read `asked_by: pip[...]` (issue 22)."""
    assert Asker(7, "curl", "curl x", "/usr/bin/curl").label() == "/usr/bin/curl[7]"
    assert (
        Asker(7, "pip", "pip install", "/usr/bin/python3.12").label() == '/usr/bin/python3.12[7] (calls itself "pip")'
    )
    assert Asker(7, "very-long-name-", "", "/opt/very-long-name-of-tool").label() == "/opt/very-long-name-of-tool[7]"
    assert Asker(7, "pip", "", "").label() == "pip[7] (name chosen by the process)"


def test_finds_the_client_by_its_tcp_source_port(pair: Pair) -> None:
    # Named by the SERVER's pid: any process of the namespace names it.
    asker = find_asker(pair.server.pid, "127.0.0.1", pair.port("tcp"))
    assert asker == _expected(pair.client.pid, pair.server_port)
    assert asker is not None and asker.name != "ip"
    # The client's own pid names the same namespace.
    assert find_asker(pair.client.pid, "127.0.0.1", pair.port("tcp")) == asker


def test_the_server_side_is_the_server(pair: Pair) -> None:
    asker = find_asker(pair.client.pid, "127.0.0.1", pair.server_port)
    assert asker is not None and asker.pid == pair.server.pid


def test_udp_connected_and_wildcard_sockets(pair: Pair) -> None:
    expected = _expected(pair.client.pid, pair.server_port)
    assert find_asker(pair.server.pid, "127.0.0.1", pair.port("udp"), proto="udp") == expected
    # Unconnected, bound to 0.0.0.0: its datagrams leave from the namespace's address and that port.
    wild = find_asker(pair.server.pid, "10.99.0.2", pair.port("wild"), proto="udp")
    assert wild is not None and wild.pid == pair.client.pid
    # ...but a TCP lookup never falls back to the wildcard.
    assert find_asker(pair.server.pid, "10.99.0.2", pair.port("wild"), proto="tcp") is None


def test_dual_stack_socket_is_found_with_the_plain_ipv4_address(pair: Pair) -> None:
    if pair.ports["six"] is None:
        pytest.fail("the client could not open an AF_INET6 socket to ::ffff:127.0.0.1", pytrace=False)
    asker = find_asker(pair.server.pid, "127.0.0.1", pair.port("six"))
    assert asker is not None and asker.pid == pair.client.pid
    assert find_asker(pair.server.pid, "::ffff:127.0.0.1", pair.port("six"), proto="tcp6") == asker
    assert find_asker(pair.server.pid, "127.0.0.1", pair.port("six"), proto="udp") is None


def test_a_port_nobody_uses(pair: Pair) -> None:
    used = {pair.server_port, *(p for p in pair.ports.values() if isinstance(p, int))}
    unused = next(p for p in range(1, 1024) if p not in used)
    assert find_asker(pair.server.pid, "127.0.0.1", unused) is None
    assert find_asker(pair.server.pid, "127.0.0.1", unused, proto="udp") is None


def test_the_host_namespace_does_not_see_the_sandbox_socket(pair: Pair) -> None:
    # In the host's namespace the same ip:port is (almost surely) nobody's, and never the client's.
    asker = find_asker(os.getpid(), "127.0.0.1", pair.port("tcp"))
    assert asker is None or asker.pid != pair.client.pid


def test_a_dead_netns_pid(pair: Pair) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=10)
    assert find_asker(gone.pid, "127.0.0.1", pair.port("tcp")) is None
    with open("/proc/sys/kernel/pid_max") as f:
        beyond = int(f.read()) + 1  # can never exist
    assert find_asker(beyond, "127.0.0.1", pair.port("tcp")) is None


def test_after_the_client_exits_nobody_owns_the_port(netns: Netns, pair: Pair) -> None:
    # A client of its own, so that the module's shared one stays alive whatever the test order.
    client = netns.start(CLIENT, str(pair.server_port))
    port = json.loads(_readline(client))["tcp"]
    asker = find_asker(pair.server.pid, "127.0.0.1", port)
    assert asker is not None and asker.pid == client.pid
    client.kill()
    client.wait(timeout=10)
    deadline = time.monotonic() + 5
    while (asker := find_asker(pair.server.pid, "127.0.0.1", port)) is not None:
        assert time.monotonic() < deadline, asker
        time.sleep(0.05)
