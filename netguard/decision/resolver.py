"""The daemon's one resolver: every connection's lookup and every DNS query a sandbox forwards go through it.

One cache (netguard.dnscache: TTLs honoured, bounded, negative answers briefly), one query in flight
per (name, type, class, upstream): concurrent askers wait on the same flight, so 40 connections to
one name cost one A and one AAAA query. A flight resends its query on dnscache.SCHEDULE (1, 2, 4 s)
and keeps listening for the answer to every copy it sent (one socket, one id: an answer that comes
after 5.3 s is taken, not dropped), up to dnscache.DEADLINE (15 s, longer than glibc's own 10).

What leaves is only a query built here: one question, the lower-cased name, type and class, RD,
EDNS without options (netguard.decision.dns rebuilds every sandbox query through this). A reply counts
only from a server that was asked, with the query's id and question (an off-path spoof must guess
both the port and the id). The upstream is the policy's `resolver:`, else the system's nameservers
(netguard.decision.sysdns; /etc/hosts first for connections, as glibc does), asked directly so TTLs
are known. A timing side channel stays: a sandbox can tell that a name is cached, i.e. that another
sandbox of the same user with the same upstream looked it up lately.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from netguard import dnscache
from netguard.decision.sysdns import SystemDns
from netguard.dnscache import Key, Result, Servers

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Server = tuple[str, int]
MAX_FLIGHTS = 4096  # lookups in flight at once (one UDP socket each): the daemon's fd table is bounded
#: After one family's addresses arrive, how long the other may still take (RFC 8305's "resolution delay",
#: generously): a resolver that drops AAAA queries must not hold every connection for the whole deadline.
OTHER_FAMILY_WAIT = 0.5
INBOX = 64  # datagrams queued per flight; a flood of junk replies is dropped, not buffered
_FAILURES = (dns.rcode.SERVFAIL, dns.rcode.REFUSED)  # one nameserver's trouble: the next may answer


class LookupFailed(Exception):
    """A name that gave no address; `why` is what the refusal says (NXDOMAIN, NODATA, a timeout, SERVFAIL)."""

    def __init__(self, why: str, trouble: bool) -> None:
        super().__init__(why)
        self.why, self.trouble = why, trouble


class Datagrams(Protocol):
    """A flight's UDP: send to a server, take the next datagram that arrives (None: `timeout` s passed)."""

    def send(self, wire: bytes, server: Server) -> None: ...

    async def receive(self, timeout: float) -> tuple[bytes, Server] | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Io:
    """Everything a flight does to the world, injectable (tests: a fake transport and clock)."""

    open_udp: Callable[[Servers], Awaitable[Datagrams]]
    tcp: Callable[[dns.message.Message, Server, float], Awaitable[dns.message.Message]]
    clock: Callable[[], float] = time.monotonic


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[tuple[bytes, Server]]) -> None:
        self.queue = queue

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not self.queue.full():
            self.queue.put_nowait((data, (str(addr[0]), int(addr[1]))))

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP error for one copy: the next resend or the deadline deals with it


