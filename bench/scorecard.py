#!/usr/bin/env python3
"""Issue 25's scorecard: every figure of the speed a user feels, with its target and its ratio to a
baseline measured in the same run.

What (all in one private network namespace, bench/_netns.py; a daemon of its own, bench/_sandbox.py):
  - added ms to a full HTTPS response on a new connection, explicit and transparent, with curl and
    with Python's http.client (bench/response.py), target <= +1 ms median; the inspected path
    (<= +3 ms) and plain HTTP (<= +1.5 ms) the same way; ratio: proxied / direct; a second request
    on a kept-alive connection as info (the issue sets no target for it);
  - inspected throughput (>= 0.5x direct) and the proxy's CPU-s per GB (<= 2) (bench/datapath.py),
    and its RSS after --conns inspected connections closed, against its RSS before (back near it);
  - cold start + first HTTPS request: daemon stopped, `sandgate run --allow <cidr> -- curl https://...`
    to a server on c.SANDBOX_SERVER_IP (<= 0.2 s; ratio: the same curl without sandgate);
  - warm start `sandgate run -q -- true` (<= 50 ms; ratio: `unshare -Urn true`, interleaved), and
    with a policy of 10,000 and 100,000 names in a `hosts_file:` and a plain 10,000 `- host:` list
    (<= 1 s; ratio: the warm start without them); Codex's and srt's warm start where installed;
  - ns per policy decision at 100,000 rules against 10 rules (bench/rules.py): flat.
A figure whose feature is missing or broken prints `fails: <why>` and the rest goes on. Exits 0
whatever the figures (a measurement); SANDGATE_BENCH_CHECKOUT=DIR measures another checkout.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import _common as c
import _netns as ns
import _sandbox as sb
import datapath as dp
import response as resp
import rules as rb


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    target: str
    ratio: str = ""
    verdict: str = "info"


def judged(figure: str, value: str, target: str, ratio: str, ok: bool) -> Row:
    return Row(figure, value, target, ratio, "met" if ok else "NOT met")


def guarded(figure: str, target: str, section: Callable[[], list[Row]]) -> list[Row]:
    """The section's rows, or one `fails: <why>` row: a feature not there yet must not end the run."""
    try:
        return section()
    except Exception as e:  # any failure of the thing measured is a figure too
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1].removeprefix("sandgate: error: ")
        return [Row(figure, f"fails: {why}", target, "", "fails")]


# ---- the proxy: added latency, inspected throughput and memory -----------------------------------


def latency_rows(samples: resp.Samples) -> list[Row]:
    rows = []
    for mode, limit in (
        ("https explicit", 1.0),
        ("https transparent", 1.0),
        ("https inspected", 3.0),
        ("http explicit", 1.5),
        ("http transparent", 1.5),
    ):
        for client in resp.CLIENTS:
            a = resp.added(samples, client, mode)
            figure = f"added ms, full {mode} response, new conn, {client}"
            value = f"{a.median:+.2f} (p95 {a.p95:+.2f})"
            rows.append(judged(figure, value, f"<= +{limit:g} median", f"{a.ratio:.2f}x direct", a.median <= limit))
    for mode in resp.REUSED[1:]:  # no target in the issue: the same stall's other face (body behind head)
        for client in resp.CLIENTS:
            a = resp.added(samples, client, mode)
            value = f"{a.median:+.2f} (p95 {a.p95:+.2f})"
            rows.append(Row(f"added ms, {mode} connection, {client}", value, "", f"{a.ratio:.2f}x direct"))
    return rows


def memory_rows(srv: c.Servers, px: ns.Proxy2, conns: int) -> list[Row]:
    """RSS (with relay workers) after `conns` inspected connections, 50 at a time, all closed, against
    its RSS before them (the inspected path already warm: imports, the leaf certificate)."""
    inspected = dp._modes(srv, px, 30)["https inspected"]
    start = px.memory_kib()["VmRSS"]
    px.reset_peak()
    with ThreadPoolExecutor(50) as pool:
        list(pool.map(lambda _: inspected(), range(conns)))
    peak = px.memory_kib()["VmHWM"]
    time.sleep(2)  # closing is asynchronous in the proxy
    after = px.memory_kib()["VmRSS"]
    ratio = after / start
    value = f"{after / 1024:.0f} MiB (start {start / 1024:.0f}, peak {peak / 1024:.0f})"
    figure = f"proxy RSS after {conns} inspected conns closed"
    return [judged(figure, value, "<= 1.25x start", f"{ratio:.2f}x start", ratio <= 1.25)]


