"""Sandbox clients of the world: a namespace standing in for a sandbox, whose only link (and default
route) leads into the World. Root only (named namespaces and veths)."""

from __future__ import annotations

import ipaddress
import subprocess
from typing import Any, Protocol

from selftest.nsexec import NetnsRunner, sh


class WorldEnd(Protocol):
    """What a Client needs of the World it hangs off (world.py's World): its namespace, and its record of
    the processes to kill at teardown. A protocol, so this module needs no import of world.py (no circle)."""

    ns: str

    def _track(self, proc: subprocess.Popen[Any]) -> None: ...


LINK_NET = ipaddress.IPv4Network("198.18.0.0/15")


class Client(NetnsRunner):
    """A namespace standing in for a sandbox: its only link (and default route) leads into the World."""

    def __init__(self, world: WorldEnd, index: int, ns: str) -> None:
        self.world = world
        self.index = index
        self.ns = ns
        self.world_ip = f"198.18.{index}.1"
        self.ip = f"198.18.{index}.2"
        self.world_if = f"sgc{index}w"
        self.client_if = f"sgc{index}c"
        self.table = f"sandgate_test_{index}"
        assert ipaddress.IPv4Address(self.world_ip) in LINK_NET

    def __repr__(self) -> str:
        return f"<Client {self.ns} {self.ip} -> {self.world_ip}>"

    def _track(self, proc: subprocess.Popen[Any]) -> None:
        self.world._track(proc)

    def link(self) -> None:
        """The veth pair, made directly inside the two namespaces (never in the host's), and the default route."""
        sh(["ip", "netns", "exec", self.ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
        sh(
            [
                "ip",
                "link",
                "add",
                self.world_if,
                "netns",
                self.world.ns,
                "type",
                "veth",
                "peer",
                "name",
                self.client_if,
                "netns",
                self.ns,
            ]
        )
        sh(["ip", "-n", self.world.ns, "addr", "add", f"{self.world_ip}/30", "dev", self.world_if])
        sh(["ip", "-n", self.world.ns, "link", "set", self.world_if, "up"])
        sh(["ip", "-n", self.ns, "link", "set", "lo", "up"])
        sh(["ip", "-n", self.ns, "addr", "add", f"{self.ip}/30", "dev", self.client_if])
        sh(["ip", "-n", self.ns, "link", "set", self.client_if, "up"])
        sh(["ip", "-n", self.ns, "route", "add", "default", "via", self.world_ip])

    def redirect(self, tcp_port: int | None, dns_port: int | None) -> None:
        """Emulate sandgate's transparent interception, inside the WORLD netns.

        All TCP from this client (except :53) goes to `tcp_port`, DNS (udp+tcp :53) to `dns_port`, both on
        world_ip (nft `redirect` uses the incoming interface's primary address, so listeners must bind
        0.0.0.0 or world_ip, not 127.0.0.1). Anything else arriving from the client is dropped, so direct
        connections really fail. Replaces a previous redirect; None disables that part (it is then dropped).
        """
        wif, t = self.world_if, self.table
        nat: list[str] = []
        allow: list[str] = []
        if dns_port is not None:
            nat += [
                f'iifname "{wif}" udp dport 53 redirect to :{int(dns_port)}',
                f'iifname "{wif}" tcp dport 53 redirect to :{int(dns_port)}',
            ]
            allow += [
                f'iifname "{wif}" ip daddr {self.world_ip} udp dport {int(dns_port)} accept',
                f'iifname "{wif}" ip daddr {self.world_ip} tcp dport {int(dns_port)} accept',
            ]
        if tcp_port is not None:
            nat.append(f'iifname "{wif}" tcp dport != 53 redirect to :{int(tcp_port)}')
            allow.append(f'iifname "{wif}" ip daddr {self.world_ip} tcp dport {int(tcp_port)} accept')
        nl = "\n      "
        script = f"""
table ip {t}
delete table ip {t}
table inet {t}
delete table inet {t}
table ip {t} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
      {nl.join(nat)}
  }}
}}
table inet {t} {{
  chain input {{
    type filter hook input priority filter; policy accept;
      {nl.join(allow)}
      iifname "{wif}" drop
  }}
}}
"""
        sh(["ip", "netns", "exec", self.world.ns, "nft", "-f", "-"], input=script)
