"""The DNS canary: answers from the World's records file and logs every part of every query (the
evidence for DNS smuggling), even malformed ones."""

from __future__ import annotations

import json
import socket
import socketserver
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import dns.rrset

from selftest.canary.log import RAW_LIMIT, JsonLog, fmt_peer

DNS_TTL = 1  # short so tests that change a record (rebinding) are not defeated by caches


def dns_details(query: dns.message.Message) -> dict[str, Any]:
    """Everything in a query that could carry data besides the first name: the evidence for smuggling."""
    return {
        "opcode": dns.opcode.to_text(query.opcode()),
        "qdcount": len(query.question),
        "questions": [q.name.to_text(omit_final_dot=True) for q in query.question],  # case as received
        "records": [rrset.to_text()[:RAW_LIMIT] for section in query.sections[1:] for rrset in section],
        "edns_options": [
            {"code": int(opt.otype), "data": opt.to_wire().decode("latin-1")[:RAW_LIMIT]} for opt in query.options
        ],
    }


class DNSAnswerer:
    """Answers from a JSON {name: ipv4 | [ipv4...]} file re-read per query, so World.add_host needs no reload signal."""

    def __init__(self, records_path: str, log: JsonLog) -> None:
        self.records_path = records_path
        self.log = log
        self.records: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        try:
            self.records = json.loads(Path(self.records_path).read_text())
        except (OSError, ValueError):
            pass  # World replaces the file atomically; keep the last good copy if something odd happens
        return self.records

    def answer(self, wire: bytes, proto: str, peer: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception as exc:  # malformed packets are evidence too
            self.log.write(
                {
                    "kind": "dns",
                    "proto": proto,
                    "qname": None,
                    "qtype": None,
                    "peer": peer,
                    "error": f"{type(exc).__name__}: {exc}",
                    "data": wire[:RAW_LIMIT].decode("latin-1"),
                }
            )
            return None
        if not query.question:
            self.log.write(
                {"kind": "dns", "proto": proto, "qname": None, "qtype": None, "peer": peer, **dns_details(query)}
            )
            resp = dns.message.make_response(query)
            resp.set_rcode(dns.rcode.FORMERR)
            return resp.to_wire()
        q = query.question[0]
        qname = q.name.to_text(omit_final_dot=True).lower()
        self.log.write(
            {
                "kind": "dns",
                "proto": proto,
                "qname": qname,
                "qtype": dns.rdatatype.to_text(q.rdtype),
                "peer": peer,
                **dns_details(query),
            }
        )
        resp = dns.message.make_response(query)
        resp.flags |= dns.flags.AA
        value = self.load().get(qname)
        if value is None:
            resp.set_rcode(dns.rcode.NXDOMAIN)
        elif q.rdtype == dns.rdatatype.A:
            ips = [value] if isinstance(value, str) else list(value)
            resp.answer.append(dns.rrset.from_text(q.name, DNS_TTL, "IN", "A", *ips))
        elif q.rdtype == dns.rdatatype.TXT:
            resp.answer.append(dns.rrset.from_text(q.name, DNS_TTL, "IN", "TXT", '"canary"'))
        # any other type for a known name (AAAA included): NOERROR with an empty answer
        return resp.to_wire()


def serve_dns(ip: str, port: int, answerer: DNSAnswerer) -> list[socketserver.BaseServer]:
    """UDP and TCP on the same port, each in its own thread."""

    class UDPHandler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            reply = answerer.answer(data, "udp", fmt_peer(self.client_address))
            if reply is not None:
                sock.sendto(reply, self.client_address)

    class TCPHandler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            conn.settimeout(10)
            peer = fmt_peer(self.client_address)
            try:
                while True:
                    head = _recv_exact(conn, 2)
                    if head is None:
                        return
                    msg = _recv_exact(conn, int.from_bytes(head, "big"))
                    if msg is None:
                        return
                    reply = answerer.answer(msg, "tcp", peer)
                    if reply is None:
                        return
                    conn.sendall(len(reply).to_bytes(2, "big") + reply)
            except OSError:
                return

    class UDPServer(socketserver.ThreadingUDPServer):
        daemon_threads = True
        allow_reuse_address = True

    class TCPServer(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    servers: list[socketserver.BaseServer] = [UDPServer((ip, port), UDPHandler), TCPServer((ip, port), TCPHandler)]
    return servers


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            return None
        buf += got
    return buf