def throughput_rows(srv: c.Servers, px: ns.Proxy2, mb: int, repeat: int) -> list[Row]:
    tp = dp.throughput(srv, px, mb, repeat, 600)["https"]
    r = tp[dp.INSPECTED] / tp["direct"]
    cpu, passthrough = tp[f"{dp.INSPECTED} cpu"], tp["explicit cpu"]
    return [
        judged(
            f"inspected HTTPS throughput, {mb} MiB",
            f"{tp[dp.INSPECTED]:.0f} MB/s",
            ">= 0.5x",
            f"{r:.2f}x direct",
            r >= 0.5,
        ),
        judged(
            "inspected proxy CPU-s per GB",
            f"{cpu:.2f}",
            "<= 2",
            f"{cpu / passthrough:.1f}x passthrough" if passthrough else "passthrough 0.00",
            cpu <= 2,
        ),
    ]


def proxy_rows(args: argparse.Namespace) -> list[Row]:
    with ns.servers_and_proxy() as (srv, px):
        rows = latency_rows(resp.measure(srv, px, args.n, 10))
        rows += guarded("proxy RSS after inspected conns", "<= 1.25x start", partial(memory_rows, srv, px, args.conns))
        rows += guarded(
            "inspected HTTPS throughput", ">= 0.5x", partial(throughput_rows, srv, px, args.mb, args.repeat)
        )
    return rows


# ---- sandgate run: cold start, warm start, big policies ------------------------------------------


def cold_rows(r: sb.Runner, srv: c.Servers, n: int) -> list[Row]:
    """`--allow <cidr> -- curl https://...` after `daemon stop` (cold) and again with the daemon up (warm);
    the baseline is the same curl without sandgate (its CA by absolute path: the sandbox's cwd copy is relative)."""
    url = srv.url("https", "/small")
    curl = ["curl", "-sS", "-o", "/dev/null", "--cacert", "ca.pem", url]  # inside: the sandbox's proxy settings
    allow = ["--allow", f"{c.SANDBOX_SERVER_IP}/32:{srv.https_port}"]
    bare = statistics.median(
        sb.timed_argv(["curl", "-sS", "-o", "/dev/null", "--cacert", str(srv.certs.ca_pem), url]) for _ in range(n)
    )
    cold = []
    for _ in range(n):
        r.stop_daemon()
        cold.append(r.timed(["run", "-q", *allow, "--", *curl]))
    r.settle()
    warm = statistics.median(r.timed(["run", "-q", *allow, "--", *curl]) for _ in range(n))
    med = statistics.median(cold)
    return [
        judged(
            "cold start + first HTTPS request (curl)",
            f"{med:.3f} s",
            "<= 0.2 s",
            f"{med / bare:.0f}x bare curl",
            med <= 0.2,
        ),
        Row("warm start + first HTTPS request (curl)", f"{warm:.3f} s", "", f"{warm / bare:.0f}x bare curl"),
    ]


def warm_rows(r: sb.Runner, n: int) -> tuple[list[Row], float]:
    """`sandgate run -q -- true` with the daemon up, interleaved with `unshare -Urn true`; and its median."""
    r.timed(["run", "-q", "--", "true"])  # the daemon up, the page cache warm
    runs, unshare = [], []
    for _ in range(n):
        unshare.append(sb.timed_argv(["unshare", "-Urn", "true"]))
        runs.append(r.timed(["run", "-q", "--", "true"]))
    med, base = statistics.median(runs), statistics.median(unshare)
    value = f"{med * 1000:.1f} ms (unshare {base * 1000:.1f})"
    row = judged("warm start `sandgate run -q -- true`", value, "<= 50 ms", f"{med / base:.0f}x unshare", med <= 0.05)
    return [row], med


def big_policy_rows(r: sb.Runner, warm: float, args: argparse.Namespace) -> list[Row]:
    rows = []
    policies: list[tuple[str, Callable[..., object], int]] = [
        ("hosts_file", sb.hosts_file_policy, n) for n in args.names
    ]
    policies += [("plain `- host:` list", sb.host_list_policy, n) for n in args.host_list]
    runs = args.big_runs
    for label, make, n in policies:
        figure = f"warm start, {n:,} names, {label}"

        def one(make: Callable[..., object] = make, n: int = n, figure: str = figure) -> list[Row]:
            argv = ["run", "-q", "--policy", str(make(r.work, n)), "--", "true"]
            first = r.timed(argv, timeout=300)  # compiled (and cached) by this one
            med = statistics.median(r.timed(argv, timeout=300) for _ in range(runs))
            value = f"{med:.3f} s (first {first:.2f})"
            return [judged(figure, value, "<= 1 s", f"{med / warm:.1f}x no policy", med <= 1.0)]

        rows += guarded(figure, "<= 1 s", one)
    return rows


