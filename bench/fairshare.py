#!/usr/bin/env python3
"""A victim sandbox's request latency while other sandboxes of the same daemon attack it (issue 22).

What: one `python -m netguard.daemon` daemon (this checkout) in a private network namespace
(bench/_netns.py), three sandboxes bound to it as the launcher binds them (listeners on 127.0.0.1
passed over the control socket): the victim, a hog and a streamer. The victim makes --n sequential
GET /small through its own explicit listener to a local server, each on a new connection (Python
http.client), in five modes measured in the same run:

  no attacker      the baseline
  hog              another sandbox holds --hog silent connections (never a byte: nothing can be
                   decided), far past its share (netguard.decision.limits.PER_SANDBOX)
  endless head     another sandbox streams request heads that never end, one after the other
                   (each cut by the daemon at its head limit with a 431)
  both             the hog and the streamer at once
  no attacker again  after both stopped: does the daemon recover?

The attackers are processes of their own (selftest/probes' hog and streamer, the ones
`sandgate verify` uses), started before and stopped after their mode. Prints median and p95 ms per
mode with their ratio to the baseline, failed requests, and the daemon's RSS (with its relay
workers) before the attackers, its peak while they ran, and after; then what each attacker got.
Before issue 22: 19,000 silent connections took every fd (the victim's requests failed) and one
endless head grew the daemon by 2.3 GB. No pass/fail threshold; the last line is `RESULT <errors>`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import _common as c
import _netns as ns
import concurrency as cc  # the daemon and its bindings, made as the launcher makes them

from netguard.decision.limits import PER_SANDBOX
from selftest.probes import endlesshead, starvation  # after concurrency: this checkout on the path

SETTLE = 2.0  # seconds a hog waits after its connects before the victim starts
MODES = ("no attacker", "hog", "endless head", "both", "no attacker again")


# ---- the attackers, each in a process of its own (`--hog-proc N PORT`, `--stream-proc PORT UPSTREAM`) ----


def hog_main(n: int, port: int) -> None:
    """Open `n` silent connections, say how many the daemon kept after SETTLE, hold them until SIGTERM."""
    want = n + starvation.SPARE_FDS
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))  # root may; else as many as allowed
        except (OSError, ValueError):
            n = hard - starvation.SPARE_FDS
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    hold = starvation.open_silent((c.LOOPBACK, port), n)
    time.sleep(SETTLE)
    print(census(hold, n), flush=True)
    stop.wait()
    print(census(hold, n), flush=True)
    hold.close()


def census(hold: starvation.Hold, n: int) -> str:
    """The hog's view: open (established, not closed: held by the daemon, or still queued in the kernel
    for it to accept), closed (by the daemon: past the share), connecting (no handshake yet)."""
    return json.dumps(dict(zip(("open", "closed", "connecting"), hold.census(), strict=True)) | {"of": n})


def stream_main(port: int, up_port: int) -> None:
    """Endless request heads through the explicit listener, one after the other, until SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    heads, cut, sent = 0, 0, 0
    target = f"http://{c.LOOPBACK}:{up_port}/small"
    print("ready", flush=True)
    while not stop.is_set():
        n, reply = endlesshead.stream_head((c.LOOPBACK, port), f"{c.LOOPBACK}:{up_port}", target)
        heads, sent = heads + 1, sent + n
        cut += reply.startswith(b"HTTP/1.1 431")
    print(json.dumps({"heads": heads, "cut": cut, "sent": sent}), flush=True)


@dataclass
class Attackers:
    """The attacker processes of one mode; `stop` collects what each said last."""

    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    said: dict[str, dict[str, int]] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> None:
        p = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        assert p.stdout is not None
        first = p.stdout.readline()  # the hog's census after SETTLE, the streamer's "ready"
        if not first:
            raise RuntimeError(f"the {name} exited at once ({p.wait()})")
        self.procs[name] = p
        if first.startswith("{"):
            self.said[f"{name} after {SETTLE:g} s"] = json.loads(first)

    def stop(self) -> None:
        for name, p in self.procs.items():
            p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=60)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if lines:
                self.said[f"{name} at the end"] = json.loads(lines[-1])
        self.procs.clear()


# ---- the victim and the daemon's memory ---------------------------------------------------------


def victim(port: int, up_port: int, n: int, timeout: float) -> tuple[list[float], int]:
    """`n` GET /small through the victim's explicit listener, a new connection each: (ms of each, errors)."""
    samples, errors = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(c.LOOPBACK, port, timeout=timeout)
        try:
            conn.request("GET", f"http://{c.LOOPBACK}:{up_port}/small", headers={"Connection": "close"})
            resp = conn.getresponse()
            ok = resp.status == 200 and resp.read() == b"ok\n"
        except (OSError, http.client.HTTPException):
            ok = False
        finally:
            conn.close()
        if ok:
            samples.append((time.perf_counter() - t0) * 1000)
        else:
            errors += 1
    return samples, errors


