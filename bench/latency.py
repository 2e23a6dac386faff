#!/usr/bin/env python3
"""Per-connection latency added by the sandgate egress proxy, for small requests.

What: --n (default 200) sequential GET /small requests against a local server on 127.0.0.1,
each on a NEW TCP connection, in five modes measured in the same run:

  http  direct   connect to the server, GET /small
  http  proxied  connect to the proxy, GET http://127.0.0.1:PORT/small (absolute URI)
  https direct   connect to the server, TLS handshake, GET /small
  https proxied  connect to the proxy, CONNECT 127.0.0.1:PORT, TLS handshake through the
                 tunnel (passed through untouched), GET /small
  https inspected  the same, but CONNECT localhost:PORT, the name the policy inspects: the
                 proxy terminates TLS with its own CA (a leaf per host, cached), judges and
                 audits the request and opens its own verified TLS connection upstream

Each sample is wall time from opening the connection to having read the whole response,
with Python's http.client (no process spawn per request). Modes are interleaved request by
request so that drift affects all of them alike; a few warm-up rounds are discarded.

Why: package managers and git open many short connections; for them the proxy's cost is the
per-connection overhead (policy decision, audit record, upstream connect), not bandwidth.
Prints median and p95 per mode, the milliseconds the proxy adds, and the milliseconds inspection
adds over passthrough (https inspected - https proxied). No pass/fail threshold.
"""

from __future__ import annotations

import argparse
import http.client
import ssl
import statistics
import sys
import time
from collections.abc import Callable

import _common as c


def _get(conn: http.client.HTTPConnection, target: str) -> None:
    conn.request("GET", target, headers={"Connection": "close"})
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200 or body != b"ok\n":
        raise RuntimeError(f"unexpected response {resp.status} {body[:80]!r} for {target}")


def make_modes(
    srv: c.Servers, px: c.Proxy, ctx: ssl.SSLContext, inspected_ctx: ssl.SSLContext, timeout: float
) -> dict[str, Callable[[], None]]:
    """name -> zero-argument callable performing one request on a fresh connection."""
    host = c.LOOPBACK

    def http_direct() -> None:
        conn = http.client.HTTPConnection(host, srv.http_port, timeout=timeout)
        try:
            _get(conn, "/small")
        finally:
            conn.close()

    def http_proxied() -> None:
        conn = http.client.HTTPConnection(host, px.port, timeout=timeout)
        try:
            _get(conn, f"http://{host}:{srv.http_port}/small")
        finally:
            conn.close()

    def https_direct() -> None:
        conn = http.client.HTTPSConnection(host, srv.https_port, timeout=timeout, context=ctx)
        try:
            _get(conn, "/small")
        finally:
            conn.close()

    def https_proxied() -> None:
        # http.client's tunnel: CONNECT host:port to the proxy, then TLS (verified against the
        # benchmark CA for 127.0.0.1) over the tunnel.
        conn = http.client.HTTPSConnection(host, px.port, timeout=timeout, context=ctx)
        conn.set_tunnel(host, srv.https_port)
        try:
            _get(conn, "/small")
        finally:
            conn.close()

    def https_inspected() -> None:
        # The same server by the inspected name: the client verifies the proxy's leaf with the proxy's CA.
        conn = http.client.HTTPSConnection(host, px.port, timeout=timeout, context=inspected_ctx)
        conn.set_tunnel(c.INSPECTED, srv.https_port)
        try:
            _get(conn, "/small")
        finally:
            conn.close()

    return {
        "http direct": http_direct,
        "http proxied": http_proxied,
        "https direct": https_direct,
        "https proxied": https_proxied,
        "https inspected": https_inspected,
    }


def p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    s = sorted(xs)
    return s[max(0, -(-95 * len(s) // 100) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="requests per mode (default 200)")
    ap.add_argument("--warmup", type=int, default=10, help="discarded rounds before measuring (default 10)")
    ap.add_argument("--timeout", type=float, default=10, help="socket timeout per request, seconds (default 10)")
    args = ap.parse_args()
    started = time.perf_counter()
    samples: dict[str, list[float]] = {}
    with c.local_servers() as srv, c.sandgate_proxy([srv.http_port, srv.https_port], (srv.https_port, srv.certs)) as px:
        assert px.ca_pem is not None
        inspected_ctx = ssl.create_default_context(cafile=str(px.ca_pem))
        modes = make_modes(srv, px, c.client_context(srv.certs), inspected_ctx, args.timeout)
        for _ in range(args.warmup):
            for fn in modes.values():
                fn()
        clock = time.perf_counter
        for _ in range(args.n):
            for name, fn in modes.items():
                t0 = clock()
                fn()
                samples.setdefault(name, []).append((clock() - t0) * 1000)
        mem = px.memory_kib()

    print(f"{args.n} sequential GET /small per mode, new connection each, 127.0.0.1, Python http.client")
    print()
    print(f"{'mode':<16} {'median ms':>10} {'p95 ms':>8}")
    for name, xs in samples.items():
        print(f"{name:<16} {statistics.median(xs):>10.3f} {p95(xs):>8.3f}")
    print()
    print(f"{'added by proxy':<16} {'median ms':>10} {'p95 ms':>8}")
    for label, base, over in (
        ("http", "http direct", "http proxied"),
        ("https", "https direct", "https proxied"),
        ("https inspected", "https direct", "https inspected"),
    ):
        d, p = samples[base], samples[over]
        print(f"{label:<16} {statistics.median(p) - statistics.median(d):>+10.3f} {p95(p) - p95(d):>+8.3f}")
    d, p = samples["https proxied"], samples["https inspected"]
    print(
        f"added by inspection over passthrough: median {statistics.median(p) - statistics.median(d):+.3f} ms, "
        f"p95 {p95(p) - p95(d):+.3f} ms"
    )
    print()
    print(
        f"proxy RSS after the runs: {mem['VmRSS'] / 1024:.1f} MiB (peak {mem['VmHWM'] / 1024:.1f} MiB); "
        f"total run time {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
