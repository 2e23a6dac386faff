#!/usr/bin/env python3
"""Many concurrent tunnels through one daemon: --n CONNECT tunnels across --sandboxes sandboxes, all open at once.

What: one `python -m netguard.daemon` daemon (this checkout), --sandboxes bindings made as the
launcher makes them (listeners on 127.0.0.1 passed over the control socket), an asyncio upstream
on 127.0.0.1, and an asyncio client that opens --n tunnels spread evenly over the sandboxes'
explicit listeners; each tunnel sends a line, and only when every tunnel has its greeting (all
--n are open at once, spliced) does each read --kib KiB and close. An error is any tunnel that
did not deliver every byte. Prints the RSS of the daemon and of its relay workers (the processes
holding spliced flows' sockets: netguard.relay.relaypool) after start, after the binds and with
every tunnel open, their fds, and from those the cost per sandbox and per connection; the last line
is `RESULT <n> <errors>` for bench/datapath.py. Runs in a private network namespace (bench/_netns.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as c
import _netns as ns

sys.path.insert(0, str(c.REPO))
from netguard.daemon.control import ControlClient
from netguard.policy import parse_network  # after the path: this checkout's netguard
from netguard.spec import BindingSpec

GREETING = b"ready\n"


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _workers(pid: int) -> list[int]:
    """The daemon's children: its relay workers."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _snapshot(pid: int) -> tuple[float, float, int, list[int]]:
    """(daemon RSS KiB, workers' RSS KiB, daemon fds, each worker's fds)."""
    ws = _workers(pid)
    return _rss_kib(pid), float(sum(_rss_kib(w) for w in ws)), _fds(pid), [_fds(w) for w in ws]


def _fd_limit(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    return " ".join(line.split()[3:5])


def start_daemon(base: Path) -> tuple[subprocess.Popen[bytes], Path]:
    path = base / "d.sock"
    r, w = os.pipe()
    proc = subprocess.Popen(
        [c.PYTHON, "-m", "netguard.daemon", "--socket", str(path), "--ready-fd", str(w), "--idle-exit", "0"],
        pass_fds=(w,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(base / "daemon.log", "wb"),  # noqa: SIM115  (the child holds it)
        cwd=c.CHECKOUT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base), "PYTHONPATH": str(c.CHECKOUT)},
    )
    os.close(w)
    ready = os.read(r, 64)
    os.close(r)
    if ready != b"ready\n":
        raise RuntimeError(f"daemon did not start: {(base / 'daemon.log').read_text()[-2000:]}")
    return proc, path


