"""The /etc files of a world's named network namespaces: its resolver, and hosts lookups that cannot escape."""

from __future__ import annotations

from pathlib import Path

from launcher.run.staleworlds import NETNS_ETC


def write_netns_etc(ns: str, nameserver: str) -> Path:
    """Files `ip netns exec` bind-mounts over /etc: our resolver, and hosts lookups that cannot escape.

    nsswitch.conf is pinned to `hosts: files dns` because nss-resolve/nscd would ask the HOST's
    resolver over a unix socket (not bound by the netns) and leak the query to the real network.
    """
    return write_etc(NETNS_ETC / ns, nameserver)


def write_etc(d: Path, nameserver: str) -> Path:
    """resolv.conf (and hosts, nsswitch.conf where the host has them) for a namespace, in `d`."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "resolv.conf").write_text(f"nameserver {nameserver}\noptions timeout:2 attempts:1\n")
    # ip netns exec can only bind over files that exist (else it warns on every command).
    if Path("/etc/hosts").exists():
        (d / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
    if Path("/etc/nsswitch.conf").exists():
        lines = Path("/etc/nsswitch.conf").read_text().splitlines()
        lines = [ln for ln in lines if not ln.strip().startswith("hosts:")] + ["hosts: files dns"]
        (d / "nsswitch.conf").write_text("\n".join(lines) + "\n")
    return d
