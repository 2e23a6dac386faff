"""sandgate's own DNS server: a sandbox's only resolver, answering allowed names and refusing the rest.

Why not mitmproxy's dns mode: it cannot serve a socket handed to us from inside a sandbox's
network namespace, and it forwards the client's bytes. Here an allowed query is rebuilt from
its name, type and class alone, so EDNS options, additional records, letter case (anything a
sandbox could hide data in) never leave; and only answer records that belong to the question
(its name and the CNAME chain from it) come back. Denied names are never sent upstream at all.

Query types. A name allowed by an exact host rule is served every type. A name allowed ONLY
through a wildcard rule (`*.example.org`) is forwarded for A and AAAA (their answers bring the
CNAME chain to the addresses along); SVCB and HTTPS are answered empty here, without asking
upstream, which is what most names on the internet answer, so curl and browsers fall back to
A/AAAA at once; every other type (TXT, NULL, MX, SRV, CNAME, ANY...) is REFUSED and the audit
record says why, unless the policy entry lists it (`{host: "*.example.org", dns: [TXT]}`).

What a wildcard allow still lets through (the residual channel, in plain words): every name a
sandbox looks up under an allowed wildcard, `<anything>.example.org`, travels through the
upstream resolver to the authoritative servers of example.org. The query name itself is the
message: whoever runs that domain (or any zone delegated below it) can read data the sandbox
spells into labels, about 250 bytes a query, as many queries as it likes, even when no TCP
connection is ever allowed. Answers come back the same way: A and AAAA records (4 and 16 bytes
each, many per answer) and the names in the CNAME chain can carry data into the sandbox. Limiting
the types takes away the easy carriers of DNS tunnels (kilobyte TXT and NULL answers) and nothing
but name, type and class ever leaves, but the channel stays open: a wildcard allow is only as safe
as the people who run that domain. Prefer exact names, and never allow a wildcard on a domain
where others can create names (hosting, dynamic DNS, a shared cloud suffix).

Upstream, allowed queries go through the daemon's one resolver (netguard.decision.resolver), the one
every connection's lookup uses too: its cache answers a name a sandbox (or a connection) asked
lately, one query is in flight per name and type, and a slow upstream is waited for (resends, 15 s)
rather than turned into a SERVFAIL at glibc's 5-s retry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import struct
from typing import Literal

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from netguard import dnscache, hosts, rules, verdict
from netguard.audit import decision_record, new_id
from netguard.decision import resolver
from netguard.decision.binding import Binding

#: What DNS answers for a name that still needs a human's approval: any address works (all TCP
#: from the sandbox reaches the proxy, which then decides by SNI/Host and asks); the real name
#: is not looked up upstream before someone said yes.
PENDING_ADDRESS = ipaddress.IPv4Address("198.18.255.254")
UDP_DEFAULT = 512  # a client without EDNS can take no more (RFC 1035)
UDP_MAX = 4096  # cap on what an EDNS client may ask for: large UDP answers fragment
MAX_INFLIGHT = 128  # per UDP socket: a query flood must not grow the daemon's memory
TCP_MAX_CONNS = 32  # per TCP listener
TCP_MAX_QUERIES = 100  # per TCP connection
TCP_IDLE = 10.0  # seconds to wait for the next query (or for a slow client to take the answer)
BACKLOG = 4096  # what the launcher listens with (netguard.sandboxnet.BACKLOG)
#: RFC 8914 info-code of a policy refusal: 15 Blocked ("on a blocklist due to an internal security
#: policy imposed by the operator"). Not 18 Prohibited, which says the *client* is not authorised to
#: use this server: the sandbox may ask, it is the name that its policy refuses.
EDE_BLOCKED = dns.edns.EDECode.BLOCKED
EDE_TEXT_MAX = 300  # characters; should a refusal still not fit, it goes without (_wire)
logger = logging.getLogger("sandgate.dns")
#: How a query is answered: forwarded upstream, the placeholder address, NOERROR without records, REFUSED.
How = Literal["forward", "pending", "empty", "refuse"]


def _unserved(query: dns.message.Message) -> str | None:
    """Why a query is refused before any name is judged (not a plain one-question QUERY), else None."""
    if query.opcode() != dns.opcode.QUERY:
        return f"opcode {dns.opcode.to_text(query.opcode())} refused: only QUERY is served"
    if len(query.question) != 1:
        return f"{len(query.question)} questions refused: exactly one is served"
    return None


def _audit_name(name: str) -> str:
    try:
        return str(hosts.normalise(name))
    except hosts.HostError:
        return name


class DnsGate:
    """Decides, answers and audits DNS queries; one instance serves every sandbox, state is per query."""

    def __init__(self, timeout: float | None = None, names: resolver.Resolver | None = None) -> None:
        self.timeout = timeout  # how long a query waits for upstream; None: the resolver's deadline
        self._names = names  # None: the daemon's one resolver, shared with the connections (resolver.shared)

    async def answer(self, binding: Binding, wire: bytes, peer: object, *, tcp: bool = False) -> bytes | None:
        """The reply to one query (None: send nothing). Writes exactly one `dns` decision record."""
        try:
            query = dns.message.from_wire(wire)
        except Exception as e:
            self._record(binding, None, None, "deny", None, f"malformed DNS message ({type(e).__name__})")
            return _formerr(wire)
        first = query.question[0] if query.question else None
        if query.flags & dns.flags.QR:
            self._record(binding, first, None, "deny", None, "not a query (QR bit set)")
            return None  # never answer an answer: no reflection loops
        unserved = _unserved(query)
        if unserved is not None:
            self._record(binding, first, None, "deny", None, unserved)
            return _wire(_reply(query, dns.rcode.REFUSED), query, tcp)
        q = query.question[0]
        how, v = await self._decide(binding, q)
        d = v.decision
        self._record(binding, q, d.rule, "allow" if d.allowed else "deny", v.would, d.reason)
        if how == "refuse":
            # The same line a refused HTTP client reads in its 403 body, for clients that can take it.
            text = verdict.refusal_text(_audit_name(q.name.to_text(omit_final_dot=True)), None, d)
            return _wire(_reply(query, dns.rcode.REFUSED, ede=(EDE_BLOCKED, text)), query, tcp)
        if how == "empty":
            return _wire(_reply(query, dns.rcode.NOERROR), query, tcp)
        if how == "pending":
            answer = (
                [dns.rrset.from_text(q.name, 1, "IN", "A", str(PENDING_ADDRESS))]
                if q.rdtype == dns.rdatatype.A and q.rdclass == dns.rdataclass.IN
                else []
            )
            return _wire(_reply(query, dns.rcode.NOERROR, answer), query, tcp)
        return await self._forward(binding, query, q, tcp)

    async def _forward(self, b: Binding, query: dns.message.Message, q: dns.rrset.RRset, tcp: bool) -> bytes:
        """An allowed query's answer from upstream, cut to what belongs to the question."""
        names = self._names or resolver.shared()
        # Only the lower-cased name, type and class of the client's query ever leave (dnscache.key).
        up = await names.query(q.name, q.rdtype, q.rdclass, b.upstream(), within=self.timeout)
        if up.trouble:
            logger.info("dns forward of %s failed: %s", q.name, up.why)
        rcode = up.rcode
        if rcode > 15 and query.edns < 0:
            rcode = dns.rcode.SERVFAIL  # an extended rcode cannot be said to a client without EDNS
        return _wire(_reply(query, rcode, _belonging(up.answer, q)), query, tcp)

    async def _decide(self, b: Binding, q: dns.rrset.RRset) -> tuple[How, verdict.Verdict]:
        """How to answer, and the verdict: netguard.verdict's pipeline, with DNS's own ask and resolve steps.

        Asking defers (a placeholder address, decided for real when the connection comes); resolving
        an allowed name is its query-type filter.
        """
        name = q.name.to_text(omit_final_dot=True)
        how: list[How] = ["forward"]

        async def defer(d: rules.Decision) -> rules.Decision:
            how[0] = "pending"
            return verdict.deferred(d)

        async def by_type(v: verdict.Verdict) -> verdict.Verdict:
            if v.by != "policy":
                return v  # learned or deferred: the type filter is for names the policy allows
            how[0], v = _by_type(b, name, q, v)
            return v

        v = await b.verdict(name, None, defer, by_type)
        return (how[0] if v.allowed or how[0] == "empty" else "refuse"), v

    def _record(
        self, b: Binding, q: dns.rrset.RRset | None, rule: str | None, action: str, would: str | None, reason: str
    ) -> None:
        host = _audit_name(q.name.to_text(omit_final_dot=True)) if q is not None else None
        qtype = dns.rdatatype.to_text(q.rdtype) if q is not None else None
        b.write_decision(
            decision_record(
                b.task,
                new_id(),
                "dns",
                action,
                host,
                None,
                qtype=qtype,
                rule=rule,
                reason=reason,
                would=would,
            )
        )


