#!/usr/bin/env python3
"""Added time to a FULL response on new connections, with real clients: curl and Python's http.client.

What: in a private network namespace (bench/_netns.py), the local servers (bench/_common.py: TLS 1.3
with session tickets, the response head and body in separate writes, keep-alive, TCP_NODELAY) and one
`sandgate proxy` with an explicit and a transparent listener. --n sequential `GET /small`, each on a new
connection, in every mode, interleaved request by request:

  https direct / explicit (HTTPS_PROXY: CONNECT) / transparent (nft redirect) / inspected (CONNECT to
  the inspected name: TLS terminated with the proxy's CA); http direct / explicit / transparent

and with two clients: curl (a new process per request, `curl -w`: the clock is curl's own, from its
start to the last body byte, process start excluded) and Python's http.client (the clock around one
request in this process). Then the same for a second request on a kept-alive connection ("https
<path> reused": direct, explicit, transparent; curl fetches the URL twice in one process and the
second one is timed), where a relay without TCP_NODELAY holds the body behind the head. The clock stops at the full response (body read), not at TLS established:
curl's `time_appconnect` (TLS established; TCP connected for http) is printed beside it, because a
stall after the handshake (Nagle holding the response behind the server's session tickets until the
client's 40 ms delayed ACK, issue 25) shows only in the full-response column.

Prints median and p95 ms per mode and client, and what each path adds to direct (median, p95, and
the ratio proxied/direct). SANDGATE_BENCH_CHECKOUT=DIR measures another checkout's proxy (before/after).
No pass/fail threshold.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import _common as c
import _netns as ns
import datapath as dp
import latency as lat

CLIENTS = ("curl", "http.client")
HTTPS_PATHS = ("direct", "explicit", "transparent", "inspected")
HTTP_PATHS = ("direct", "explicit", "transparent")
MODES = tuple(f"https {p}" for p in HTTPS_PATHS) + tuple(f"http {p}" for p in HTTP_PATHS)
REUSED = tuple(f"https {p} reused" for p in HTTPS_PATHS[:3])  # the 2nd request on a kept-alive connection
#: connect/TLS-established, full response, status, body size: curl's own clock, in seconds.
CURL_W = "%{time_connect} %{time_appconnect} %{time_total} %{http_code} %{size_download}"
Samples = dict[str, list[float]]  # "<client> <mode>" (and "curl <mode> ready") -> ms per request


@dataclass(frozen=True)
class Added:
    """What a path adds to direct with one client: ms at the median and at p95, and proxied/direct."""

    median: float
    p95: float
    ratio: float


def curl_request(mode: str, srv: c.Servers, px: ns.Proxy2, timeout: float) -> tuple[list[str], dict[str, str]]:
    """curl's argv and environment for `mode` (explicit: the proxy variable, as a sandbox sets it;
    reused: the URL twice, one connection)."""
    scheme, path, *reused = mode.split()
    env = c.clean_env()
    url, ca = srv.url(scheme, "/small"), srv.certs.ca_pem
    cmd = ["curl", "-sS", "-o", "/dev/null", "--max-time", str(int(timeout)), "-w", CURL_W + "\\n"]
    if path == "inspected":
        assert px.ca_pem is not None
        url, ca = f"https://{c.INSPECTED}:{srv.https_port}/small", px.ca_pem
    if path in ("explicit", "inspected"):
        env["HTTPS_PROXY" if scheme == "https" else "http_proxy"] = px.url
    else:
        cmd += ["--noproxy", "*"]
    if path == "transparent":
        cmd += ["--interface", ns.CLIENT_IP]
    if reused:
        cmd += ["-o", "/dev/null", url]
    return [*cmd, "--cacert", str(ca), url], env


def curl_once(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, float]:
    """(ms to connection ready: TLS established, or TCP connected for http; ms to the full response)
    of the last URL curl fetched."""
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 10, check=False)
    lines = out.stdout.splitlines()
    fields = lines[-1].split() if lines else []
    if out.returncode != 0 or len(fields) != 5 or fields[3] != "200" or fields[4] != "3":
        raise RuntimeError(f"curl failed ({out.returncode}) {out.stdout!r}: {out.stderr.strip()} [{cmd[-1]}]")
    connect, appconnect, total = (float(x) * 1000 for x in fields[:3])
    return (appconnect or connect), total


def reused(srv: c.Servers, px: ns.Proxy2, path: str, timeout: float) -> Callable[[], float]:
    """http.client: one connection of `path`, a first GET, then the timed second one (ms)."""
    ctx, host = c.client_context(srv.certs), c.LOOPBACK
    port = px.port if path == "explicit" else srv.https_port
    src = (ns.CLIENT_IP, 0) if path == "transparent" else None

    def two() -> float:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx, source_address=src)
        if path == "explicit":
            conn.set_tunnel(host, srv.https_port)
        try:
            for _ in range(2):
                t0 = time.perf_counter()
                conn.request("GET", "/small")
                if conn.getresponse().read() != b"ok\n":
                    raise RuntimeError(f"unexpected body on a reused {path} connection")
            return (time.perf_counter() - t0) * 1000
        finally:
            conn.close()

    return two


def measure(srv: c.Servers, px: ns.Proxy2, n: int, timeout: float, warmup: int = 3) -> Samples:
    """`n` requests per mode and client, interleaved; `warmup` discarded rounds first."""
    new: dict[str, Callable[[], None]] = dp._modes(srv, px, timeout)
    pyclient: dict[str, Callable[[], float]] = {m: _timed(fn) for m, fn in new.items()}
    pyclient.update({m: reused(srv, px, m.split()[1], timeout) for m in REUSED})
    curl = {m: curl_request(m, srv, px, timeout) for m in (*MODES, *REUSED)}
    samples: Samples = {}
    for i in range(warmup + n):
        for mode in (*MODES, *REUSED):
            ready, full = curl_once(*curl[mode], timeout)
            elapsed = pyclient[mode]()
            if i >= warmup:
                samples.setdefault(f"curl {mode} ready", []).append(ready)
                samples.setdefault(f"curl {mode}", []).append(full)
                samples.setdefault(f"http.client {mode}", []).append(elapsed)
    return samples


def _timed(fn: Callable[[], None]) -> Callable[[], float]:
    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000

    return timed


def added(samples: Samples, client: str, mode: str, what: str = "") -> Added:
    """What `mode` (e.g. "https explicit") adds to its direct mode ("https direct") with `client`;
    what=" ready": to TLS established."""
    scheme, _, *rest = mode.split()
    d, p = samples[f"{client} {' '.join([scheme, 'direct', *rest])}{what}"], samples[f"{client} {mode}{what}"]
    dm, pm = statistics.median(d), statistics.median(p)
    return Added(pm - dm, lat.p95(p) - lat.p95(d), pm / dm if dm else float("nan"))


def report(samples: Samples, n: int) -> None:
    print(f"{n} sequential GET /small per mode and client, a new connection each (curl: a new process each)")
    print(
        f"\n{'mode':<24} {'curl TLS est.':>13} {'curl full':>10} {'p95':>7} {'http.client full':>17} {'p95':>7}  (ms)"
    )
    for mode in (*MODES, *REUSED):
        ready, full, py = samples[f"curl {mode} ready"], samples[f"curl {mode}"], samples[f"http.client {mode}"]
        print(
            f"{mode:<24} {statistics.median(ready):>13.3f} {statistics.median(full):>10.3f} {lat.p95(full):>7.3f} "
            f"{statistics.median(py):>17.3f} {lat.p95(py):>7.3f}"
        )
    print(
        f"\n{'added to direct':<24} {'client':<12} {'full median':>12} {'full p95':>9} {'ratio':>7} {'TLS est. median':>16}"
    )
    for mode in (*MODES, *REUSED):
        if mode.split()[1] == "direct":
            continue
        for client in CLIENTS:
            a = added(samples, client, mode)
            est = f"{'-':>16}"  # http.client has no such clock; a reused connection no handshake
            if client == "curl" and mode not in REUSED:
                est = f"{added(samples, client, mode, ' ready').median:>+16.3f}"
            print(f"{mode:<24} {client:<12} {a.median:>+12.3f} {a.p95:>+9.3f} {a.ratio:>6.2f}x {est}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50, help="requests per mode and client (default 50)")
    ap.add_argument("--timeout", type=float, default=10, help="seconds per request (default 10)")
    args = ap.parse_args()
    if not ns.enter("response.py"):
        return 0
    started = time.perf_counter()
    try:
        with ns.servers_and_proxy() as (srv, px):
            samples = measure(srv, px, args.n, args.timeout)
    except ns.Unavailable as e:
        print(f"response.py: {e}; skipped")
        return 0
    report(samples, args.n)
    print(f"\n(proxy of {c.CHECKOUT}; total run time {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