OTHER_TOOLS = {"codex": ["sandbox", "linux", "true"], "srt": ["true"]}  # each tool's own `true` in its sandbox


def other_tool_rows(warm: float, n: int) -> list[Row]:
    rows = []
    for tool, args in OTHER_TOOLS.items():
        path = shutil.which(tool)
        figure = f"warm start against {tool}"
        if path is None:
            rows.append(Row(figure, "not installed", "", "", "skipped"))
            continue

        def one(path: str = path, args: list[str] = args, figure: str = figure) -> list[Row]:
            theirs = statistics.median(sb.timed_argv([path, *args]) for _ in range(n))
            return [Row(figure, f"{theirs * 1000:.1f} ms", "", f"sandgate {warm / theirs:.2f}x")]

        rows += guarded(figure, "", one)
    return rows


def start_rows(args: argparse.Namespace) -> list[Row]:
    if not ns.add_server_address():
        raise RuntimeError(f"cannot hold {c.SANDBOX_SERVER_IP} on a dummy link here")
    with c.local_servers(c.SANDBOX_SERVER_IP) as srv, sb.isolated() as r:
        shutil.copy(srv.certs.ca_pem, r.work / "ca.pem")  # the run's cwd: visible inside
        rows = guarded("cold start + first HTTPS request", "<= 0.2 s", lambda: cold_rows(r, srv, args.cold))
        warm, med = warm_rows(r, args.starts)
        rows += warm + big_policy_rows(r, med, args) + other_tool_rows(med, args.starts)
    return rows


# ---- the decision ---------------------------------------------------------------------------------


def decision_rows(args: argparse.Namespace) -> list[Row]:
    small, big = (rb.measure_size(n, args.decisions, 5, 1_000, 1) for n in (10, 100_000))
    rows = []
    for what, a, b in (("warm", small.warm_ns, big.warm_ns), ("cold", small.cold_ns, big.cold_ns)):
        figure = f"ns per decision, {what}, 100,000 rules"
        if what == "warm":  # the figure (3.7 us); a first sight of a name is shown, not judged
            rows.append(judged(figure, f"{b:.0f}", "flat: <= 1.5x", f"{b / a:.2f}x 10 rules", b <= 1.5 * a))
        else:
            rows.append(Row(figure, f"{b:.0f}", "", f"{b / a:.2f}x 10 rules"))
    return rows


def print_table(rows: list[Row]) -> None:
    w = max(len(r.figure) for r in rows)
    print(f"{'figure':<{w}}  {'value':<30} {'target':<16} {'ratio':<20} verdict")
    for r in rows:
        if r.verdict == "fails":  # the whole reason, however long, on the row's own line
            print(f"{r.figure:<{w}}  {r.value}  (target {r.target})")
        else:
            print(f"{r.figure:<{w}}  {r.value:<30} {r.target:<16} {r.ratio:<20} {r.verdict}")


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30, help="requests per latency mode and client (default 30)")
    ap.add_argument("--conns", type=int, default=300, help="inspected connections before the RSS check (default 300)")
    ap.add_argument("--mb", type=int, default=64, help="MiB per throughput download (default 64)")
    ap.add_argument("--repeat", type=int, default=1, help="downloads per path, median (default 1)")
    ap.add_argument("--cold", type=int, default=3, help="cold starts (default 3)")
    ap.add_argument("--starts", type=int, default=10, help="warm starts, interleaved with unshare (default 10)")
    ap.add_argument("--big-runs", type=int, default=3, help="warm starts per big policy (default 3)")
    ap.add_argument("--names", type=_sizes, default=[10_000, 100_000], help="hosts_file sizes (default 10000,100000)")
    ap.add_argument("--host-list", type=_sizes, default=[10_000], help="plain host-list sizes (default 10000)")
    ap.add_argument("--decisions", type=int, default=20_000, help="decisions per timing pass (default 20000)")
    args = ap.parse_args()
    if not ns.enter("scorecard.py"):
        return 0
    started = time.perf_counter()
    rows = guarded("added ms to a full HTTPS response", "<= +1 median", lambda: proxy_rows(args))
    rows += guarded("sandgate run starts", "", lambda: start_rows(args))
    rows += guarded("ns per decision", "flat", lambda: decision_rows(args))
    print(f"issue 25 scorecard: {c.CHECKOUT}; {args.n} requests per latency mode and client, {args.starts} warm starts")
    print()
    print_table(rows)
    print(f"\n(total run time {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