def _by_type(b: Binding, name: str, q: dns.rrset.RRset, v: verdict.Verdict) -> tuple[How, verdict.Verdict]:
    """An allowed name's query by its type: a name matched only by wildcard rules is a channel to
    whoever runs that domain, so only address types (plus the entry's `dns:` list) are forwarded."""
    d = v.decision
    types = rules.dns_types(b.rules, name)
    is_in = q.rdclass == dns.rdataclass.IN
    if types is None or (is_in and q.rdtype in types):
        return "forward", v
    qtype = dns.rdatatype.to_text(q.rdtype)
    only = f"{_audit_name(name)} is allowed only by a wildcard rule ({d.reason})"
    how: How
    if not is_in:
        how, why = "refuse", f"class {dns.rdataclass.to_text(q.rdclass)} refused: {only}, which serves class IN"
    elif q.rdtype in rules.DNS_EMPTY_TYPES:
        how, why = "empty", f"type {qtype} not forwarded: {only}; answered empty, clients fall back to A/AAAA"
    else:
        how, why = (
            "refuse",
            (f"type {qtype} refused: {only}, which serves A and AAAA; add 'dns: [{qtype}]' to that entry to allow it"),
        )
    if b.learn:
        return "forward", verdict.learned(d, why)
    return how, verdict.Verdict(rules.Decision("deny", d.rule, why))


