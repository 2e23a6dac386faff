"""The sandbox's network: a veth pair whose only peer is the proxy, via pyroute2 (netlink).

Host side (run in sandgate's namespace): create the pair, address the host end, move the
other end into the sandbox's fresh network namespace, remove leftovers.
Sandbox side (run inside the new namespace, before the command): IPv6 off, lo up, the
link addressed, one default route to the gateway. The sandbox namespace has no other
interface, so that route is the only way out, and it ends in our nftables table.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

DEFAULT_RANGE = "10.237.0.0/16"  # /30s are taken from here unless --net-range says otherwise
SANDBOX_IF = "eth0"


class NetnsError(Exception):
    """Could not build the sandbox link (no free subnet, netlink refused...)."""


@dataclass(frozen=True)
class Link:
    host_if: str
    sandbox_if: str  # name while still in the host namespace
    subnet: ipaddress.IPv4Network
    gateway: str
    address: str


def link_names(run_id: str) -> tuple[str, str]:
    """Interface names carry the run id so stale ones can be matched to their table (IFNAMSIZ 15)."""
    return f"sg{run_id}h", f"sg{run_id}s"


def pick_subnet(pool: ipaddress.IPv4Network, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /30 of `pool` that overlaps no route or address already on the host (pure)."""
    for candidate in pool.subnets(new_prefix=30):
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise NetnsError(f"no free /30 left in {pool}; choose another range with --net-range")


def _taken(ipr: IPRoute) -> list[ipaddress.IPv4Network]:
    nets = []
    for r in ipr.get_routes(family=2):
        dst = r.get("dst")
        if dst and r["dst_len"] > 0:
            nets.append(ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False))
    for a in ipr.get_addr(family=2):
        nets.append(ipaddress.ip_network(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}", strict=False))
    return nets


def create_link(run_id: str, pool: str = DEFAULT_RANGE) -> Link:
    """Create and address the host end; the peer stays down until it is moved into the sandbox.

    Callers hold a lock across pick+create so two concurrent runs do not pick the same /30.
    """
    host_if, sandbox_if = link_names(run_id)
    with IPRoute() as ipr:
        subnet = pick_subnet(ipaddress.ip_network(pool), _taken(ipr))
        gateway, address = (str(h) for h in list(subnet.hosts())[:2])
        try:
            ipr.link("add", ifname=host_if, kind="veth", peer=sandbox_if)
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.addr("add", index=idx, address=gateway, prefixlen=subnet.prefixlen)
            ipr.link("set", index=idx, state="up")
        except NetlinkError as e:
            remove_link(host_if)
            raise NetnsError(f"cannot create veth {host_if}: {e}") from None
    return Link(host_if, sandbox_if, subnet, gateway, address)


def move_into(link: Link, pid: int) -> None:
    """Hand the sandbox end to the network namespace of `pid` (the sandbox's first process)."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=link.sandbox_if)
        if not idx:
            raise NetnsError(f"veth {link.sandbox_if} vanished before it could be moved")
        ipr.link("set", index=idx[0], net_ns_pid=pid)


def remove_link(host_if: str) -> bool:
    """Delete a host-side veth (the peer goes with it); True if it existed."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=host_if)
        if not idx:
            return False
        try:
            ipr.link("del", index=idx[0])
        except NetlinkError:
            return False
    return True


def list_links(prefix: str = "sg") -> list[str]:
    with IPRoute() as ipr:
        return [str(link.get_attr("IFLA_IFNAME")) for link in ipr.get_links()
                if str(link.get_attr("IFLA_IFNAME")).startswith(prefix)]


def configure_inside(link: Link) -> None:
    """Run in the new namespace: IPv6 off first (no autoconf address ever exists), then IPv4 up."""
    for conf in ("all", "default"):
        Path(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6").write_text("1\n")
    with IPRoute() as ipr:
        lo = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=lo, state="up")
        idx = ipr.link_lookup(ifname=link.sandbox_if)[0]
        ipr.link("set", index=idx, ifname=SANDBOX_IF)
        ipr.addr("add", index=idx, address=link.address, prefixlen=link.subnet.prefixlen)
        ipr.link("set", index=idx, state="up")
        ipr.route("add", dst="0.0.0.0/0", gateway=link.gateway)