class UdpDatagrams:
    """One unconnected UDP socket per address family the servers need, shared by every copy of one query."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[bytes, Server]] = asyncio.Queue(INBOX)
        self.transports: dict[int, asyncio.DatagramTransport] = {}

    @classmethod
    async def open(cls, servers: Servers) -> UdpDatagrams:
        self = cls()
        loop = asyncio.get_running_loop()
        try:
            for family in {_family(host) for host, _ in servers}:
                transport, _ = await loop.create_datagram_endpoint(lambda: _Inbox(self.queue), family=family)
                self.transports[family] = transport
        except BaseException:
            self.close()
            raise
        return self

    def send(self, wire: bytes, server: Server) -> None:
        self.transports[_family(server[0])].sendto(wire, server)

    async def receive(self, timeout: float) -> tuple[bytes, Server] | None:
        try:
            return await asyncio.wait_for(self.queue.get(), max(timeout, 0.0))
        except TimeoutError:
            return None

    def close(self) -> None:
        for t in self.transports.values():
            t.close()


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def _tcp(q: dns.message.Message, server: Server, timeout: float) -> dns.message.Message:
    return await dns.asyncquery.tcp(q, server[0], port=server[1], timeout=max(timeout, 0.001))


REAL_IO = Io(UdpDatagrams.open, _tcp)


def _same_server(a: Server, b: Server) -> bool:
    try:
        return a[1] == b[1] and ipaddress.ip_address(a[0].split("%")[0]) == ipaddress.ip_address(b[0].split("%")[0])
    except ValueError:
        return False


def _reply_to(q: dns.message.Message, wire: bytes, sender: Server, servers: Servers) -> dns.message.Message | None:
    """`wire` parsed, if it is a reply to `q` from one of `servers`; else None (junk and spoofs are ignored)."""
    if not any(_same_server(sender, s) for s in servers):
        return None
    try:
        msg = dns.message.from_wire(wire)
    except Exception:  # dnspython raises many kinds for malformed input: all of them mean "not our answer"
        return None
    return msg if q.is_response(msg) else None


async def exchange(
    q: dns.message.Message, servers: Servers, io: Io, *, schedule: tuple[float, ...], deadline: float
) -> dns.message.Message:
    """`q`'s answer: sent at dnscache.send_times (rotating over `servers`), any copy's answer taken;
    a truncated one asked again over TCP. A SERVFAIL or REFUSED from one nameserver sends the query
    to the next at once (as glibc moves on); it is the answer only once every one failed or time ran
    out. Raises TimeoutError when `deadline` s pass without any answer."""
    wire, start = q.to_wire(), io.clock()
    times = dnscache.send_times(schedule, deadline)
    failed: dict[int, dns.message.Message] = {}  # by the failing server's index in `servers`
    udp = await io.open_udp(servers)
    try:
        sent = 0
        while (now := io.clock() - start) < deadline:
            if sent < len(times) and now >= times[sent]:
                udp.send(wire, servers[sent % len(servers)])
                sent += 1
                continue
            got = await udp.receive((times[sent] if sent < len(times) else deadline) - now)
            reply = None if got is None else _reply_to(q, *got, servers)
            if got is None or reply is None:
                continue
            if reply.flags & dns.flags.TC:  # too large for UDP: the same question over TCP, same server
                return await io.tcp(q, got[1], deadline - (io.clock() - start))
            if reply.rcode() not in _FAILURES or len(servers) == 1:
                return reply
            failed[next(i for i, s in enumerate(servers) if _same_server(got[1], s))] = reply
            others = [s for i, s in enumerate(servers) if i not in failed]
            if not others:
                return reply
            udp.send(wire, others[0])
        if failed:
            return next(iter(failed.values()))
        raise TimeoutError
    finally:
        udp.close()


@dataclass
class Resolver:
    """The cache and the flights; one per event loop (`shared`), i.e. one per daemon."""

    io: Io = REAL_IO
    schedule: tuple[float, ...] = dnscache.SCHEDULE
    deadline: float = dnscache.DEADLINE
    cache: dnscache.Cache = field(default_factory=dnscache.Cache)
    system: SystemDns = field(default_factory=SystemDns)
    max_flights: int = MAX_FLIGHTS
    sent: int = 0  # flights started, i.e. questions that went upstream (each up to len(send_times) copies)
    _flights: dict[Key, asyncio.Task[Result]] = field(default_factory=dict, init=False, repr=False)

    def servers(self, upstream: Server | None) -> Servers:
        """Who answers: the policy's resolver, or (None) the system's nameservers."""
        return ((upstream[0], upstream[1]),) if upstream is not None else self.system.servers()

    async def query(
        self,
        name: str | dns.name.Name,
        rdtype: dns.rdatatype.RdataType,
        rdclass: dns.rdataclass.RdataClass = dns.rdataclass.IN,
        upstream: Server | None = None,
        *,
        within: float | None = None,
    ) -> Result:
        """The result for one question, from the cache or the one flight for it. `within`: how long this
        asker waits (the flight goes on for the others and the cache). Raises DNSException for a bad name."""
        k = dnscache.key(name, rdtype, rdclass, self.servers(upstream))
        hit = self.cache.get(k, self.io.clock())
        if hit is not None:
            return hit
        flight = self._flights.get(k)
        if flight is None:
            if len(self._flights) >= self.max_flights:
                return dnscache.busy(len(self._flights))
            flight = self._flights[k] = asyncio.get_running_loop().create_task(self._fly(k))
            flight.add_done_callback(lambda t: self._flights.pop(k) if self._flights.get(k) is t else None)
            self.sent += 1
        if within is None:
            return await asyncio.shield(flight)
        try:
            return await asyncio.wait_for(asyncio.shield(flight), within)
        except TimeoutError:
            return dnscache.timed_out(within)

    async def _fly(self, k: Key) -> Result:
        q = dns.message.make_query(k.name, k.rdtype, k.rdclass, use_edns=0)  # RD, EDNS0, no option: ours alone
        try:
            reply = await exchange(q, k.servers, self.io, schedule=self.schedule, deadline=self.deadline)
        except (TimeoutError, dns.exception.Timeout):
            r = dnscache.timed_out(self.deadline)
        except (OSError, dns.exception.DNSException, ValueError) as e:
            r = dnscache.unreachable(str(e) or type(e).__name__)
        else:
            r = dnscache.classify(reply, k)
        self.cache.put(k, r, self.io.clock())
        return r

    async def addresses(self, name: str, upstream: Server | None) -> list[Address]:
        """Every address of `name` (IPv4 first) for a connection; /etc/hosts first when the upstream is the
        system's. Raises LookupFailed, whose words tell a name that does not exist from a resolver in trouble."""
        if upstream is None and (pinned := self.system.hosts(name)):
            return sorted(pinned, key=lambda a: a.version)
        try:
            results = await self._both(name, upstream)
        except dns.exception.DNSException as e:
            raise LookupFailed(f"not a name DNS can carry ({type(e).__name__})", False) from None
        found: list[Address] = []
        for k, r in results:
            for a in map(ipaddress.ip_address, dnscache.addresses(r, k)):
                if a not in found:
                    found.append(a)
        if found:
            return sorted(found, key=lambda a: a.version)
        worst = next((r for _, r in results if r.trouble), None) or next(
            (r for _, r in results if r.outcome == "nxdomain"), results[0][1]
        )
        raise LookupFailed(worst.why or dnscache.NO_ADDRESS, worst.trouble)

    async def _both(self, name: str, upstream: Server | None) -> list[tuple[Key, Result]]:
        """A and AAAA at once; once one family has addresses the other gets OTHER_FAMILY_WAIT more."""
        servers = self.servers(upstream)
        keys = [dnscache.key(name, t, dns.rdataclass.IN, servers) for t in (dns.rdatatype.A, dns.rdatatype.AAAA)]
        now = self.io.clock()
        kept = [(k, self.cache.get(k, now)) for k in keys]
        if all(r is not None for _, r in kept):  # the common case: no task, no wait
            return [(k, r) for k, r in kept if r is not None]
        tasks = [asyncio.ensure_future(self.query(k.name, k.rdtype, k.rdclass, upstream)) for k in keys]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(dnscache.addresses(t.result(), keys[tasks.index(t)]) for t in done) and pending:
                    await asyncio.wait(pending, timeout=OTHER_FAMILY_WAIT)
                    break
        finally:
            for t in tasks:
                t.cancel()  # only this asker's wait: the flight itself is shielded and fills the cache
        return [(k, t.result()) for k, t in zip(keys, tasks, strict=True) if t.done() and not t.cancelled()]


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Resolver] = weakref.WeakKeyDictionary()


def shared() -> Resolver:
    """The resolver of the running event loop: the daemon runs one loop, so this is its one resolver.

    Per loop, not per process, because a flight is a task of its loop (tests run many loops in one process)."""
    loop = asyncio.get_running_loop()
    r = _SHARED.get(loop)
    if r is None:
        r = _SHARED[loop] = Resolver()
    return r
