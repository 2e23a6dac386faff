#!/usr/bin/env python3
"""The data path in one run: direct vs explicit vs transparent vs inspected, against issue 15's targets.

What: in a private network namespace (bench/_netns.py), a local HTTP/HTTPS server and one
`sandgate proxy` with an explicit and a transparent listener. For HTTPS (a CONNECT tunnel or
redirected TLS, relayed untouched) and plain HTTP (absolute URI or redirected, parsed per request),
plus HTTPS to an inspected name (CONNECT localhost: the proxy terminates TLS with its CA, judges and
audits each request, and verifies its own TLS upstream):
  - throughput of a --mb MiB curl download, direct and through each path (median of --repeat,
    interleaved), the ratio to direct, and the proxy's CPU-seconds per GB (utime+stime);
  - latency of --n sequential GET /small, each on a new connection (Python http.client), and
    what each path adds to direct at the median and at p95;
  - with --concurrency N (default 10000, 0 to skip): bench/concurrency.py's N concurrent tunnels
    across 10 sandboxes of one daemon.
Then every figure against its target (HTTPS >= 0.8x, plain HTTP >= 0.6x, <= 0.4 CPU-s/GB,
added latency <= +1.0 ms median and <= +2.0 ms p95 per new HTTPS connection, N concurrent with 0
errors): met or not. Inspected and plain-HTTP latency have no target in the issue: shown as "info".
Figures are comparable within one run only. Exits 0 whatever the figures (a measurement).
"""

from __future__ import annotations

import argparse
import http.client
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import _common as c
import _netns as ns
import latency as lat
from throughput import curl_download

PATHS = ("direct", "explicit", "transparent")
INSPECTED = "inspected"  # HTTPS only: an explicit CONNECT to the inspected name
INFO = ("none", "info")  # a figure the issue sets no target for
Row = tuple[str, str, str, str]  # figure, value, target, verdict


def _curl_via(path: str, px: ns.Proxy2) -> tuple[str | None, list[str]]:
    """(curl -x proxy, extra curl args) for one path; transparent = the redirected source address."""
    if path == "explicit":
        return px.url, []
    if path == "transparent":
        return None, ["--interface", ns.CLIENT_IP]
    return None, []


def _download(url: str, nbytes: int, srv: c.Servers, px: ns.Proxy2, path: str, timeout: float) -> float:
    via, extra = _curl_via(path, px)
    if not extra:
        return curl_download(url, nbytes, srv.certs.ca_pem, via, timeout)
    cmd = ["curl", "-s", "-S", "--fail", "-o", "/dev/null", "--max-time", str(int(timeout)), *extra]
    cmd += ["-w", "%{speed_download} %{size_download}", "--cacert", str(srv.certs.ca_pem), "--noproxy", "*", url]
    out = subprocess.run(cmd, capture_output=True, text=True, env=c.clean_env(), timeout=timeout + 10)
    speed, size = out.stdout.split() if out.returncode == 0 else ("0", "0")
    if int(float(size)) != nbytes:
        raise RuntimeError(f"short transfer via {path}: {size} of {nbytes} bytes: {out.stderr.strip()}")
    return float(speed)


def throughput(srv: c.Servers, px: ns.Proxy2, mb: int, repeat: int, timeout: float) -> dict[str, dict[str, float]]:
    """scheme -> {path: median MB/s, path+' cpu': CPU-s/GB, 'peak': MiB}."""
    nbytes = mb * c.MiB
    out: dict[str, dict[str, float]] = {}
    for scheme in ("https", "http"):
        url = srv.url(scheme, f"/big?bytes={nbytes}")
        for path in PATHS:  # warm-up: imports, first handshakes
            _download(srv.url(scheme, "/big?bytes=1048576"), 1048576, srv, px, path, timeout)
        speeds: dict[str, list[float]] = {p: [] for p in PATHS}
        cpu: dict[str, float] = {p: 0.0 for p in PATHS}
        px.reset_peak()
        for _ in range(repeat):
            for path in PATHS:
                before = px.cpu_seconds()
                speeds[path].append(_download(url, nbytes, srv, px, path, timeout))
                cpu[path] += px.cpu_seconds() - before
        if scheme == "https":
            _inspected(srv, px, nbytes, repeat, timeout, speeds, cpu)
        row = {p: statistics.median(v) / 1e6 for p, v in speeds.items()}
        row.update({f"{p} cpu": cpu[p] / (nbytes * repeat / 1e9) for p in speeds if p != "direct"})
        row["peak"] = px.memory_kib()["VmHWM"] / 1024
        out[scheme] = row
    return out


def _inspected(
    srv: c.Servers,
    px: ns.Proxy2,
    nbytes: int,
    repeat: int,
    timeout: float,
    speeds: dict[str, list[float]],
    cpu: dict[str, float],
) -> None:
    """The same download by the inspected name, the client trusting the proxy's CA (after the others:
    its leaf certificate is made on the first one, which is the warm-up)."""
    assert px.ca_pem is not None
    url = f"https://{c.INSPECTED}:{srv.https_port}/big?bytes="
    curl_download(f"{url}1048576", 1048576, px.ca_pem, px.url, timeout)
    speeds[INSPECTED], cpu[INSPECTED] = [], 0.0
    for _ in range(repeat):
        before = px.cpu_seconds()
        speeds[INSPECTED].append(curl_download(f"{url}{nbytes}", nbytes, px.ca_pem, px.url, timeout))
        cpu[INSPECTED] += px.cpu_seconds() - before


