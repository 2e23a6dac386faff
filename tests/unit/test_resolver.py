"""netguard.decision.resolver: the daemon's one resolver (single flight, resends, deadline) and
netguard.decision.sysdns (/etc/hosts first, then resolv.conf's nameservers).

Most tests drive it through a fake transport on a virtual clock (a 15-s deadline takes no time); the
last ones use real sockets against tests.support.dnsfake, and the daemon's own Decider and DnsGate.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from netguard import dnscache, rules
from netguard.audit import AuditLog, read_records
from netguard.decision import decide, resolver, sysdns
from netguard.decision import dns as dnsgate
from netguard.decision.binding import Binding
from netguard.decision.resolver import Io, LookupFailed, Resolver
from netguard.decision.sysdns import SystemDns
from netguard.policy import parse_network

from ..support.dnsfake import FakeDns, soa, world_answer

Server = tuple[str, int]
NS1, NS2 = ("192.0.2.53", 53), ("192.0.2.54", 53)
A, AAAA = dns.rdatatype.A, dns.rdatatype.AAAA
#: (seconds after this copy was sent, the reply, who it seems to come from: None = the server asked)
Plan = tuple[float, dns.message.Message | bytes, Server | None]
#: What the virtual network answers to one copy (the query, the copy's number, where it went): a plan or a few.
Answerer = Callable[[dns.message.Message, int, Server], Plan | list[Plan] | None]


def ok(q: dns.message.Message, *ips: str, ttl: int = 60) -> dns.message.Message:
    r = dns.message.make_response(q)
    qname, rdtype = q.question[0].name, q.question[0].rdtype
    if ips:
        r.answer.append(dns.rrset.from_text(qname, ttl, "IN", dns.rdatatype.to_text(rdtype), *ips))
    else:
        r.authority.append(soa())
    return r


def rcode(q: dns.message.Message, code: dns.rcode.Rcode) -> dns.message.Message:
    r = dns.message.make_response(q)
    r.set_rcode(code)
    if code == dns.rcode.NXDOMAIN:
        r.authority.append(soa())
    return r


@dataclass
class Sent:
    at: float
    server: Server
    query: dns.message.Message


@dataclass
class Net:
    """A virtual network and clock: each copy a flight sends is answered as `answer` plans, on virtual time."""

    answer: Answerer
    now: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    opened: int = 0
    tcp_asked: list[tuple[Server, float]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def open_udp(self, servers: dnscache.Servers) -> FakeUdp:
        self.opened += 1
        return FakeUdp(self)

    async def tcp(self, q: dns.message.Message, server: Server, timeout: float) -> dns.message.Message:
        self.tcp_asked.append((server, timeout))
        return ok(q, "192.0.2.99")

    def resolver(self, **kw: object) -> Resolver:
        return Resolver(io=Io(self.open_udp, self.tcp, self.clock), **kw)  # type: ignore[arg-type]


@dataclass
class FakeUdp:
    net: Net
    due: list[tuple[float, bytes, Server]] = field(default_factory=list)
    closed: bool = False

    def send(self, wire: bytes, server: Server) -> None:
        q = dns.message.from_wire(wire)
        plans = self.net.answer(q, len(self.net.sent), server)
        self.net.sent.append(Sent(self.net.now, server, q))
        for delay, msg, sender in [plans] if isinstance(plans, tuple) else plans or []:
            wire = msg if isinstance(msg, bytes) else msg.to_wire()
            self.due.append((self.net.now + delay, wire, sender or server))

    async def receive(self, timeout: float) -> tuple[bytes, Server] | None:
        await asyncio.sleep(0)  # let other askers in, as a real wait would
        end = self.net.now + timeout
        ready = sorted(d for d in self.due if d[0] <= end)
        if not ready:
            self.net.now = end
            return None
        self.due.remove(ready[0])
        self.net.now = max(self.net.now, ready[0][0])
        return ready[0][1], ready[0][2]

    def close(self) -> None:
        self.closed = True


# ---- resends and the deadline ------------------------------------------------------------------------


def test_a_silent_resolver_gets_resends_on_the_schedule_then_a_timeout_at_the_deadline(tmp_path: Path) -> None:
    (tmp_path / "resolv.conf").write_text("nameserver 192.0.2.53\nnameserver 192.0.2.54\n")
    net = Net(lambda q, n, s: None)
    r = net.resolver(system=SystemDns(tmp_path / "resolv.conf", tmp_path / "hosts"))
    res = asyncio.run(r.query("a.test", A))  # no upstream: the system's nameservers
    assert [s.at for s in net.sent] == [0.0, 1.0, 3.0, 7.0]
    assert [s.server for s in net.sent] == [NS1, NS2, NS1, NS2]  # rotating over the nameservers
    assert len({s.query.id for s in net.sent}) == 1  # one query, resent: any copy's answer is taken
    assert net.now == dnscache.DEADLINE
    assert (res.outcome, res.why, res.rcode) == (
        "timeout",
        "the resolver did not answer within 15 s",
        dns.rcode.SERVFAIL,
    )


def test_an_answer_after_5_3_s_to_the_first_copy_is_taken() -> None:
    net = Net(lambda q, n, s: (5.3, ok(q, "192.0.2.1"), None) if n == 0 else None)
    res = asyncio.run(net.resolver().query("slow.test", A, upstream=NS1))
    assert res.outcome == "answer" and net.now == pytest.approx(5.3)
    assert [s.at for s in net.sent] == [0.0, 1.0, 3.0]  # resent meanwhile, still listening for the first


def test_replies_from_elsewhere_or_to_another_query_are_ignored() -> None:
    def answer(q: dns.message.Message, n: int, s: Server) -> list[Plan]:
        wrong_id = ok(q, "6.6.6.6")
        wrong_id.id ^= 1
        wrong_name = ok(dns.message.make_query("evil.test", "A"), "6.6.6.7")
        wrong_name.id = q.id
        return (
            [
                (0.05, dns.message.make_response(q).to_wire()[:7], None),  # unparsable
                (0.1, wrong_id, None),
                (0.2, wrong_name, None),
                (0.3, ok(q, "6.6.6.8"), ("203.0.113.9", 53)),  # the right id and question, from an address never asked
                (0.4, ok(q, "192.0.2.1"), None),
            ]
            if n == 0
            else []
        )

    net = Net(answer)
    res = asyncio.run(net.resolver().query("a.test", A, upstream=NS1))
    k = dnscache.key("a.test", A, dns.rdataclass.IN, (NS1,))
    assert dnscache.addresses(res, k) == ["192.0.2.1"] and net.now == pytest.approx(0.4)


def test_a_failing_nameserver_hands_the_query_to_the_next_at_once(tmp_path: Path) -> None:
    (tmp_path / "resolv.conf").write_text("nameserver 192.0.2.53\nnameserver 192.0.2.54\n")

    def answer(q: dns.message.Message, n: int, s: Server) -> Plan:
        broken = s == NS1 or q.question[0].name.labels[0] == b"both-fail"
        return (0.1, rcode(q, dns.rcode.SERVFAIL) if broken else ok(q, "192.0.2.1"), None)

    net = Net(answer)
    r = net.resolver(system=SystemDns(tmp_path / "resolv.conf", tmp_path / "hosts"))
    good = asyncio.run(r.query("a.test", A))
    assert good.outcome == "answer" and [(s.at, s.server) for s in net.sent] == [(0.0, NS1), (pytest.approx(0.1), NS2)]
    net.sent.clear()
    bad = asyncio.run(r.query("both-fail.test", A))
    assert bad.why == "the resolver failed (SERVFAIL)" and [s.server for s in net.sent] == [NS1, NS2]
    assert net.now == pytest.approx(0.2 + 0.2)  # each query: two servers asked once, no waiting for a deadline


def test_a_truncated_answer_is_asked_again_over_tcp_within_the_deadline() -> None:
    def answer(q: dns.message.Message, n: int, s: Server) -> Plan:
        r = ok(q)
        r.flags |= dns.flags.TC
        return (0.5, r, None)

    net = Net(answer)
    res = asyncio.run(net.resolver().query("big.test", A, upstream=NS1))
    ((server, left),) = net.tcp_asked
    assert server == NS1 and left == pytest.approx(dnscache.DEADLINE - 0.5)
    assert res.outcome == "answer" and [rd.address for rd in res.answer[0]] == ["192.0.2.99"]


# ---- single flight and the cache ---------------------------------------------------------------------


def test_concurrent_askers_share_one_flight_and_later_ones_the_cache() -> None:
    net = Net(lambda q, n, s: (0.2, ok(q, "192.0.2.1"), None))
    r = net.resolver()

    async def main() -> list[dnscache.Result]:
        first = await asyncio.gather(*(r.query("Many.Test", A, upstream=NS1) for _ in range(40)))
        net.now += 30.0  # half the TTL later: from the cache, aged
        return [*first, await r.query("many.test", A, upstream=NS1)]

    results = asyncio.run(main())
    assert len(net.sent) == 1 and net.opened == 1 and r.sent == 1
    assert all(x.outcome == "answer" for x in results)
    assert results[0].answer[0].ttl == 60 and results[-1].answer[0].ttl == 30
    assert net.sent[0].query.question[0].name.labels == (b"many", b"test", b"")  # lower-cased, ours


def test_another_upstream_or_type_is_another_flight() -> None:
    def answer(q: dns.message.Message, n: int, s: Server) -> Plan:
        if q.question[0].rdtype == AAAA:
            return (0.0, ok(q, "2001:db8::1"), None)
        return (0.0, ok(q, "192.0.2.1" if s == NS1 else "198.51.100.1"), None)

    net = Net(answer)
    r = net.resolver()

    async def main() -> list[list[str]]:
        out = []
        for up in (NS1, NS2, NS1):
            res = await r.query("a.test", A, upstream=up)
            out.append(dnscache.addresses(res, dnscache.key("a.test", A, dns.rdataclass.IN, (up,))))
        await r.query("a.test", AAAA, upstream=NS1)
        return out

    assert asyncio.run(main()) == [["192.0.2.1"], ["198.51.100.1"], ["192.0.2.1"]]
    assert [(s.server, s.query.question[0].rdtype) for s in net.sent] == [(NS1, A), (NS2, A), (NS1, AAAA)]


def test_failures_are_kept_a_second_and_timeouts_not_at_all() -> None:
    net = Net(
        lambda q, n, s: (0.0, rcode(q, dns.rcode.SERVFAIL), None) if q.question[0].name.labels[0] == b"sf" else None
    )
    r = net.resolver(deadline=2.0)

    async def main() -> None:
        for _ in range(3):
            assert (await r.query("sf.test", A, upstream=NS1)).why == "the resolver failed (SERVFAIL)"
        assert len(net.sent) == 1
        net.now += dnscache.FAILURE_TTL
        await r.query("sf.test", A, upstream=NS1)
        assert len(net.sent) == 2
        for _ in range(2):
            assert (await r.query("quiet.test", A, upstream=NS1)).outcome == "timeout"
        assert r.sent == 4  # each timeout was a flight of its own: nothing kept

    asyncio.run(main())


def test_an_asker_may_wait_less_and_the_flight_still_fills_the_cache() -> None:
    answered = asyncio.Event()

    class Slow(FakeUdp):
        async def receive(self, timeout: float) -> tuple[bytes, Server] | None:
            await answered.wait()
            return await super().receive(timeout)

    net = Net(lambda q, n, s: (0.0, ok(q, "192.0.2.1"), None))

    async def open_udp(servers: dnscache.Servers) -> Slow:
        return Slow(net)

    r = Resolver(io=Io(open_udp, net.tcp, net.clock))

    async def main() -> tuple[dnscache.Result, dnscache.Result]:
        impatient = await r.query("a.test", A, upstream=NS1, within=0.05)
        answered.set()
        await asyncio.sleep(0.05)
        return impatient, await r.query("a.test", A, upstream=NS1)

    impatient, later = asyncio.run(main())
    assert impatient.why == "the resolver did not answer within 0.05 s"
    assert later.outcome == "answer" and len(net.sent) == 1


def test_flights_are_bounded() -> None:
    never = asyncio.Event()

    class Stuck(FakeUdp):
        async def receive(self, timeout: float) -> tuple[bytes, Server] | None:
            await never.wait()
            return None

    net = Net(lambda q, n, s: None)

    async def open_udp(servers: dnscache.Servers) -> Stuck:
        return Stuck(net)

    r = Resolver(io=Io(open_udp, net.tcp, net.clock), max_flights=2)

    async def main() -> dnscache.Result:
        waiting = [asyncio.ensure_future(r.query(name, A, upstream=NS1)) for name in ("a.test", "b.test")]
        await asyncio.sleep(0.01)
        try:
            return await r.query("c.test", A, upstream=NS1)
        finally:
            for t in waiting:
                t.cancel()

    assert asyncio.run(main()).why == "the resolver failed (2 lookups already in flight)"


# ---- a connection's addresses -------------------------------------------------------------------------


def by_name(table: dict[str, Callable[[dns.message.Message], Plan | None]]) -> Answerer:
    return lambda q, n, s: table[q.question[0].name.to_text(True)](q)


def test_addresses_are_both_families_ipv4_first_and_failures_say_what_failed() -> None:
    def answer(q: dns.message.Message, n: int, s: Server) -> Plan | None:
        name, rdtype = q.question[0].name.labels[0], q.question[0].rdtype
        if name == b"both":
            return (0.0, ok(q, "2001:db8::1") if rdtype == AAAA else ok(q, "192.0.2.1", "192.0.2.2"), None)
        if name == b"nx":
            return (0.0, rcode(q, dns.rcode.NXDOMAIN), None)
        if name == b"empty":
            return (0.0, ok(q), None)
        if name == b"sf":
            return (0.0, rcode(q, dns.rcode.SERVFAIL), None)
        return None  # silent

    r = Net(answer).resolver()

    async def main() -> list[object]:
        out: list[object] = [await r.addresses("both.test", NS1)]
        for name in ("nx.test", "empty.test", "sf.test", "silent.test", "x" * 64 + ".test"):
            try:
                await r.addresses(name, NS1)
            except LookupFailed as e:
                out.append((e.why, e.trouble))
        return out

    both, *failed = asyncio.run(main())
    assert isinstance(both, list) and both[-1] == ipaddress.ip_address("2001:db8::1")  # IPv4 first
    assert set(both[:2]) == {ipaddress.ip_address("192.0.2.1"), ipaddress.ip_address("192.0.2.2")}
    assert failed == [
        ("no such name (NXDOMAIN)", False),
        ("no address (NODATA)", False),
        ("the resolver failed (SERVFAIL)", True),
        ("the resolver did not answer within 15 s", True),
        ("not a name DNS can carry (LabelTooLong)", False),
    ]


def test_a_resolver_that_drops_aaaa_costs_a_connection_only_a_moment() -> None:
    async def main() -> tuple[list[object], float]:
        net = FakeDns(lambda q, proto: ok(q, "192.0.2.1") if q.question[0].rdtype == A else None)
        try:
            r = Resolver(deadline=3.0)
            t0 = asyncio.get_running_loop().time()
            found: list[object] = list(await r.addresses("a.test", ("127.0.0.1", net.port)))
            return found, asyncio.get_running_loop().time() - t0
        finally:
            net.close()

    found, took = asyncio.run(main())
    assert found == [ipaddress.ip_address("192.0.2.1")]
    assert resolver.OTHER_FAMILY_WAIT <= took < 1.5


# ---- the system's resolver: /etc/hosts first, resolv.conf's nameservers ---------------------------------


def test_hosts_files_are_read_like_glibc_does() -> None:
    got = sysdns.parse_hosts(
        "127.0.0.1 localhost\n# a comment\n192.0.2.5  Build.Example  build   # trailing\n"
        "fe80::1%eth0 link.test\n::1 localhost ip6-localhost\nnot-an-ip bad.test\n192.0.2.5 build\n"
    )
    ip = ipaddress.ip_address
    assert got["localhost"] == (ip("127.0.0.1"), ip("::1"))
    assert got["build.example"] == got["build"] == (ip("192.0.2.5"),)
    assert got["link.test"] == (ip("fe80::1"),) and "bad.test" not in got


def test_system_names_come_from_hosts_first_then_resolv_conf_which_are_reread(tmp_path: Path) -> None:
    resolv, hosts = tmp_path / "resolv.conf", tmp_path / "hosts"
    resolv.write_text("nameserver 192.0.2.53\nnameserver 192.0.2.54\noptions timeout:2 attempts:1\n")
    hosts.write_text("192.0.2.80 pinned.test\n")
    now = [0.0]
    system = SystemDns(resolv, hosts, clock=lambda: now[0])
    net = Net(lambda q, n, s: (0.0, ok(q, "192.0.2.1"), None))
    r = net.resolver(system=system)

    async def main() -> list[object]:
        out: list[object] = [await r.addresses("Pinned.Test", None)]
        out.append(await r.addresses("dns.test", None))
        resolv.write_text("nameserver 198.51.100.53\n")
        now[0] += sysdns.RECHECK
        out.append(await r.addresses("dns.test", None))  # a new upstream: not the old one's cache
        return out

    pinned, first, second = asyncio.run(main())
    assert pinned == [ipaddress.ip_address("192.0.2.80")]
    assert first == second == [ipaddress.ip_address("192.0.2.1")]
    assert [s.server for s in net.sent if s.query.question[0].rdtype == A] == [NS1, ("198.51.100.53", 53)]
    assert all(s.query.question[0].name.to_text(True) == "dns.test" for s in net.sent)  # pinned.test never left


def test_a_resolv_conf_without_nameservers_means_the_local_one(tmp_path: Path) -> None:
    (tmp_path / "resolv.conf").write_text("search example.org\n")
    assert sysdns.read_servers(tmp_path / "resolv.conf") == sysdns.FALLBACK == (("127.0.0.1", 53),)
    assert sysdns.read_servers(tmp_path / "missing") == sysdns.FALLBACK


# ---- real sockets: a late upstream, and the daemon's two paths sharing one resolver --------------------------


@pytest.fixture
def slow() -> Iterator[FakeDns]:
    srv = FakeDns(world_answer("192.0.2.1"), delay=1.3)
    try:
        yield srv
    finally:
        srv.close()


def test_over_real_sockets_a_late_answer_to_the_first_copy_is_taken(slow: FakeDns) -> None:
    async def main() -> dnscache.Result:
        return await Resolver().query("late.test", A, upstream=("127.0.0.1", slow.port))

    res = asyncio.run(main())
    assert res.outcome == "answer" and [rd.address for rd in res.answer[0]] == ["192.0.2.1"]
    assert slow.count("late.test", "A") == 2  # sent at 0 and 1 s; the first copy's answer came at 1.3 s


def binding(tmp_path: Path, upstream: FakeDns) -> Binding:
    pol = parse_network({"allow": ["many.test"], "resolver": f"127.0.0.1:{upstream.port}"}, "p.yaml")
    return Binding("t1", rules.compile_policy(pol), AuditLog(tmp_path / "audit.jsonl"))


def test_forty_connections_and_the_dns_server_cost_one_query_per_type(tmp_path: Path) -> None:
    upstream = FakeDns(world_answer("192.0.2.1"), delay=0.2)
    b = binding(tmp_path, upstream)

    async def main() -> tuple[list[decide.Decided], dns.message.Message]:
        decider, gate = decide.Decider(), dnsgate.DnsGate()  # both as the daemon makes them: one resolver
        decided = await asyncio.gather(
            *(decider.authorize(decide.Conn(b), "connect", "many.test", 443) for _ in range(40))
        )
        wire = await gate.answer(b, dns.message.make_query("MANY.test", "A").to_wire(), None)
        assert wire is not None
        return list(decided), dns.message.from_wire(wire)

    try:
        decided, reply = asyncio.run(main())
    finally:
        upstream.close()
    assert all(d.allowed and d.verdict.ip == "192.0.2.1" for d in decided)
    assert reply.rcode() == dns.rcode.NOERROR and [rd.address for rd in reply.answer[0]] == ["192.0.2.1"]
    assert (upstream.count("many.test", "A"), upstream.count("many.test", "AAAA")) == (1, 1)
    recs = [x for x in read_records(tmp_path / "audit.jsonl") if x["event"] == "decision"]
    assert len(recs) == 41 and all(x["action"] == "allow" for x in recs)


def test_a_connection_says_why_its_name_gave_no_address(tmp_path: Path) -> None:
    upstream = FakeDns(world_answer("192.0.2.1"))
    pol = parse_network({"allow": ["nx.test", "servfail.test"], "resolver": f"127.0.0.1:{upstream.port}"}, "p.yaml")
    b = Binding("t1", rules.compile_policy(pol), AuditLog(tmp_path / "audit.jsonl"))

    async def main() -> list[str]:
        d = decide.Decider()
        return [
            (await d.authorize(decide.Conn(b), "connect", h, 443)).verdict.decision.reason
            for h in ("nx.test", "servfail.test")
        ]

    try:
        reasons = asyncio.run(main())
    finally:
        upstream.close()
    assert reasons == [
        "cannot resolve nx.test: no such name (NXDOMAIN)",
        "cannot resolve servfail.test: the resolver failed (SERVFAIL)",
    ]
