"""HARNESS of the Windows redirect code path, run on Linux through eBPFDivert: NOT evidence of
Windows behaviour (WinDivert, WFP and the job object are not involved; docs/windows.md says what
has run where). It runs netguard/windows/redirect.py for real, as on Windows: a SOCKET-layer
sniff handle learns who connects, a NETWORK-layer handle reflects the job's SYNs into a local
stand-in for the proxy, passes other processes' flows unchanged, and drops SYNs of unknown owner.

Isolation (eBPFDivert attaches host-wide unless confined): a child process joins a fresh cgroup,
enters a `sandgate-divert-*` network namespace (a veth to a second one playing the internet), and
unshares mount + cgroup namespaces with a private cgroup2, bpffs and /run, so the programs see
only that subtree and those namespaces. Everything is removed in teardown, also on failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
HOST_ADDR, NET_ADDR, DST_PORT, PROXY_PORT = "10.77.0.1", "10.77.0.2", 80, 3129
UNKNOWN_SPORT, CONTROL_SPORT = 45678, 45679
MS_REC, MS_PRIVATE = 0x4000, 1 << 18

#: The fake internet: a server on NET_ADDR:80 and a raw observer of every SYN that arrives.
INTERNET = r"""
import json, socket, sys, threading
seen, accepted = [], []
def observe():
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    while True:
        b = raw.recv(65535)
        ihl = (b[0] & 15) * 4
        if int.from_bytes(b[ihl + 2:ihl + 4], "big") == 80 and b[ihl + 13] & 0x12 == 0x02:
            seen.append(int.from_bytes(b[ihl:ihl + 2], "big"))
def serve(s):
    while True:
        c, _ = s.accept(); accepted.append(1); c.sendall(b"internet"); c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("10.77.0.2", 80)); s.listen(8)
threading.Thread(target=observe, daemon=True).start(); threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True); sys.stdin.read()
print(json.dumps({"syn_ports": seen, "accepted": len(accepted)}), flush=True)
"""
#: A client: connects when told, prints what it got.
CLIENT = r"""
import socket, sys
sys.stdin.readline()
try:
    c = socket.create_connection(("10.77.0.2", 80), timeout=5); print(c.recv(100).decode(), flush=True)
except OSError as e:
    print(f"error {e}", flush=True)
