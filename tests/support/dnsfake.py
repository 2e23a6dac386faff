"""A fake upstream DNS resolver on 127.0.0.1 that records what it is asked, and small DNS clients.

Shared by the DNS server's tests (test_dns), the daemon's (test_daemon), the Gate's (test_gate) and the
resolver's (test_resolver). It can answer late (`delay`: each answer is sent that many seconds after its
query, without holding up the others) and counts what it was asked (`count`). Run as a module it serves
the e2e tests inside a World (`python -m tests.support.dnsfake --answer IP --log FILE [--slow S]`).
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import TextIO

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset

Handler = Callable[[dns.message.Message, str], dns.message.Message | None]
#: Seconds to wait before answering a query (0: at once).
Delay = Callable[[dns.message.Message], float]


def _same_port_pair() -> tuple[socket.socket, socket.socket]:
    """A UDP and a listening TCP socket on one free port of 127.0.0.1. The UDP port the kernel picks
    may be taken for TCP by another test (seen with two test processes): then another port is tried."""
    for _ in range(50):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            tcp.bind(("127.0.0.1", udp.getsockname()[1]))
        except OSError:
            udp.close()
            tcp.close()
            continue
        tcp.listen(8)
        return udp, tcp
    raise OSError("no port of 127.0.0.1 was free for both UDP and TCP in 50 tries")


class FakeDns:
    """An upstream resolver on 127.0.0.1 (UDP and TCP, same port) that records what it is asked."""

    def __init__(self, handler: Handler | None = None, delay: float | Delay = 0.0) -> None:
        self.handler = handler or standard_answer
        self.delay: Delay = delay if callable(delay) else _fixed(float(delay))
        self.queries: list[tuple[str, dns.message.Message]] = []
        self.on_query: Callable[[str, dns.message.Message], object] | None = None  # e.g. a log line per query
        self.udp, self.tcp = _same_port_pair()
        self.port = self.udp.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.udp, self.tcp], [], [], 0.1)
            for s in ready:
                if s is self.udp:
                    wire, addr = self.udp.recvfrom(65535)
                    self._later(wire, "udp", _sender(self.udp, addr))
                else:
                    conn, _ = self.tcp.accept()
                    threading.Thread(target=self._tcp, args=(conn,), daemon=True).start()

    def _tcp(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            try:
                (n,) = struct.unpack("!H", _recv_exact(conn, 2))
                wire = _recv_exact(conn, n)
            except (OSError, ConnectionError):
                return
            done = threading.Event()
            self._later(wire, "tcp", lambda reply: conn.sendall(struct.pack("!H", len(reply)) + reply), done)
            done.wait(60)

    def _later(
        self, wire: bytes, proto: str, send: Callable[[bytes], object], done: threading.Event | None = None
    ) -> None:
        """Answer `wire` through `send` after the delay; the loop goes on serving others meanwhile."""
        q = dns.message.from_wire(wire)
        self.queries.append((proto, q))
        if self.on_query is not None:
            self.on_query(proto, q)
        r = self.handler(q, proto)

        def answer() -> None:
            try:
                if r is not None and not self._stop.is_set():
                    send(r.to_wire())
            except OSError:
                pass  # closed meanwhile
            finally:
                if done is not None:
                    done.set()

        wait = self.delay(q)
        if wait <= 0:
            answer()
        else:
            timer = threading.Timer(wait, answer)
            timer.daemon = True
            timer.start()

    def names(self) -> list[str]:
        return [q.question[0].name.to_text() for _, q in self.queries]

    def count(self, name: str | None = None, rdtype: str | None = None) -> int:
        """Queries received (copies of a resent query each count), for `name` and `rdtype` if given."""
        return sum(
            1
            for _, q in list(self.queries)
            if (name is None or q.question[0].name == dns.name.from_text(name))
            and (rdtype is None or q.question[0].rdtype == dns.rdatatype.from_text(rdtype))
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.udp.close()
        self.tcp.close()


def _fixed(seconds: float) -> Delay:
    return lambda q: seconds


def _sender(udp: socket.socket, addr: tuple[str, int]) -> Callable[[bytes], object]:
    return lambda reply: udp.sendto(reply, addr)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("short read")
        data += chunk
    return data


def standard_answer(q: dns.message.Message, proto: str) -> dns.message.Message | None:
    """allowed.test-like names: an A record; chain.test: a CNAME chain plus records that do not belong;
    nx.test: NXDOMAIN; tc.test: truncated over UDP; big.test: more than 512 bytes of A records."""
    r = dns.message.make_response(q)
    qname = q.question[0].name
    first = qname.labels[0].lower()
    if first == b"nx":
        r.set_rcode(dns.rcode.NXDOMAIN)
    elif first == b"tc" and proto == "udp":
        r.flags |= dns.flags.TC
    elif first == b"chain":
        r.answer.append(dns.rrset.from_text(qname, 60, "IN", "CNAME", "cdn.elsewhere.test."))
        r.answer.append(dns.rrset.from_text("cdn.elsewhere.test.", 60, "IN", "CNAME", "edge.cdn.test."))
        r.answer.append(dns.rrset.from_text("edge.cdn.test.", 60, "IN", "A", "192.0.2.7"))
        r.answer.append(dns.rrset.from_text("unrelated.test.", 60, "IN", "A", "6.6.6.6"))
        r.authority.append(dns.rrset.from_text("test.", 60, "IN", "NS", "ns.attacker.test."))
        r.additional.append(dns.rrset.from_text("ns.attacker.test.", 60, "IN", "A", "6.6.6.7"))
    elif first == b"big":
        r.answer.append(dns.rrset.from_text(qname, 60, "IN", "A", *(f"192.0.2.{i}" for i in range(1, 60))))
    elif q.question[0].rdtype == dns.rdatatype.TXT:
        r.answer.append(dns.rrset.from_text(qname, 60, "IN", "TXT", '"data from upstream"'))
    else:
        r.answer.append(dns.rrset.from_text(qname, 60, "IN", "A", "192.0.2.1"))
    return r


def udp_ask(port: int, q: dns.message.Message) -> dns.message.Message:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(q.to_wire(), ("127.0.0.1", port))
        return dns.message.from_wire(s.recv(65535))


def tcp_ask(port: int, qs: list[dns.message.Message]) -> list[dns.message.Message]:
    """Several queries on one connection, answered in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        out = []
        for q in qs:
            w = q.to_wire()
            s.sendall(struct.pack("!H", len(w)) + w)
            (n,) = struct.unpack("!H", _recv_exact(s, 2))
            out.append(dns.message.from_wire(_recv_exact(s, n)))
        return out


