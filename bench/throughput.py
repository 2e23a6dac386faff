#!/usr/bin/env python3
"""Bulk download throughput through the sandgate egress proxy, against a direct baseline.

What: downloads --mb MiB (default 512) from a local server on 127.0.0.1, once DIRECTLY and once
THROUGH `sandgate proxy`, for plain HTTP (absolute-URI GET, the proxy relays the response), for
HTTPS (CONNECT tunnel; TLS passes through the proxy untouched) and for inspected HTTPS (the same
server by the name the policy inspects: the proxy terminates TLS with its own CA, judges and
audits the request, and makes its own verified TLS connection upstream). The client is curl, which
is not the bottleneck at these rates; the server streams one preallocated buffer.

Why: every byte a sandboxed task fetches (package archives, model weights, git packs) crosses
the proxy. The ratio proxied/direct shows what the proxy costs a large download, and the
proxy's peak RSS (VmHWM) shows whether it buffers bodies instead of streaming them: it should
stay flat whatever --mb is.

All four transfers run in the same invocation on the same machine, so the figures are
comparable with each other, not with other machines. No pass/fail threshold.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common as c

#: (mode, label): the table's rows; "inspected" is https by the name the proxy inspects.
MODES = (("http", "http (absolute URI)"), ("https", "https (CONNECT tunnel)"), ("inspected", "https (inspected)"))


def curl_download(url: str, nbytes: int, cafile: Path, proxy: str | None, timeout: float) -> float:
    """One download with curl; returns bytes/second as curl measured it. Raises on any short or failed transfer."""
    cmd = [
        "curl",
        "-s",
        "-S",
        "--fail",
        "-o",
        "/dev/null",
        "--max-time",
        str(int(timeout)),
        "-w",
        "%{speed_download} %{size_download} %{http_code}",
        "--cacert",
        str(cafile),
    ]
    cmd += ["-x", proxy] if proxy else ["--noproxy", "*"]
    cmd.append(url)
    out = subprocess.run(cmd, capture_output=True, text=True, env=c.clean_env(), timeout=timeout + 10)
    if out.returncode != 0:
        raise RuntimeError(f"curl failed ({out.returncode}) for {url} via {proxy or 'direct'}: {out.stderr.strip()}")
    speed, size, code = out.stdout.split()
    if code != "200" or int(float(size)) != nbytes:
        raise RuntimeError(f"short transfer for {url} via {proxy or 'direct'}: HTTP {code}, {size} of {nbytes} bytes")
    return float(speed)


def _target(srv: c.Servers, px: c.Proxy, mode: str, path: str) -> tuple[str, Path, Path]:
    """(url, CA for the direct download, CA for the proxied one) of one mode."""
    if mode != "inspected":
        return srv.url(mode, path), srv.certs.ca_pem, srv.certs.ca_pem
    assert px.ca_pem is not None, "the proxy was started without inspection"
    return f"https://{c.INSPECTED}:{srv.https_port}{path}", srv.certs.ca_pem, px.ca_pem


def measure(
    srv: c.Servers, px: c.Proxy, nbytes: int, repeat: int, timeout: float
) -> tuple[dict[tuple[str, str], list[float]], dict[str, int]]:
    """Bytes/s per (mode, direct|proxied), and the proxy's VmHWM (KiB) per mode when it could be reset."""
    results: dict[tuple[str, str], list[float]] = {}
    peaks: dict[str, int] = {}
    for mode, _ in MODES:
        url, direct_ca, proxied_ca = _target(srv, px, mode, f"/big?bytes={nbytes}")
        warm, _, _ = _target(srv, px, mode, "/big?bytes=1048576")
        # Warm-up: a small transfer per path (imports, first TLS handshake, first leaf) outside the measurement.
        for via, ca in ((None, direct_ca), (px.url, proxied_ca)):
            curl_download(warm, 1048576, ca, via, timeout)
        resettable = px.reset_peak()
        for _ in range(repeat):
            # Alternate direct and proxied so drift (thermal, other load) hits both alike.
            for path, via, ca in (("direct", None, direct_ca), ("proxied", px.url, proxied_ca)):
                results.setdefault((mode, path), []).append(curl_download(url, nbytes, ca, via, timeout))
        if resettable:
            peaks[mode] = px.memory_kib()["VmHWM"]
    return results, peaks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="MiB per download (default 512)")
    ap.add_argument(
        "--repeat", type=int, default=1, help="downloads per mode and path; the median is reported (default 1)"
    )
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per download (default 600)")
    args = ap.parse_args()
    if shutil.which("curl") is None:
        print("throughput.py needs curl on PATH", file=sys.stderr)
        return 0
    nbytes = args.mb * c.MiB
    started = time.perf_counter()
    with c.local_servers() as srv:
        ports = [srv.http_port, srv.https_port]
        with c.sandgate_proxy(ports, inspect=(srv.https_port, srv.certs)) as px:
            mem_before = px.memory_kib()
            results, peaks = measure(srv, px, nbytes, args.repeat, args.timeout)
            mem_after = px.memory_kib()

    print(f"download of {args.mb} MiB from 127.0.0.1, curl client, median of {args.repeat} run(s) per cell")
    print()
    head = f"{'mode':<24} {'direct MB/s':>12} {'proxied MB/s':>13} {'proxied/direct':>15}"
    print(head + (f" {'proxy peak RSS':>15}" if peaks else ""))
    speed = {key: statistics.median(xs) / 1e6 for key, xs in results.items()}
    for mode, label in MODES:
        d, p = speed[(mode, "direct")], speed[(mode, "proxied")]
        peak = f" {peaks[mode] / 1024:>11.1f} MiB" if mode in peaks else ""
        print(f"{label:<24} {d:>12.1f} {p:>13.1f} {p / d:>15.2f}{peak}")
    inspected, passthrough = speed[("inspected", "proxied")], speed[("https", "proxied")]
    print(
        f"inspected vs passthrough https, both proxied: {inspected:.1f} / {passthrough:.1f} MB/s, "
        f"ratio {inspected / passthrough:.2f}"
    )
    print()
    print(
        f"proxy RSS after start: {mem_before['VmRSS'] / 1024:.1f} MiB; "
        f"after the runs: {mem_after['VmRSS'] / 1024:.1f} MiB; peak over the whole run (VmHWM): "
        f"{mem_after['VmHWM'] / 1024:.1f} MiB"
    )
    if not peaks:
        print("(per-mode peaks unavailable: /proc/<pid>/clear_refs not writable, so VmHWM could not be reset)")
    print(f"(MB = 10^6 bytes; total run time {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
