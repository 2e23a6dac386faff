#!/usr/bin/env python3
"""Bulk download throughput through the sandgate egress proxy, against a direct baseline.

What: downloads --mb MiB (default 512) from a local server on 127.0.0.1, once DIRECTLY and once
THROUGH `sandgate proxy`, for plain HTTP (absolute-URI GET, the proxy relays the response) and
for HTTPS (CONNECT tunnel; TLS passes through the proxy untouched). The client is curl, which
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

import _common as c


def curl_download(url: str, nbytes: int, certs: c.Certs, proxy: str | None, timeout: float) -> float:
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
        str(certs.ca_pem),
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
    results: dict[tuple[str, str], list[float]] = {}
    peaks: dict[str, int] = {}  # per mode: proxy VmHWM (KiB) during its proxied downloads, if resettable
    with c.local_servers() as srv, c.sandgate_proxy([srv.http_port, srv.https_port]) as px:
        mem_before = px.memory_kib()
        for scheme in ("http", "https"):
            url = srv.url(scheme, f"/big?bytes={nbytes}")
            # Warm-up: a small transfer per path (imports, first TLS handshake) outside the measurement.
            for via in (None, px.url):
                curl_download(srv.url(scheme, "/big?bytes=1048576"), 1048576, srv.certs, via, args.timeout)
            resettable = px.reset_peak()
            for _ in range(args.repeat):
                # Alternate direct and proxied so drift (thermal, other load) hits both alike.
                for path, via in (("direct", None), ("proxied", px.url)):
                    results.setdefault((scheme, path), []).append(
                        curl_download(url, nbytes, srv.certs, via, args.timeout)
                    )
            if resettable:
                peaks[scheme] = px.memory_kib()["VmHWM"]
        mem_after = px.memory_kib()

    print(f"download of {args.mb} MiB from 127.0.0.1, curl client, median of {args.repeat} run(s) per cell")
    print()
    head = f"{'mode':<24} {'direct MB/s':>12} {'proxied MB/s':>13} {'proxied/direct':>15}"
    print(head + (f" {'proxy peak RSS':>15}" if peaks else ""))
    for scheme, label in (("http", "http (absolute URI)"), ("https", "https (CONNECT tunnel)")):
        d = statistics.median(results[(scheme, "direct")]) / 1e6
        p = statistics.median(results[(scheme, "proxied")]) / 1e6
        peak = f" {peaks[scheme] / 1024:>11.1f} MiB" if scheme in peaks else ""
        print(f"{label:<24} {d:>12.1f} {p:>13.1f} {p / d:>15.2f}{peak}")
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
