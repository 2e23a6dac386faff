"""Inside-namespace plumbing: run by the sandbox's first process, in its fresh network namespace.

Order (each step assumes the previous one):
  1. IPv6 off (no address, not even ::1, ever exists: nothing to filter twice);
  2. `lo` up and ONE route, `default dev lo`: every destination is "reachable" and loops back
     into this namespace, where the nftables table (netguard/nft.py) steers it;
  3. the table;
  4. the listeners the daemon will accept on, created here so they belong to THIS namespace:
     explicit proxy 127.0.0.1:3128, transparent 127.0.0.1:3129, DNS udp+tcp 127.0.0.1:53.
The namespace never gets another link, address or route: there is nothing in the host's
namespaces to create, leak or clean up, and no address range to choose.

No pyroute2 here: two netlink/ioctl calls are written out (this runs on every `sandgate run`,
where importing pyroute2 alone costs ~80 ms).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from netguard.nft import Nft, Ports

LISTEN_HOST = "127.0.0.1"
BACKLOG = 4096  # connections made before the daemon accepts (cold start) wait here

# linux/if.h, linux/sockios.h, linux/rtnetlink.h
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
RTM_NEWROUTE, NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL = 24, 1, 4, 0x400, 0x200
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, RTA_OIF, RTA_PREFSRC = 254, 3, 0, 1, 4, 7
NLMSG_ERROR = 2


class SandboxNetError(OSError):
    """The namespace could not be configured (no CAP_NET_ADMIN in it, libnftables missing...)."""


@dataclass
class Listeners:
    """Sockets born inside the sandbox's namespace; handed (SCM_RIGHTS) to the daemon, then closed here."""

    regular: socket.socket
    transparent: socket.socket
    dns_udp: socket.socket
    dns_tcp: socket.socket

    def fds(self) -> list[int]:
        return [s.fileno() for s in (self.regular, self.transparent, self.dns_udp, self.dns_tcp)]

    def close(self) -> None:
        for s in (self.regular, self.transparent, self.dns_udp, self.dns_tcp):
            s.close()


def disable_ipv6() -> None:
    for conf in ("all", "default", "lo"):
        Path(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6").write_text("1\n")


def lo_up() -> int:
    """Bring `lo` up; returns its interface index."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    return socket.if_nametoindex("lo")


def default_route_via_lo(ifindex: int) -> None:
    """`ip route add default dev lo src 127.0.0.1`: every destination loops back into this namespace."""
    rtmsg = struct.pack(
        "BBBBBBBBI", socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0
    )
    oif = struct.pack("HHI", 8, RTA_OIF, ifindex)
    src = struct.pack("HH4s", 8, RTA_PREFSRC, socket.inet_aton(LISTEN_HOST))
    body = rtmsg + oif + src
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    msg = struct.pack("IHHII", 16 + len(body), RTM_NEWROUTE, flags, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.bind((0, 0))
        nl.send(msg)
        reply = nl.recv(4096)
    _len, mtype, _flags, _seq, _pid = struct.unpack("IHHII", reply[:16])
    if mtype == NLMSG_ERROR:
        (err,) = struct.unpack("i", reply[16:20])
        if err != 0:
            raise SandboxNetError(-err, f"cannot add the sandbox's loopback route: {os.strerror(-err)}")


def make_listeners(p: Ports) -> Listeners:
    def tcp(port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((LISTEN_HOST, port))
        s.listen(BACKLOG)
        s.setblocking(False)
        return s

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((LISTEN_HOST, p.dns))
    udp.setblocking(False)
    return Listeners(tcp(p.regular), tcp(p.transparent), udp, tcp(p.dns))


def configure(p: Ports) -> tuple[Listeners, Nft]:
    """Steps 1-4 of the module docstring, in this process's (new, empty) network namespace."""
    try:
        disable_ipv6()
        default_route_via_lo(lo_up())
        nft = Nft()
        nft.apply(p)
        return make_listeners(p), nft
    except SandboxNetError:
        raise
    except OSError as e:
        raise SandboxNetError(e.errno or 0, f"cannot configure the sandbox's network: {e.strerror or e}") from None