def _belonging(answer: tuple[dns.rrset.RRset, ...], q: dns.rrset.RRset) -> list[dns.rrset.RRset]:
    """Answer RRsets at the question's name and along its CNAME chain; everything else is dropped
    (a resolver's extra records are not the sandbox's business, nor a covert channel into it)."""
    k = dnscache.Key(q.name, q.rdtype, q.rdclass, ())
    return [_spelled(rrset, q.name) for rrset in dnscache.chain(answer, k)]


def _spelled(rrset: dns.rrset.RRset, qname: dns.name.Name) -> dns.rrset.RRset:
    """The question's own owner name as the client spelled it (0x20 case checks); others unchanged."""
    if rrset.name != qname or rrset.name.labels == qname.labels:
        return rrset
    return dns.rrset.from_rdata_list(qname, rrset.ttl, list(rrset))


def _reply(
    query: dns.message.Message,
    rcode: dns.rcode.Rcode,
    answer: list[dns.rrset.RRset] | None = None,
    *,
    ede: tuple[dns.edns.EDECode, str] | None = None,
) -> dns.message.Message:
    """A response built from the client's request: its id and question, our flags, and EDNS only if the
    query had it, with no option but our own Extended DNS Error (`ede`: RFC 8914 code and text)."""
    r = dns.message.Message(id=query.id)
    r.flags = dns.flags.QR | dns.flags.RA | (query.flags & dns.flags.RD)
    r.set_opcode(query.opcode())
    if query.opcode() == dns.opcode.QUERY:
        r.question = list(query.question)
    if query.edns >= 0:
        options: list[dns.edns.Option] = [dns.edns.EDEOption(ede[0], ede[1][:EDE_TEXT_MAX])] if ede else []
        r.use_edns(0, 0, UDP_MAX, options=options)
    r.set_rcode(rcode)
    r.answer = list(answer or [])
    return r


