"""The per-sandbox nftables table: built as text (pure), applied and removed with `nft -f`.

One table `inet sandgate_<id>` per run, matching only that run's host-side veth, so it
never touches rules it did not create and is removed with one `delete table`.
Packets from the sandbox meet, in this order:

  prerouting filter (-300)  IPv6, and anything that is not TCP or DNS: counted into the
                            `dropped` sets (-> `kind: packet` audit records) and dropped
  prerouting nat (dstnat)   DNS (udp/tcp 53) -> our DNS listener; explicit-proxy port on
                            the gateway -> untouched; every other TCP -> transparent
                            listener (all ports, all addresses: the proxy decides by name)
  input filter              only the three listeners on the gateway address are reachable:
                            sshd, databases on 0.0.0.0, proxy admin ports are not
  forward filter            nothing from or to the sandbox is ever forwarded

Fail closed: if the proxy dies the redirects point at closed ports (connection refused);
no rule ever accepts a forwarded packet, so there is no path around the proxy.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

TABLE_PREFIX = "sandgate_"


class NftError(Exception):
    """nft missing or refusing our table; the message says which and what to install."""


@dataclass(frozen=True)
class SandboxNet:
    """What the rules need to know about one sandbox's link."""

    id: str  # short hex id; table sandgate_<id>
    host_if: str  # host end of the veth
    gateway: str  # host end's IPv4 address (the proxy listens here)
    regular_port: int
    transparent_port: int
    dns_port: int

    @property
    def table(self) -> str:
        return f"{TABLE_PREFIX}{self.id}"


def build_ruleset(n: SandboxNet, *, open_firewall: bool = False) -> str:
    """The table as nft script text; pure so tests can read exactly what would be installed.

    `open_firewall` exists only for sandgate's own self-test (verify --weaken, never a user
    option): it removes the drops, the catch-all TCP redirect and the forward block, so the
    test can prove that its probes would notice a boundary with a hole in it.
    """
    iif = f'iifname "{n.host_if}"'
    oif = f'oifname "{n.host_if}"'
    text = _ruleset(n, iif, oif)
    if open_firewall:
        text = "\n".join(line for line in text.splitlines()
                         if not (line.strip().startswith(("iifname", "oifname")) and
                                 (line.strip().endswith("drop") or f"redirect to :{n.transparent_port}" in line)))
        text += "\n"
    return text


def _ruleset(n: SandboxNet, iif: str, oif: str) -> str:
    return f"""\
table inet {n.table} {{
  set dropped4 {{ type ipv4_addr . inet_proto . inet_service; flags dynamic; counter; size 65536; }}
  set dropped4x {{ type ipv4_addr . inet_proto; flags dynamic; counter; size 65536; }}
  set dropped6 {{ type ipv6_addr . inet_proto; flags dynamic; counter; size 65536; }}

  chain early {{
    type filter hook prerouting priority -300; policy accept;
    {iif} meta nfproto ipv6 update @dropped6 {{ ip6 daddr . meta l4proto }} drop
    {iif} meta l4proto tcp accept
    {iif} udp dport 53 accept
    {iif} meta l4proto udp update @dropped4 {{ ip daddr . meta l4proto . udp dport }} drop
    {iif} update @dropped4x {{ ip daddr . meta l4proto }} drop
  }}

  chain steer {{
    type nat hook prerouting priority dstnat; policy accept;
    {iif} meta l4proto {{ tcp, udp }} th dport 53 redirect to :{n.dns_port}
    {iif} ip daddr {n.gateway} tcp dport {n.regular_port} accept
    {iif} meta l4proto tcp redirect to :{n.transparent_port}
  }}

  chain guard {{
    type filter hook input priority filter - 10; policy accept;
    {iif} ip daddr {n.gateway} tcp dport {{ {n.regular_port}, {n.transparent_port}, {n.dns_port} }} accept
    {iif} ip daddr {n.gateway} udp dport {n.dns_port} accept
    {iif} meta l4proto tcp update @dropped4 {{ ip daddr . meta l4proto . tcp dport }} drop
    {iif} drop
  }}

  chain nofwd {{
    type filter hook forward priority filter - 10; policy accept;
    {iif} drop
    {oif} drop
  }}
}}
"""


def _nft(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NftError("nft not found; install nftables (apt-get install nftables)") from None


def apply(n: SandboxNet, *, open_firewall: bool = False) -> None:
    """Install the table atomically (one nft transaction): either all rules exist or none."""
    r = _nft(["-f", "-"], build_ruleset(n, open_firewall=open_firewall))
    if r.returncode != 0:
        raise NftError(f"nft refused the sandbox table: {r.stderr.strip()}")


def remove(table: str) -> bool:
    """Delete one of our tables; True if it existed. Never touches a table without our prefix."""
    if not table.startswith(TABLE_PREFIX):
        raise ValueError(f"refusing to delete non-sandgate table {table}")
    r = _nft(["delete", "table", "inet", table])
    return r.returncode == 0


def list_tables() -> list[str]:
    """Our tables in this network namespace (stale ones from killed runs included)."""
    r = _nft(["-j", "list", "tables", "inet"])
    if r.returncode != 0:
        raise NftError(f"nft list tables failed: {r.stderr.strip()}")
    out = []
    for item in json.loads(r.stdout).get("nftables", []):
        t = item.get("table")
        if t and t.get("family") == "inet" and t["name"].startswith(TABLE_PREFIX):
            out.append(t["name"])
    return out


def dropped(table: str) -> list[tuple[str, str, int | None, int]]:
    """(destination, protocol, port or None, packets) for every packet the table dropped so far."""
    # One nft call for all three sets (this runs every second while a sandbox lives).
    r = _nft(["-j", "list", "table", "inet", table])
    return parse_set_elements(r.stdout) if r.returncode == 0 else []


def parse_set_elements(text: str) -> list[tuple[str, str, int | None, int]]:
    """Elements of the `dropped*` sets in `nft -j list table|set` output (pure)."""
    out: list[tuple[str, str, int | None, int]] = []
    for item in json.loads(text).get("nftables", []):
        s = item.get("set")
        if not s:
            continue
        for elem in s.get("elem", []):
            packets = 0
            if isinstance(elem, dict) and "elem" in elem:
                packets = int(elem["elem"].get("counter", {}).get("packets", 0))
                elem = elem["elem"]["val"]
            parts = elem["concat"]
            dst, proto = str(parts[0]), str(parts[1])
            port = int(parts[2]) if len(parts) > 2 else None
            out.append((dst, proto, port, packets))
    return out