class Peak:
    """The daemon's RSS (and its relay workers') sampled every 50 ms on a thread while a mode runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.kib = pid, rss_kib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.kib = max(self.kib, rss_kib(self.pid))

    def done(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.kib


def rss_kib(pid: int) -> int:
    return sum(cc._rss_kib(p) for p in c.process_tree(pid))


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, -(-95 * len(s) // 100) - 1)] if s else float("nan")


# ---- the run ------------------------------------------------------------------------------------


@dataclass
class Result:
    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)
    said: dict[str, dict[str, int]] = field(default_factory=dict)


def run_modes(args: argparse.Namespace, pid: int, ports: dict[str, int], up_port: int) -> Result:
    res = Result()
    res.rss["before"] = rss_kib(pid)
    for mode in MODES:
        att = Attackers()
        try:
            if mode in ("hog", "both"):
                att.start("hog", ["--hog-proc", str(args.hog), str(ports["hog"])])
            if mode in ("endless head", "both"):
                att.start("streamer", ["--stream-proc", str(ports["streamer"]), str(up_port)])
            peak = Peak(pid)
            res.samples[mode], res.errors[mode] = victim(ports["victim"], up_port, args.n, args.timeout)
            res.peak[mode] = peak.done()
        finally:
            att.stop()
        res.said.update({f"mode {mode}, {k}": v for k, v in att.said.items()})
        if mode == "both":
            time.sleep(1.0)  # the attackers' sockets closed: what the daemon gives back
            res.rss["after"] = rss_kib(pid)
    return res


def report(args: argparse.Namespace, res: Result) -> None:
    base = res.samples["no attacker"]
    print(
        f"victim: {args.n} sequential GET /small through its own sandbox's listener of one shared daemon, "
        f"new connection each; hog: {args.hog} silent connections (share {PER_SANDBOX}); streamer: endless heads"
    )
    print()
    print(
        f"{'mode':<18} {'median ms':>10} {'p95 ms':>8} {'ratio median':>13} {'ratio p95':>10} {'errors':>7} {'RSS MiB':>8}"
    )
    for mode in MODES:
        xs = res.samples[mode]
        med = statistics.median(xs) if xs else float("nan")
        ratio = med / statistics.median(base) if xs and base else float("nan")
        ratio95 = p95(xs) / p95(base) if xs and base else float("nan")
        print(
            f"{mode:<18} {med:>10.3f} {p95(xs):>8.3f} {ratio:>13.2f} {ratio95:>10.2f} "
            f"{res.errors[mode]:>7} {res.peak[mode] / 1024:>8.1f}"
        )
    during = max(res.peak[m] for m in ("hog", "endless head", "both"))
    print()
    print(
        f"daemon RSS (with its relay workers): before {res.rss['before'] / 1024:.1f} MiB, during the attacks "
        f"{during / 1024:.1f} MiB at most (+{(during - res.rss['before']) / 1024:.1f}), "
        f"after {res.rss['after'] / 1024:.1f} MiB"
    )
    for name, said in res.said.items():
        print(f"  {name}: {', '.join(f'{k} {v}' for k, v in said.items())}")
    print(
        f"  (the hog's open connections: at most {PER_SANDBOX} held by the daemon, the rest queued in the kernel "
        "until it accepts and closes them)"
    )
    print(f"RESULT {sum(res.errors.values())}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="victim requests per mode (default 200)")
    ap.add_argument("--hog", type=int, default=19000, help="the hog's silent connections (default 19000)")
    ap.add_argument("--timeout", type=float, default=10, help="socket timeout per victim request, s (default 10)")
    ap.add_argument("--hog-proc", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stream-proc", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hog_proc:
        hog_main(*args.hog_proc)
        return 0
    if args.stream_proc:
        stream_main(*args.stream_proc)
        return 0
    ns.reexec_in_netns()
    ns.lo_up()
    base = Path(tempfile.mkdtemp(prefix="sgf"))  # AF_UNIX paths are short
    try:
        with c.local_servers() as srv:
            proc, path = cc.start_daemon(base)
            try:  # a binding lives as long as its control connection: keep the clients
                bound = {name: cc.bind(path, base, name, srv.http_port) for name in ("victim", "hog", "streamer")}
                res = run_modes(args, proc.pid, {name: port for name, (_, port) in bound.items()}, srv.http_port)
                for client, _ in bound.values():
                    client.close()
            finally:
                c._stop(proc)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(args, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
