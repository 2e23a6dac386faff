"""A fake upstream DNS resolver on 127.0.0.1 that records what it is asked, and small DNS clients.

Shared by the DNS server's tests (test_dns), the daemon's (test_daemon) and the Gate's (test_gate).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Callable

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

Handler = Callable[[dns.message.Message, str], dns.message.Message | None]


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

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler or standard_answer
        self.queries: list[tuple[str, dns.message.Message]] = []
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
                    reply = self._answer(wire, "udp")
                    if reply is not None:
                        self.udp.sendto(reply, addr)
                else:
                    conn, _ = self.tcp.accept()
                    with conn:
                        conn.settimeout(2)
                        (n,) = struct.unpack("!H", _recv_exact(conn, 2))
                        reply = self._answer(_recv_exact(conn, n), "tcp")
                        if reply is not None:
                            conn.sendall(struct.pack("!H", len(reply)) + reply)

    def _answer(self, wire: bytes, proto: str) -> bytes | None:
        q = dns.message.from_wire(wire)
        self.queries.append((proto, q))
        r = self.handler(q, proto)
        return None if r is None else r.to_wire()

    def names(self) -> list[str]:
        return [q.question[0].name.to_text() for _, q in self.queries]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.udp.close()
        self.tcp.close()


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
