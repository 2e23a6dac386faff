#!/usr/bin/env python3
"""What a burst of connections to one name costs upstream: the daemon's one resolver against the old way.

What: a small DNS server on 127.0.0.1 (a thread of this process) answers every A query with one
address and every AAAA query with NODATA plus an SOA, after --delay ms, and counts what it is asked.
--n lookups of one name start at once, --rounds times (a round every --gap ms, as a build's
connections come in bursts):

  baseline  the daemon before issue 23: every lookup its own dnspython resolver asking A, then
            AAAA, no cache (what `resolver:` policies did; the system path used getaddrinfo alike)
  resolver  netguard.decision.resolver: one shared cache, one query in flight per name and type

Why: 40 connections to one name cost 80 upstream queries, and every query is one more chance for
a lost datagram to become a refusal. Prints the queries and the wall time of each, and their ratio
(resolver / baseline). No pass/fail threshold; the figures are comparable only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import dns.asyncresolver
import dns.message
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netguard.decision.resolver import Resolver

NAME = "many.bench.test"


class CountingDns:
    """UDP on 127.0.0.1: A -> 192.0.2.1 (TTL 60), AAAA -> NODATA with an SOA, each after `delay` s."""

    def __init__(self, delay: float) -> None:
        self.delay, self.asked = delay, 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                wire, addr = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            self.asked += 1
            threading.Timer(self.delay, self.sock.sendto, (self._answer(wire), addr)).start()

    @staticmethod
    def _answer(wire: bytes) -> bytes:
        q = dns.message.from_wire(wire)
        r = dns.message.make_response(q)
        question = q.question[0]
        if question.rdtype == dns.rdatatype.A:
            r.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", "192.0.2.1"))
        else:
            r.authority.append(dns.rrset.from_text("test.", 60, "IN", "SOA", "ns.test. h.test. 1 2 3 4 30"))
        return r.to_wire()


async def baseline(port: int) -> None:
    """One lookup as the daemon did it before: a resolver of its own, A then AAAA, nothing kept."""
    r = dns.asyncresolver.Resolver(configure=False)
    r.nameservers, r.port, r.lifetime = ["127.0.0.1"], port, 5.0
    for rdtype in ("A", "AAAA"):
        try:
            await r.resolve(NAME, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            pass


async def rounds(n: int, count: int, gap: float, one: Callable[[], Awaitable[None]]) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        await asyncio.gather(*(one() for _ in range(n)))
        await asyncio.sleep(gap)
    return time.perf_counter() - t0


def measure(args: argparse.Namespace, shared: bool) -> tuple[int, float]:
    server = CountingDns(args.delay / 1000)
    try:

        async def main() -> float:
            r = Resolver()
            upstream = ("127.0.0.1", server.port)

            async def one() -> None:
                if shared:
                    await r.addresses(NAME, upstream)
                else:
                    await baseline(server.port)

            return await rounds(args.n, args.rounds, args.gap / 1000, one)

        took = asyncio.run(main())
        return server.asked, took
    finally:
        server.stop.set()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=40, help="lookups of one name at once")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--gap", type=float, default=50.0, help="ms between rounds")
    p.add_argument("--delay", type=float, default=5.0, help="ms the server takes to answer")
    args = p.parse_args()
    old_q, old_t = measure(args, shared=False)
    new_q, new_t = measure(args, shared=True)
    print(f"{args.rounds} rounds of {args.n} lookups of one name, answers after {args.delay:g} ms")
    print(f"{'':10} {'queries':>8} {'wall ms':>9}")
    print(f"{'baseline':10} {old_q:>8} {old_t * 1000:>9.1f}")
    print(f"{'resolver':10} {new_q:>8} {new_t * 1000:>9.1f}")
    print(f"ratio resolver/baseline: queries {new_q / old_q:.3f}, wall time {new_t / old_t:.2f}")


if __name__ == "__main__":
    main()
