"""A private network namespace for one benchmark run, and the proxy with a transparent listener in it.

The transparent rows need an nftables redirect, which must never touch the host's ruleset: the
script re-executes itself under `unshare --net` (as root; `-r` adds a user namespace otherwise),
so the redirect, the servers and the proxy live in a namespace that only has `lo` and vanishes
with the run. The redirect matches the source address 127.0.0.3 only: the bench's "transparent"
clients bind it, the proxy's own upstream connections (from 127.0.0.1) are never looped back.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import _common as c

MARK = "SANDGATE_BENCH_NETNS"
CLIENT_IP = "127.0.0.3"  # the source address whose connections are redirected to the transparent listener


def reexec_in_netns() -> None:
    """Run this script again in a fresh network namespace (returns only if that is not possible)."""
    if os.environ.get(MARK) or shutil.which("unshare") is None:
        return
    cmd = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "-r", "--net"]
    env = {**os.environ, MARK: "1"}
    sys.stdout.flush()
    os.execvpe(cmd[0], [*cmd, "--", sys.executable, *sys.argv], env)


def in_private_netns() -> bool:
    return bool(os.environ.get(MARK))


def setup_redirect(ports: list[int], transparent_port: int) -> bool:
    """`lo` up and the redirect for CLIENT_IP; False if this namespace cannot have it (no nft, no privilege)."""
    if not in_private_netns():
        return False  # never on the host's own ruleset
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    rules = (
        "table ip sandgate_bench {\n chain out {\n  type nat hook output priority -100;\n"
        f"  ip saddr {CLIENT_IP} tcp dport {{ {', '.join(map(str, ports))} }} redirect to :{transparent_port}\n"
        " }\n}\n"
    )
    r = subprocess.run(["nft", "-f", "-"], input=rules, text=True, capture_output=True, check=False)
    return r.returncode == 0


def lo_up() -> None:
    if in_private_netns():
        subprocess.run(["ip", "link", "set", "lo", "up"], check=False)


DUMMY = "sgbench0"


def add_server_address() -> bool:
    """c.SANDBOX_SERVER_IP on a dummy link of this private namespace: an address a sandbox (whose
    127.0.0.1 is its own) reaches through the daemon, as the e2e worlds' 198.18.x hosts. Never on the host."""
    if not in_private_netns():
        return False
    for link_type in ("dummy", "ifb", "bridge"):  # kernels without CONFIG_DUMMY: as selftest/world.py
        if subprocess.run(["ip", "link", "add", DUMMY, "type", link_type], capture_output=True).returncode == 0:
            break
    else:
        return False
    for cmd in (
        ["ip", "addr", "add", f"{c.SANDBOX_SERVER_IP}/32", "dev", DUMMY],
        ["ip", "link", "set", DUMMY, "up"],
    ):
        if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
            return False
    return True


@dataclass
class Proxy2:
    """`sandgate proxy` with an explicit and a transparent listener, from this checkout."""

    port: int
    transparent: int
    proc: subprocess.Popen[bytes]
    audit_log: Path
    ca_pem: Path | None = None  # the proxy's CA (clients of the inspected host trust it)

    @property
    def url(self) -> str:
        return f"http://{c.LOOPBACK}:{self.port}"

    def cpu_seconds(self) -> float:
        """utime + stime of the proxy process and its relay workers so far (/proc/PID/stat, clock ticks)."""
        ticks = 0
        for pid in c.process_tree(self.proc.pid):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def memory_kib(self) -> dict[str, int]:
        return c.Proxy(self.port, self.proc, self.audit_log).memory_kib()

    def reset_peak(self) -> bool:
        return c.Proxy(self.port, self.proc, self.audit_log).reset_peak()


@contextlib.contextmanager
def proxy_with_transparent(
    allowed_ports: list[int], transparent_port: int, inspect: tuple[int, c.Certs] | None = None
) -> Iterator[Proxy2]:
    """Like _common.sandgate_proxy (inspect: the same), plus `--transparent`; PYTHONPATH pins the proxy
    to this checkout."""
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-bench-proxy-"))
    proc = None
    try:
        policy = tmp / "policy.yaml"
        policy.write_text(c.policy_yaml(allowed_ports, inspect[0] if inspect else None))
        audit = tmp / "audit.jsonl"
        port = c.free_port()
        r, w = os.pipe()
        listen = ["--listen", f"{c.LOOPBACK}:{port}", "--transparent", f"{c.LOOPBACK}:{transparent_port}"]
        ca = tmp / "proxy-ca.pem" if inspect is not None else None
        if inspect is not None:
            listen += ["--upstream-ca", str(inspect[1].ca_pem), "--ca-cert", str(ca)]
        proc = subprocess.Popen(
            [c.SANDGATE, "proxy", "--policy", str(policy), *listen, "--audit-log", str(audit), "--ready-fd", str(w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=tmp,
            env={**c.clean_env(), "PYTHONPATH": str(c.CHECKOUT)},
            pass_fds=(w,),
        )
        os.close(w)
        c._wait_ready_fd(proc, r, c.READY_TIMEOUT, "sandgate proxy")
        yield Proxy2(port, transparent_port, proc, audit, ca)
    finally:
        if proc is not None:
            c._stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


class Unavailable(RuntimeError):
    """This namespace cannot have what the benchmark needs (no nft redirect, no dummy link)."""


def enter(script: str) -> bool:
    """Re-exec in a private network namespace with `lo` up; False (said on stdout) where that or curl is missing."""
    reexec_in_netns()
    if not in_private_netns() or shutil.which("curl") is None:
        print(f"{script} needs unshare (a private network namespace), nft and curl; skipped")
        return False
    lo_up()
    return True


@contextlib.contextmanager
def servers_and_proxy() -> Iterator[tuple[c.Servers, Proxy2]]:
    """The local servers on 127.0.0.1 and one proxy with every path to them: explicit, transparent (the
    redirect of CLIENT_IP) and inspected (c.INSPECTED on the HTTPS port). Unavailable without the redirect."""
    transparent = c.free_port()
    with c.local_servers() as srv:
        ports = [srv.http_port, srv.https_port]
        if not setup_redirect(ports, transparent):
            raise Unavailable("no nftables redirect in this namespace")
        with proxy_with_transparent(ports, transparent, (srv.https_port, srv.certs)) as px:
            yield srv, px