def _wire(r: dns.message.Message, query: dns.message.Message, tcp: bool) -> bytes:
    """Encoded within what the client can take; over UDP a too-large answer is sent empty with TC set."""
    limit = 65535 if tcp else max(UDP_DEFAULT, min(query.payload, UDP_MAX)) if query.edns >= 0 else UDP_DEFAULT
    try:
        return r.to_wire(max_size=limit)
    except dns.exception.TooBig:
        if r.options and not r.answer:  # a refusal's reason is a courtesy: the refusal itself must arrive
            r.use_edns(0, 0, UDP_MAX)
            return _wire(r, query, tcp)
        r.answer = []
        r.flags |= dns.flags.TC
        return r.to_wire(max_size=limit)


def _formerr(wire: bytes) -> bytes | None:
    """FORMERR for a message with a readable header that is a query; nothing for shorter garbage."""
    if len(wire) < 12 or wire[2] & 0x80:
        return None
    qid, flags = struct.unpack_from("!HH", wire)
    flags = 0x8000 | (flags & 0x7900) | dns.rcode.FORMERR  # QR, the client's opcode and RD
    return struct.pack("!HHHHHH", qid, flags, 0, 0, 0, 0)


# ---- serving sockets ------------------------------------------------------------------------


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, binding: Binding, gate: DnsGate) -> None:
        self.binding, self.gate = binding, gate
        self.transport: asyncio.DatagramTransport | None = None
        self.inflight: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str | int, int]) -> None:
        if len(self.inflight) >= MAX_INFLIGHT:
            if self.binding.refusals is not None:
                self.binding.refusals.refuse("queries", "dns", f"more than {MAX_INFLIGHT} DNS queries in flight")
            return  # dropped like on a congested link; the client retries
        task = asyncio.get_running_loop().create_task(self._answer(data, addr))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def _answer(self, data: bytes, addr: tuple[str | int, int]) -> None:
        try:
            reply = await self.gate.answer(self.binding, data, addr)
        except Exception:  # one bad query must not stop this sandbox's resolver
            logger.exception("dns: unexpected error answering a query")
            return
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply, addr)

    def connection_lost(self, exc: Exception | None) -> None:
        for task in list(self.inflight):
            task.cancel()


class DnsService:
    """A running UDP or TCP DNS listener; close() stops it and cuts its open connections."""

    def __init__(self, close: list[asyncio.BaseTransport | asyncio.Server], conns: set[asyncio.StreamWriter]) -> None:
        self._closables = close
        self._conns = conns

    def close(self) -> None:
        for c in self._closables:
            c.close()
        for w in list(self._conns):
            w.transport.abort()


async def serve_udp(sock: socket.socket, binding: Binding, gate: DnsGate) -> DnsService:
    """Answer queries arriving on a bound UDP socket (passed in: never bound or connected here)."""
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: _Udp(binding, gate), sock=sock)
    return DnsService([transport], set())


async def serve_tcp(sock: socket.socket, binding: Binding, gate: DnsGate) -> DnsService:
    """DNS over TCP on a listening socket: 2-byte length framing, several queries per connection, bounded."""
    conns: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(conns) >= TCP_MAX_CONNS:
            writer.transport.abort()
            if binding.refusals is not None:
                binding.refusals.refuse("connections", "dns", f"more than {TCP_MAX_CONNS} DNS-over-TCP connections")
            return
        conns.add(writer)
        try:
            await _tcp_session(reader, writer, binding, gate)
        except Exception:  # contained to this connection
            logger.exception("dns: unexpected error on a TCP connection")
        finally:
            conns.discard(writer)
            writer.transport.abort()

    # backlog: asyncio re-runs listen(); never shrink the queue the launcher sized for a cold start
    server = await asyncio.start_server(handle, sock=sock, limit=2**16 + 2, backlog=BACKLOG)
    return DnsService([server], conns)


async def _tcp_session(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, binding: Binding, gate: DnsGate
) -> None:
    peer = writer.get_extra_info("peername")
    for _ in range(TCP_MAX_QUERIES):
        try:
            (n,) = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), TCP_IDLE))
            wire = await asyncio.wait_for(reader.readexactly(n), TCP_IDLE)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return
        reply = await gate.answer(binding, wire, peer, tcp=True)
        if reply is None:
            return
        writer.write(struct.pack("!H", len(reply)) + reply)
        await asyncio.wait_for(writer.drain(), TCP_IDLE)