def bind(path: Path, base: Path, task: str, port: int) -> tuple[ControlClient, int]:
    """One sandbox allowed to reach 127.0.0.1:port; returns its control connection and explicit port."""
    afd = os.open(base / f"{task}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((c.LOOPBACK, 0))
    socks = []
    for _ in range(3):
        s = socket.socket()
        s.bind((c.LOOPBACK, 0))
        s.listen(4096)
        socks.append(s)
    regular, transparent, dns_tcp = socks
    client = ControlClient.connect(path, timeout=10)
    network = parse_network({"allow": [{"cidr": f"{c.LOOPBACK}/32", "ports": [port]}]}, f"{task}.yaml")
    client.bind(
        BindingSpec(task, network), [afd, regular.fileno(), transparent.fileno(), udp.fileno(), dns_tcp.fileno()]
    )
    explicit = regular.getsockname()[1]
    os.close(afd)
    for s in (*socks, udp):
        s.close()
    return client, explicit


async def _serve_upstream(size: int) -> None:
    """Body of the upstream subprocess: greets, waits for "go", sends `size` bytes; port on stdout."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readline()
            w.write(GREETING)
            await r.readline()  # "go": every tunnel is open
            w.write(bytes(size))
            await w.drain()
        except OSError:
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(serve, c.LOOPBACK, 0, backlog=4096)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await srv.serve_forever()


def start_upstream(size: int) -> tuple[subprocess.Popen[bytes], int]:
    """The upstream in its own process: it holds as many sockets as the clients do."""
    proc = subprocess.Popen(
        [c.PYTHON, __file__, "--serve-upstream", str(size)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


class Opening:
    """Counts tunnels through their opening phase; `all` is set once none is left connecting."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.all = asyncio.Event()
        self.go = asyncio.Event()

    def one(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.all.set()


async def tunnel(proxy_port: int, up_port: int, size: int, st: Opening, gate: asyncio.Semaphore) -> int:
    """One tunnel: 0 if every byte arrived, else 1. Holds its connection until every tunnel is open."""
    try:
        try:
            async with gate:  # connect in waves: a burst of 10,000 SYNs would overflow the accept queues
                r, w = await asyncio.wait_for(asyncio.open_connection(c.LOOPBACK, proxy_port), 60)
                w.write(b"CONNECT %s:%d HTTP/1.1\r\nHost: x\r\n\r\nhello\n" % (c.LOOPBACK.encode(), up_port))
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 60)
                if not head.startswith(b"HTTP/1.1 200") or await asyncio.wait_for(r.readline(), 60) != GREETING:
                    return 1
        finally:
            st.one()
        await st.go.wait()
        w.write(b"go\n")
        got = len(await asyncio.wait_for(r.read(), 300))
        w.close()
        return 0 if got == size else 1
    except (TimeoutError, OSError, asyncio.IncompleteReadError):
        return 1


async def amain(args: argparse.Namespace, base: Path) -> tuple[int, dict[str, float]]:
    up, up_port = start_upstream(args.kib * 1024)
    proc, path = start_daemon(base)
    await asyncio.sleep(0.5)  # the relay workers' hello
    snaps = {"start": _snapshot(proc.pid)}
    try:
        binds = [bind(path, base, f"s{i}", up_port) for i in range(args.sandboxes)]
        await asyncio.sleep(0.5)
        snaps["bound"] = _snapshot(proc.pid)
        st, gate = Opening(args.n), asyncio.Semaphore(512)
        ports = [p for _, p in binds]
        tasks = [
            asyncio.create_task(tunnel(ports[i % len(ports)], up_port, args.kib * 1024, st, gate))
            for i in range(args.n)
        ]
        await st.all.wait()
        await asyncio.sleep(0.5)  # the last handoffs
        snaps["open"] = _snapshot(proc.pid)
        t0 = time.monotonic()
        st.go.set()
        errors = sum(await asyncio.gather(*tasks))
        f: dict[str, float] = {"secs": time.monotonic() - t0}
        for k, (rss, wrss, _, _) in snaps.items():
            f[k], f[k + "_workers"] = rss, wrss
        print(f"fd limit of each daemon process (soft hard): {_fd_limit(proc.pid)}")
        for k, (rss, wrss, fds, wfds) in snaps.items():
            print(
                f"  {k:5}: daemon {rss / 1024:6.1f} MiB, {fds:5} fds; relay workers {wrss / 1024:6.1f} MiB, fds {wfds}"
            )
        for client, _ in binds:
            client.close()
    finally:
        c._stop(proc)  # SIGTERM, then SIGKILL: a daemon out of fds must not outlive the run
        c._stop(up)
    return errors, f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="concurrent tunnels (default 10000)")
    ap.add_argument("--sandboxes", type=int, default=10, help="bindings of the one daemon (default 10)")
    ap.add_argument("--kib", type=int, default=64, help="KiB each tunnel downloads once all are open (default 64)")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one end of every tunnel lives in this process
    if args.serve_upstream is not None:
        asyncio.run(_serve_upstream(args.serve_upstream))
        return 0
    ns.reexec_in_netns()
    ns.lo_up()
    base = Path(tempfile.mkdtemp(prefix="sgc"))
    try:
        errors, f = asyncio.run(amain(args, base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    total = {k: f[k] + f[k + "_workers"] for k in ("start", "bound", "open")}
    per_sb = (total["bound"] - total["start"]) / args.sandboxes
    per_conn = (total["open"] - total["bound"]) / max(1, args.n - errors)  # per tunnel actually open
    here = (f["open"] - f["bound"]) / max(1, args.n - errors)
    print(f"{args.n} concurrent tunnels over {args.sandboxes} sandboxes, {args.kib} KiB each: {errors} errors")
    print(
        f"RSS, daemon + relay workers: {total['start'] / 1024:.1f} MiB at start, {total['bound'] / 1024:.1f} MiB bound, "
        f"{total['open'] / 1024:.1f} MiB with all open; per sandbox {per_sb:.0f} KiB, per connection "
        f"{per_conn:.1f} KiB ({here:.1f} in the daemon, {per_conn - here:.1f} in the workers); "
        f"downloads took {f['secs']:.1f} s"
    )
    print(f"RESULT {args.n} {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