def soa(zone: str = "test.", ttl: int = 60, minimum: int = 30) -> dns.rrset.RRset:
    """The SOA a negative answer carries (RFC 2308): caches keep it min(ttl, minimum) seconds."""
    return dns.rrset.from_text(zone, ttl, "IN", "SOA", f"ns.{zone} host.{zone} 1 3600 600 86400 {minimum}")


def world_answer(ip: str, ttl: int = 60) -> Handler:
    """Every name is `ip` (A, `ttl`); AAAA and other types NODATA with an SOA; first label `nx`: NXDOMAIN
    with an SOA; first label `servfail`: SERVFAIL. What a real recursive resolver says, in miniature."""

    def handler(q: dns.message.Message, proto: str) -> dns.message.Message:
        r = dns.message.make_response(q)
        question = q.question[0]
        first = question.name.labels[0].lower()
        if first == b"servfail":
            r.set_rcode(dns.rcode.SERVFAIL)
        elif first == b"nx":
            r.set_rcode(dns.rcode.NXDOMAIN)
            r.authority.append(soa())
        elif question.rdtype == dns.rdatatype.A:
            r.answer.append(dns.rrset.from_text(question.name, ttl, "IN", "A", ip))
        else:
            r.authority.append(soa())
        return r

    return handler


def main(argv: list[str] | None = None) -> None:
    """Serve `world_answer` on 127.0.0.1 (say `ready PORT`), log each query as a JSON line; names whose
    first label starts with `slow` are answered after --slow seconds. Runs until killed."""
    p = argparse.ArgumentParser(prog="python -m tests.support.dnsfake")
    p.add_argument("--answer", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--slow", type=float, default=0.0)
    args = p.parse_args(argv)
    with open(args.log, "a", buffering=1) as log:
        _serve(args.answer, args.slow, log)


def _serve(answer: str, slow: float, log: TextIO) -> None:
    def delay(q: dns.message.Message) -> float:
        return slow if q.question[0].name.labels[0].lower().startswith(b"slow") else 0.0

    srv = FakeDns(world_answer(answer), delay)
    srv.on_query = lambda proto, q: log.write(
        json.dumps({"proto": proto, "qname": q.question[0].name.to_text(True), "qtype": _qtype(q)}) + "\n"
    )
    print(f"ready {srv.port}", flush=True)
    threading.Event().wait()  # serves until the test (or its World) ends this process


def _qtype(q: dns.message.Message) -> str:
    return dns.rdatatype.to_text(q.question[0].rdtype)


if __name__ == "__main__":
    main()
