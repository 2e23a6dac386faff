"""Where an allowed name may not lead: this host's own addresses (names are resolved by netguard.decision.resolver).

The effectful side of the SSRF veto (the decision itself is pure: rules.check_address). An allowed
name that resolves to one of the proxy host's own addresses reaches the host's services (sshd, a
database on 0.0.0.0, the daemon's neighbours), public addresses included, so every address the
kernel would deliver locally is vetoed: each interface address (RTM_GETADDR) and each `local` route
of the local table (AnyIP prefixes such as `ip route add local 192.0.2.0/24 dev lo`).

Read over netlink, no pyroute2 (its import alone costs ~80 ms) and no subprocess: a few hundred
microseconds per read, done when the proxy starts and again at most every TTL seconds, only when a
connection needs the table. An address the host gains is vetoed within TTL seconds.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator

from netguard import rules

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
TTL = 2.0  # seconds a read is trusted: how late an address the host just gained is vetoed
logger = logging.getLogger("sandgate.proxy")

# linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = 20, 22, 24, 26
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_TABLE = 1, 15
RTN_LOCAL, RT_TABLE_LOCAL = 2, 255
NETLINK_GET_STRICT_CHK = 12  # kernel >= 4.20: the route dump is filtered to the local table by the kernel
SOL_NETLINK = 270
_NLMSG = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTATTR = struct.Struct("=HH")


def read_local() -> list[Network]:
    """Every address this host's kernel delivers locally, in this network namespace (OSError if unreadable)."""
    if sys.platform == "win32":
        return read_local_windows()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as s:
        try:
            s.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        except OSError:
            pass  # old kernel: the whole routing table comes back and is filtered here
        s.settimeout(2.0)
        found: set[tuple[int, int, int]] = set()  # (family, address as int, prefix length)
        for family in (socket.AF_INET, socket.AF_INET6):
            size = 4 if family == socket.AF_INET else 16
            for attrs, _ in _dump(s, RTM_GETADDR, _IFADDRMSG.pack(family, 0, 0, 0, 0), _IFADDRMSG.size):
                raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)  # IFA_ADDRESS is the peer on point-to-point
                if raw is not None and len(raw) == size:
                    found.add((family, int.from_bytes(raw), size * 8))
            query = _RTMSG.pack(family, 0, 0, 0, RT_TABLE_LOCAL, 0, 0, RTN_LOCAL, 0)
            for attrs, head in _dump(s, RTM_GETROUTE, query, _RTMSG.size):
                _, dst_len, _, _, table, _, _, rtype, _ = _RTMSG.unpack_from(head)
                table = struct.unpack("=I", attrs[RTA_TABLE])[0] if RTA_TABLE in attrs else table
                raw = attrs.get(RTA_DST)
                if rtype == RTN_LOCAL and table == RT_TABLE_LOCAL and raw is not None and len(raw) == size:
                    value = int.from_bytes(raw) >> (size * 8 - dst_len) << (size * 8 - dst_len)
                    found.add((family, value, dst_len))
    return [
        ipaddress.IPv4Network((v, plen)) if family == socket.AF_INET else ipaddress.IPv6Network((v, plen))
        for family, v, plen in sorted(found)
    ]


def _dump(s: socket.socket, msg_type: int, body: bytes, head_size: int) -> Iterator[tuple[dict[int, bytes], bytes]]:
    """(attributes, fixed header) of every message a netlink dump request answers with."""
    seq = int(time.monotonic_ns() & 0x7FFFFFFF)
    s.send(_NLMSG.pack(_NLMSG.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
    while True:
        data = s.recv(1 << 16)
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, kind, _, got_seq, _ = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                raise OSError("netlink: malformed message")
            payload = data[offset + _NLMSG.size : offset + length]
            offset += (length + 3) & ~3
            if got_seq != seq:
                continue
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                errno = -struct.unpack_from("=i", payload)[0]
                if errno:
                    raise OSError(errno, f"netlink dump: {errno}")
                return
            if kind in (RTM_NEWADDR, RTM_NEWROUTE):
                yield _attrs(payload, head_size), payload[:head_size]


def _attrs(payload: bytes, head_size: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    offset = (head_size + 3) & ~3
    while offset + _RTATTR.size <= len(payload):
        length, kind = _RTATTR.unpack_from(payload, offset)
        if length < _RTATTR.size:
            break
        out.setdefault(kind, payload[offset + _RTATTR.size : offset + length])
        offset += (length + 3) & ~3
    return out


def read_local_windows() -> list[Network]:
    """Windows has no netlink (socket.AF_NETLINK: the proxy child could not even start, win-py P6). There
    getaddrinfo with an empty name returns "all registered addresses on the local computer" (getaddrinfo's
    Remarks, learn.microsoft.com/windows/win32/api/ws2tcpip/nf-ws2tcpip-getaddrinfo); each is vetoed as a host
    address. Local routes (AnyIP) have no counterpart read here. socket.gaierror is an OSError: refresh keeps
    the last table."""
    found: set[Network] = set()
    for _, _, _, _, sockaddr in socket.getaddrinfo("", None, 0, socket.SOCK_STREAM):
        try:
            found.add(ipaddress.ip_network(str(sockaddr[0]).split("%", 1)[0]))
        except ValueError:
            continue
    return sorted(found, key=lambda n: (n.version, int(n.network_address)))


class LocalAddrs:
    """This host's own addresses as a veto table (rules.own_table), re-read at most every `ttl` seconds.

    Read once when built (the proxy's start); afterwards only a connection that finds the table older
    than `ttl` pays for one read. If a read fails the previous table stays (logged): the static special
    ranges still hold, and loopback is among them.
    """

    def __init__(
        self,
        ttl: float = TTL,
        reader: Callable[[], list[Network]] = read_local,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl, self._reader, self._clock = ttl, reader, clock
        self._table = rules.own_table(())
        self._at = 0.0
        self.refresh()

    def table(self) -> rules.PrefixTable:
        if self._clock() - self._at >= self.ttl:
            self.refresh()
        return self._table

    def refresh(self) -> None:
        self._at = self._clock()  # also after a failure: never a read per connection
        try:
            self._table = rules.own_table(self._reader())
        except OSError as e:
            logger.warning("cannot read this host's addresses (keeping the last ones): %s", e)
