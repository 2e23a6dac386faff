#!/usr/bin/env python3
"""Cost of one policy decision (`netguard.rules.decide`) as the policy grows from 10 to 100,000 rules.

What: builds synthetic policies of 10, 1,000 and 100,000 rules (exact hosts, `*.suffix`
wildcards, a few cidrs, and a small deny list) through the real parser
(`netguard.policy.parse_network`) and compiler (`netguard.rules.compile_policy`), then times
--decisions (default 20,000) calls of `decide` per policy on one fixed random mix of
destinations: hits on exact names, hits through a wildcard, misses, IP literals (inside and
outside the cidrs), with ports allowed and not. Two variants per size:

  cold  each host normalised afresh (rules' memo of hosts.normalise bypassed): the cost of
        a name seen for the first time;
  warm  the same mix drawn from --distinct (default 1,000) destinations already decided
        once, so normalisation is a memo hit and what remains is mostly the index lookup.

Without the split the figures would mostly measure memo hit rates, which differ between
sizes (a 10-rule policy has only a handful of exact names to hit) rather than the index.

Why: the proxy decides on every connection (and the DNS listener on every query), and
policies built from several bundled allowlists can be large. The rules module promises
O(labels) per name and O(prefix lengths) per address, never O(rules); the ratio column
against the 10-rule policy should stay near 1 rather than grow with the rule count. Parse
and compile times are printed too, since they are paid once at startup.

Timings include the Python loop overhead (tens of ns); the same loop is used for every size.
No pass/fail threshold.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netguard import policy as npolicy
from netguard import rules as nrules

SIZES = (10, 1_000, 100_000)
CIDR_PREFIXES = (12, 16, 24, 32)
#: One entry of a policy's `allow:`/`deny:` list as YAML would give it: a bare name or a mapping.
Entry = str | dict[str, Any]


def build_entries(n: int) -> tuple[list[Entry], list[Entry]]:
    """allow and deny entries totalling `n`: ~4% deny, ~1% cidr (at least one), ~25% wildcard, rest exact."""
    n_deny = max(1, n // 25)
    n_cidr = max(1, n // 100)
    n_wild = max(1, n // 4)
    n_exact = n - n_deny - n_cidr - n_wild
    allow: list[Entry] = []
    for i in range(n_exact):
        if i % 3 == 0:
            allow.append(f"pkg{i}.example.org")  # bare string: default ports 80, 443
        else:
            allow.append({"host": f"pkg{i}.example.org", "ports": [443, 8443]})
    for i in range(n_wild):
        allow.append(f"*.mirror{i}.example.net")
    for i in range(n_cidr):
        plen = CIDR_PREFIXES[i % len(CIDR_PREFIXES)]
        # Distinct networks per prefix length, strict (host bits zero). Policy data only: no traffic.
        k = i // len(CIDR_PREFIXES)
        hi, lo = (k // 256) % 256, k % 256
        net = {
            12: f"{20 + k // 16 % 200}.{k % 16 * 16}.0.0",
            16: f"100.{lo}.0.0",
            24: f"10.{hi}.{lo}.0",
            32: f"192.168.{hi}.{lo}",
        }[plen]
        allow.append({"cidr": f"{net}/{plen}", "ports": [443]})
    deny: list[Entry] = []
    for i in range(n_deny):
        deny.append(f"*.blocked{i}.example.org" if i % 2 else f"bad{i}.example.org")
    return allow, deny


def build_queries(allow: list[Entry], count: int, rng: random.Random) -> list[tuple[str, int]]:
    """A fixed mix: 30% exact hits, 30% wildcard hits, 25% misses, 15% IP literals; ports mostly 443."""
    exact = [
        e if isinstance(e, str) else e["host"]
        for e in allow
        if (isinstance(e, str) and not e.startswith("*.")) or (isinstance(e, dict) and "host" in e)
    ]
    wild = [e[2:] for e in allow if isinstance(e, str) and e.startswith("*.")]
    cidrs = [e["cidr"] for e in allow if isinstance(e, dict) and "cidr" in e]
    queries: list[tuple[str, int]] = []
    for _ in range(count):
        port = rng.choices((443, 80, 22), weights=(80, 15, 5))[0]
        r = rng.random()
        if r < 0.30:
            host = rng.choice(exact)
        elif r < 0.60:
            host = f"a{rng.randrange(1000)}.cdn.{rng.choice(wild)}"
        elif r < 0.85:
            host = f"x{rng.randrange(10**6)}.unknown{rng.randrange(1000)}.example.io"
        elif r < 0.925:
            net = rng.choice(cidrs).split("/")[0].split(".")
            host = ".".join([*net[:3], str(1 + rng.randrange(254)) if net[3] == "0" else net[3]])
        else:
            host = f"203.0.113.{rng.randrange(256)}"  # TEST-NET-3: never in any rule
        queries.append((host, port))
    return queries


def time_decisions(rs: nrules.Ruleset, queries: list[tuple[str, int]], repeats: int) -> list[float]:
    """ns per decision for each of `repeats` passes over `queries`."""
    decide = nrules.decide
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for host, port in queries:
            decide(rs, host, port)
        out.append((time.perf_counter_ns() - t0) / len(queries))
    return out


@contextlib.contextmanager
def uncached_normalise() -> Iterator[None]:
    """Within the block, `decide` normalises every host afresh (bypasses rules' memo of hosts.normalise, if any)."""
    memo: Any = getattr(nrules, "normalise", None)
    plain: Any = getattr(memo, "__wrapped__", None)
    if plain is None:  # no memo in this version of rules: already uncached
        yield
        return
    nrules.normalise = plain
    try:
        yield
    finally:
        nrules.normalise = memo


def clear_memo() -> None:
    clear = getattr(getattr(nrules, "normalise", None), "cache_clear", None)
    if clear is not None:
        clear()


@dataclass(frozen=True)
class SizeRow:
    """One policy size's figures: parse and compile seconds, ns per decision cold and warm, the outcomes."""

    rules: int
    parse_s: float
    compile_s: float
    cold_ns: float
    warm_ns: float
    outcomes: collections.Counter[nrules.Action]


def measure_size(n: int, decisions: int, repeats: int, distinct: int, seed: int) -> SizeRow:
    """Build, parse and compile a policy of `n` rules, then time `decide` on the cold and the warm mix."""
    allow, deny = build_entries(n)
    t0 = time.perf_counter()
    pol = npolicy.parse_network({"allow": allow, "deny": deny}, "bench")
    t1 = time.perf_counter()
    rs = nrules.compile_policy(pol)
    t2 = time.perf_counter()
    assert len(pol.allow) + len(pol.deny) == n
    rng = random.Random(seed)
    # cold: `decisions` draws from the mix, every host normalised afresh.
    cold_q = build_queries(allow, decisions, rng)
    # warm: the same mix restricted to `distinct` destinations, each seen before (memo hits).
    pool = build_queries(allow, distinct, rng)
    warm_q = [rng.choice(pool) for _ in range(decisions)]
    with uncached_normalise():
        time_decisions(rs, cold_q[:2000], 1)  # warm-up of the interpreter paths
        cold = time_decisions(rs, cold_q, repeats)
    clear_memo()
    time_decisions(rs, pool, 1)  # fills the memo
    warm = time_decisions(rs, warm_q, repeats)
    actions = collections.Counter(nrules.decide(rs, h, p).action for h, p in cold_q)
    clear_memo()
    return SizeRow(n, t1 - t0, t2 - t1, statistics.median(cold), statistics.median(warm), actions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=20_000, help="decisions timed per pass (default 20000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per size; median reported (default 5)")
    ap.add_argument(
        "--distinct",
        type=int,
        default=1_000,
        help="distinct destinations in the warm mix (default 1000, below the name memo's size)",
    )
    ap.add_argument("--seed", type=int, default=1, help="random seed for the query mix (default 1)")
    args = ap.parse_args()
    started = time.perf_counter()
    memo = hasattr(getattr(nrules, "normalise", None), "cache_clear")
    rows = [measure_size(n, args.decisions, args.repeats, args.distinct, args.seed) for n in SIZES]

    c10, w10 = rows[0].cold_ns, rows[0].warm_ns
    print(f"netguard.rules.decide: {args.decisions} decisions per pass, median of {args.repeats} passes")
    print("  cold: every destination normalised afresh (first sight of a name)")
    print(
        f"  warm: {args.distinct} distinct destinations seen before"
        + (" (name memo hits)" if memo else " (this rules version has no name memo: same work as cold)")
    )
    print()
    print(
        f"{'rules':>8} {'parse ms':>9} {'compile ms':>11} {'cold ns':>8} {'vs 10':>6} {'warm ns':>8} {'vs 10':>6}"
        f"   outcomes (cold mix)"
    )
    for r in rows:
        mix = ", ".join(f"{k} {v / args.decisions:.0%}" for k, v in sorted(r.outcomes.items()))
        print(
            f"{r.rules:>8,} {r.parse_s * 1000:>9.1f} {r.compile_s * 1000:>11.1f} {r.cold_ns:>8.0f} "
            f"{r.cold_ns / c10:>5.2f}x {r.warm_ns:>8.0f} {r.warm_ns / w10:>5.2f}x   {mix}"
        )
    print()
    print(f"total run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