"""


def bpf_missing() -> str | None:
    """Why this kernel cannot run eBPFDivert, or None (the only reason this test may skip)."""
    if not Path("/sys/kernel/btf/vmlinux").exists():
        return "kernel without BTF (/sys/kernel/btf/vmlinux): eBPFDivert's CO-RE programs cannot load"
    from pydivert.bpf import libebpfdivert

    if libebpfdivert is None:
        return "libebpfdivert did not load on this machine"
    if not _cgroup2_mount():
        return "no cgroup2 mount: the SOCKET layer needs cgroup v2"
    return None


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.startswith("cgroup2 "):
            return Path(pre.split()[4])
    return None


@dataclass(frozen=True)
class Harness:
    host_ns: str
    net_ns: str
    cgroup: Path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def harness() -> Iterator[Harness]:
    reason = bpf_missing()
    if reason:
        print(f"SKIP divert harness: {reason}")
        pytest.skip(reason)
    assert os.geteuid() == 0, "the divert harness needs root (namespaces, cgroups, BPF)"
    tag = f"{os.getpid()}x{uuid.uuid4().hex[:6]}"
    h = Harness(f"sandgate-divert-{tag}-h", f"sandgate-divert-{tag}-n", _cgroup_base() / f"sandgate-divert-{tag}")
    try:
        _ip("netns", "add", h.host_ns)
        _ip("netns", "add", h.net_ns)
        _ip("-n", h.host_ns, "link", "add", "sgdv0", "type", "veth", "peer", "name", "sgdv1", "netns", h.net_ns)
        _ip("-n", h.host_ns, "addr", "add", f"{HOST_ADDR}/24", "dev", "sgdv0")
        _ip("-n", h.net_ns, "addr", "add", f"{NET_ADDR}/24", "dev", "sgdv1")
        for ns, dev in ((h.host_ns, "sgdv0"), (h.net_ns, "sgdv1")):
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        h.cgroup.mkdir()
        yield h
    finally:
        for ns in (h.host_ns, h.net_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)
        if h.cgroup.exists():
            kill = h.cgroup / "cgroup.kill"  # only processes we started are in it (Linux 5.14+)
            if kill.exists():
                kill.write_text("1")
            for _ in range(50):  # the last process may take a moment to leave
                try:
                    h.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def _cgroup_base() -> Path:
    mount = _cgroup2_mount()
    assert mount is not None
    own = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::"))
    return mount / own[3:].lstrip("/")


def _mount(src: str, target: str, fstype: str | None, flags: int = 0) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None, flags, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}")


def _confine(h: Harness) -> subprocess.Popen[str]:
    """Join the cgroup and the host namespace, start the internet, then private mount/cgroup views."""
    (h.cgroup / "cgroup.procs").write_text(str(os.getpid()))
    fd = os.open(f"/run/netns/{h.host_ns}", os.O_RDONLY)
    os.setns(fd, os.CLONE_NEWNET)
    os.close(fd)
    internet = subprocess.Popen(
        ["ip", "netns", "exec", h.net_ns, sys.executable, "-c", INTERNET],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert internet.stdout is not None and internet.stdout.readline().strip() == "ready"
    os.unshare(os.CLONE_NEWNS | os.CLONE_NEWCGROUP)
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/sys/fs/cgroup", "tmpfs")  # only our subtree from here on
    os.mkdir("/sys/fs/cgroup/unified")
    _mount("cgroup2", "/sys/fs/cgroup/unified", "cgroup2")
    _mount("bpf", "/sys/fs/bpf", "bpf")
    _mount("tmpfs", "/run", "tmpfs")  # eBPFDivert's lock and pins stay ours
    return internet


def _raw_syn(sport: int) -> None:
    import pydivert

    p = pydivert.PacketBuilder().ipv4(HOST_ADDR, NET_ADDR).tcp(sport, DST_PORT).build()
    p.tcp.syn = True
    p.tcp.window_size = 1024
    p.recalculate_checksums()
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:
        s.sendto(bytes(p.raw), (NET_ADDR, 0))


def _client() -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ask(c: subprocess.Popen[str]) -> str:
    out, _ = c.communicate("go\n", timeout=15)
    return out.strip()


def host_side(host_ns: str, net_ns: str, cgroup: str) -> None:
    """The child: stands in for the Windows host (proxy, redirect loop, the job's and others' processes)."""
    import pydivert

    from netguard.windows import divertfilter, owners, redirect

    internet = _confine(Harness(host_ns, net_ns, Path(cgroup)))
    _raw_syn(CONTROL_SPORT)  # before any handle: the observer must see this one
    proxy = socket.create_server(("0.0.0.0", PROXY_PORT))
    job: set[int] = set()
    filters = divertfilter.plan_filters(PROXY_PORT)
    events = pydivert.Divert(filters.socket, pydivert.Layer.SOCKET, flags=pydivert.Flag.SNIFF | pydivert.Flag.RECV_ONLY)
    network = pydivert.Divert(filters.network)

    def look(pid: int) -> owners.Held:  # outside the job: another user's (the harness has one user)
        return owners.Held(owners.Owner("job" if pid in job else "outside", "S-1-5-21-0-0-0-1001"))

    with events, network:
        r = redirect.Redirector(network, events, PROXY_PORT, owners.Owners(look, "S-1-5-21-0-0-0-1002"))
        stop = threading.Event()
        threading.Thread(target=r.serve, args=(stop,), daemon=True).start()
        threading.Thread(target=_proxy, args=(proxy, r), daemon=True).start()
        member, other = _client(), _client()
        job.add(member.pid)  # before it connects: it waits for our word
        results: dict[str, object] = {"member": _ask(member), "other": _ask(other)}
        _raw_syn(UNKNOWN_SPORT)  # no connect event: unknown owner
        time.sleep(0.5)
        stop.set()
        c = r.counters
        results["counters"] = {"reflect": c.reflect, "pass": c.passed, "drop": c.drop, "return": c.returned}
    out, _ = internet.communicate("", timeout=10)
    results["internet"] = json.loads(out)
    print("RESULT " + json.dumps(results), flush=True)


def _proxy(server: socket.socket, r: object) -> None:
    """The proxy's stand-in: answers with the original destination the redirect loop kept for it."""
    from netguard.windows import redirect

    assert isinstance(r, redirect.Redirector)
    while True:
        conn, (peer, port) = server.accept()
        o = r.original(peer, port)
        conn.sendall(f"proxy {o.dst_addr}:{o.dst_port}".encode() if o else b"proxy unknown")
        conn.close()


def test_redirect_loop_reflects_job_flows_passes_others_and_drops_unknown_owners(harness: Harness) -> None:
    code = f"from tests.e2e.test_divert_harness_e2e import host_side; host_side({harness.host_ns!r}, {harness.net_ns!r}, {str(harness.cgroup)!r})"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"harness child failed:\n{p.stdout}\n{p.stderr}"
    res = json.loads(lines[-1].removeprefix("RESULT "))
    # The job's flow reached the proxy, which knew where it was going; it never reached the internet.
    assert res["member"] == f"proxy {NET_ADDR}:{DST_PORT}", res
    # Someone else's flow went out unchanged.
    assert res["other"] == "internet", res
    assert res["internet"]["accepted"] == 1, res
    # Unknown owner: dropped; the control SYN (sent before the loop) proves the observer sees raw SYNs.
    assert CONTROL_SPORT in res["internet"]["syn_ports"], res
    assert UNKNOWN_SPORT not in res["internet"]["syn_ports"], res
    assert res["counters"]["reflect"] >= 1 and res["counters"]["return"] >= 1 and res["counters"]["drop"] >= 1, res