def _modes(srv: c.Servers, px: ns.Proxy2, timeout: float) -> dict[str, Callable[[], None]]:
    """latency.py's modes (explicit = its 'proxied') plus the two transparent ones."""
    ctx = c.client_context(srv.certs)
    assert px.ca_pem is not None
    inspected_ctx = ssl.create_default_context(cafile=str(px.ca_pem))  # the proxy's leaf for the inspected name
    base = lat.make_modes(srv, c.Proxy(px.port, px.proc, px.audit_log), ctx, inspected_ctx, timeout)
    host, src = c.LOOPBACK, (ns.CLIENT_IP, 0)

    def http_transparent() -> None:
        conn = http.client.HTTPConnection(host, srv.http_port, timeout=timeout, source_address=src)
        try:
            lat._get(conn, "/small")
        finally:
            conn.close()

    def https_transparent() -> None:
        conn = http.client.HTTPSConnection(host, srv.https_port, timeout=timeout, context=ctx, source_address=src)
        try:
            lat._get(conn, "/small")
        finally:
            conn.close()

    return {
        "https direct": base["https direct"],
        "https explicit": base["https proxied"],
        "https transparent": https_transparent,
        "https inspected": base["https inspected"],
        "http direct": base["http direct"],
        "http explicit": base["http proxied"],
        "http transparent": http_transparent,
    }


def latency(srv: c.Servers, px: ns.Proxy2, n: int, timeout: float) -> dict[str, list[float]]:
    modes = _modes(srv, px, timeout)
    for _ in range(10):
        for fn in modes.values():
            fn()
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(n):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) * 1000)
    return samples


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def rows(tp: dict[str, dict[str, float]], lt: dict[str, list[float]], conc: tuple[int, int] | None) -> list[Row]:
    out: list[Row] = []
    for scheme, target in (("https", 0.8), ("http", 0.6)):
        for path in _proxied(tp[scheme]):
            r = tp[scheme][path] / tp[scheme]["direct"]
            met = (f">= {target}x", _verdict(r >= target)) if path in PATHS else INFO
            out.append((f"{scheme} {path} / direct", f"{r:.2f}x", *met))
    for scheme in ("https", "http"):
        for path in _proxied(tp[scheme]):
            cpu = tp[scheme][f"{path} cpu"]
            met = ("<= 0.4", _verdict(cpu <= 0.4)) if path in PATHS else INFO
            out.append((f"proxy CPU-s/GB, {scheme} {path}", f"{cpu:.2f}", *met))
    for scheme in ("https", "http"):
        d = lt[f"{scheme} direct"]
        for path in (*PATHS[1:], INSPECTED) if scheme == "https" else PATHS[1:]:
            p = lt[f"{scheme} {path}"]
            med, p95 = statistics.median(p) - statistics.median(d), lat.p95(p) - lat.p95(d)
            met = ("+1.0 / +2.0", _verdict(med <= 1.0 and p95 <= 2.0)) if scheme == "https" and path in PATHS else INFO
            out.append((f"added ms, {scheme} {path} (median/p95)", f"{med:+.2f} / {p95:+.2f}", *met))
    if conc is not None:
        n, errors = conc
        out.append((f"{n} concurrent tunnels, 10 sandboxes", f"{errors} errors", "0 errors", _verdict(errors == 0)))
    return out


def _proxied(row: dict[str, float]) -> list[str]:
    return [p for p in (*PATHS[1:], INSPECTED) if p in row]


def _print(
    tp: dict[str, dict[str, float]], lt: dict[str, list[float]], table: list[Row], args: argparse.Namespace
) -> None:
    print(f"download of {args.mb} MiB (median of {args.repeat}), curl; {args.n} new connections per latency mode")
    cols = (*PATHS, INSPECTED)
    print(f"\n{'MB/s':<8}" + "".join(f"{p:>13}" for p in cols) + f"{'proxy peak RSS':>17}")
    for scheme, row in tp.items():
        cells = "".join(f"{row[p]:>13.1f}" if p in row else f"{'-':>13}" for p in cols)
        print(f"{scheme:<8}{cells}{row['peak']:>13.1f} MiB")
    print(f"\n{'latency ms':<20} {'median':>8} {'p95':>8}")
    for name, xs in lt.items():
        print(f"{name:<20} {statistics.median(xs):>8.3f} {lat.p95(xs):>8.3f}")
    print(f"\n{'figure':<44} {'value':>16} {'target':>12}  verdict")
    for fig, val, target, verdict in table:
        print(f"{fig:<44} {val:>16} {target:>12}  {verdict}")


def _concurrency(n: int) -> tuple[int, int] | None:
    if n <= 0:
        return None
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("concurrency.py")), "--n", str(n)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    print(r.stdout, end="")
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            _, total, errors = line.split()
            return int(total), int(errors)
    print(f"concurrency.py failed ({r.returncode}): {r.stderr[-2000:]}")
    return n, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="MiB per download (default 512)")
    ap.add_argument("--repeat", type=int, default=3, help="downloads per path, median reported (default 3)")
    ap.add_argument("--n", type=int, default=200, help="requests per latency mode (default 200)")
    ap.add_argument("--concurrency", type=int, default=10000, help="concurrent tunnels (default 10000; 0: skip)")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if not ns.enter("datapath.py"):
        return 0
    started = time.perf_counter()
    try:
        with ns.servers_and_proxy() as (srv, px):
            tp = throughput(srv, px, args.mb, args.repeat, args.timeout)
            lt = latency(srv, px, args.n, 10)
    except ns.Unavailable as e:
        print(f"datapath.py: {e}; skipped")
        return 0
    conc = _concurrency(args.concurrency)
    _print(tp, lt, rows(tp, lt, conc), args)
    print(f"\n(MB = 10^6 bytes; total run time {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
