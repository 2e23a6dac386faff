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
            env={**c.clean_env(), "PYTHONPATH": str(c.REPO)},
            pass_fds=(w,),
        )
        os.close(w)
        c._wait_ready_fd(proc, r, c.READY_TIMEOUT, "sandgate proxy")
        yield Proxy2(port, transparent_port, proc, audit, ca)
    finally:
        if proc is not None:
            c._stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
