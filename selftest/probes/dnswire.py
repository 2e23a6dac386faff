"""DNS on the wire, by hand: queries, replies and hand-built messages for the DNS probes (stdlib only:
the sandbox's Python may have no dnspython)."""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from selftest.probes.core import Blocked, Result, Unsupported

DNS_TIMEOUT = 3.0
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
QTYPE_A, QTYPE_TXT = 1, 16
QTYPE_SOA, QTYPE_OPT, OPT_CODE, CLASS_IN = 6, 41, 65001, 1  # 65001: a local/experimental EDNS option
QTYPE_NULL, QTYPE_MX, RCODE_REFUSED = 10, 15, 5


def encode_name(name: str) -> bytes:
    """A domain name in wire format; ValueError for an empty or too long label or name."""
    out = b""
    for label in name.rstrip(".").split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) <= 63:
            raise ValueError(f"bad DNS label {label!r} ({len(raw)} bytes)")
        out += bytes([len(raw)]) + raw
    out += b"\0"
    if len(out) > 255:
        raise ValueError(f"DNS name too long ({len(out)} bytes)")
    return out


def build_query(name: str, qtype: int = QTYPE_A, qid: int | None = None) -> bytes:
    """A recursive query (RD set) for one name, class IN."""
    qid = random.randrange(0x10000) if qid is None else qid
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", qtype, 1)


@dataclass
class DnsRecord:
    name: str
    rtype: int
    ttl: int
    data: str  # dotted quad for A, the joined strings for TXT, hex otherwise


@dataclass
class DnsMessage:
    id: int
    flags: int
    questions: list[tuple[str, int]]
    answers: list[DnsRecord]

    @property
    def is_response(self) -> bool:
        return bool(self.flags & 0x8000)

    @property
    def rcode(self) -> int:
        return self.flags & 0xF

    @property
    def rcode_text(self) -> str:
        return RCODES.get(self.rcode, str(self.rcode))


def _read_name(data: bytes, off: int) -> tuple[str, int]:
    """Name at `off` (compression pointers followed); returns (name, offset after it in the original place)."""
    labels: list[str] = []
    end = None
    jumps = 0
    while True:
        if off >= len(data):
            raise ValueError("truncated DNS name")
        n = data[off]
        if n & 0xC0 == 0xC0:
            if off + 1 >= len(data):
                raise ValueError("truncated DNS pointer")
            if end is None:
                end = off + 2
            off = ((n & 0x3F) << 8) | data[off + 1]
            jumps += 1
            if jumps > 32:
                raise ValueError("DNS pointer loop")
            continue
        if n & 0xC0:
            raise ValueError(f"bad DNS label type {n:#x}")
        off += 1
        if n == 0:
            break
        if off + n > len(data):
            raise ValueError("truncated DNS label")
        labels.append(data[off : off + n].decode("ascii", "replace"))
        off += n
    return ".".join(labels), (end if end is not None else off)


def parse_message(data: bytes) -> DnsMessage:
    """Header, questions and answer records of a DNS message; ValueError if malformed."""
    if len(data) < 12:
        raise ValueError(f"DNS message too short ({len(data)} bytes)")
    qid, flags, qd, an, _ns, _ar = struct.unpack("!HHHHHH", data[:12])
    off = 12
    questions = []
    for _ in range(qd):
        name, off = _read_name(data, off)
        if off + 4 > len(data):
            raise ValueError("truncated DNS question")
        qtype, _qclass = struct.unpack("!HH", data[off : off + 4])
        off += 4
        questions.append((name, qtype))
    answers = []
    for _ in range(an):
        name, off = _read_name(data, off)
        if off + 10 > len(data):
            raise ValueError("truncated DNS record")
        rtype, _rclass, ttl, rdlen = struct.unpack("!HHIH", data[off : off + 10])
        off += 10
        rdata = data[off : off + rdlen]
        if len(rdata) != rdlen:
            raise ValueError("truncated DNS rdata")
        off += rdlen
        if rtype == QTYPE_A and rdlen == 4:
            text = socket.inet_ntoa(rdata)
        elif rtype == QTYPE_TXT:
            parts, i = [], 0
            while i < len(rdata):
                parts.append(rdata[i + 1 : i + 1 + rdata[i]].decode("utf-8", "replace"))
                i += 1 + rdata[i]
            text = "".join(parts)
        else:
            text = rdata.hex()
        answers.append(DnsRecord(name, rtype, ttl, text))
    return DnsMessage(qid, flags, questions, answers)


def dns_exchange(
    server: str, name: str, qtype: int = QTYPE_A, *, port: int = 53, tcp: bool = False, timeout: float = DNS_TIMEOUT
) -> DnsMessage:
    """Send one query straight to server:port and return the matching reply (TimeoutError if none)."""
    query = build_query(name, qtype)
    qid = struct.unpack("!H", query[:2])[0]
    if tcp:
        with socket.create_connection((server, port), timeout=timeout) as s:
            s.sendall(struct.pack("!H", len(query)) + query)
            size = struct.unpack("!H", _recv_exact(s, 2))[0]
            reply = parse_message(_recv_exact(s, size))
        if reply.id != qid:
            raise ValueError(f"DNS reply with id {reply.id}, expected {qid}")
        return reply
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.connect((server, port))
        s.send(query)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                reply = parse_message(s.recv(4096))
            except ValueError:
                continue  # garbage: keep waiting for our answer
            if reply.id == qid and reply.is_response:
                return reply
        raise TimeoutError(f"no DNS reply from {server}:{port} within {timeout:g} s")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise Blocked(f"connection closed after {len(buf)} of {n} bytes")
        buf += got
    return buf


def dns_verdict(reply: DnsMessage) -> Result:
    """Permitted only for NOERROR: the name was looked up and answered."""
    answers = ", ".join(f"{r.data}" for r in reply.answers) or "no answers"
    detail = f"rcode {reply.rcode_text}, {answers}"
    return ("permitted" if reply.rcode == 0 else "blocked"), detail


def system_resolver() -> str:
    """First nameserver of /etc/resolv.conf (the sandbox's own DNS listener)."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            return fields[1]
    raise Unsupported("no nameserver in /etc/resolv.conf")


def rr(name: str, rtype: int, rclass: int, ttl: int, rdata: bytes) -> bytes:
    owner = b"\0" if name == "." else encode_name(name)
    return owner + struct.pack("!HHIH", rtype, rclass, ttl, len(rdata)) + rdata


def txt(text: bytes) -> bytes:
    return bytes([len(text[:255])]) + text[:255]


def build_message(
    flags: int, questions: list[tuple[str, int]], ns: bytes = b"", ar: bytes = b"", counts: tuple[int, int] = (0, 0)
) -> bytes:
    """A hand-built message (id 0, set by send_message): questions, then ns (authority) and ar (additional) RRs."""
    head = struct.pack("!HHHHHH", 0, flags, len(questions), 0, *counts)
    return head + b"".join(encode_name(n) + struct.pack("!HH", t, CLASS_IN) for n, t in questions) + ns + ar


def send_message(server: str, wire: bytes) -> DnsMessage:
    """One UDP exchange with a fresh id; the reply to it (TimeoutError if none)."""
    qid = int.from_bytes(os.urandom(2), "big")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((server, 53))
        s.send(struct.pack("!H", qid) + wire[2:])
        deadline = time.monotonic() + DNS_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                reply = parse_message(s.recv(4096))
            except ValueError:
                continue
            if reply.id == qid and reply.is_response:
                return reply
    raise TimeoutError(f"no DNS reply from {server}:53 within {DNS_TIMEOUT:g} s")
