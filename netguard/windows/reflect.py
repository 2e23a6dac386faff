"""The WinDivert "reflect" redirect as pure functions on packet fields, and its NAT table.

A sandbox flow `C:cp -> D:dp` leaves as a SYN; the loop rewrites it to `D:cp -> C:P` (addresses
swapped, destination port = the proxy's transparent port P) and re-injects it INBOUND, so the
proxy, listening on the host's own address, accepts a connection from `D:cp`: the original
destination address is the peer's address, and the table below gives back the original port.
The proxy's replies `C:P -> D:cp` are rewritten to `D:dp -> C:cp`, inbound, so the client sees
its own connection. (Rewriting to 127.0.0.1 instead does not work: the stack will not route an
off-host flow to loopback.) Threat answered: a program that ignores HTTP(S)_PROXY.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fields:
    """The fields the rewrite touches, as a packet carries them."""

    src_addr: str
    src_port: int
    dst_addr: str
    dst_port: int
    inbound: bool


@dataclass(frozen=True)
class Original:
    """What the proxy needs to know about a reflected connection it accepted."""

    client_addr: str
    client_port: int
    dst_addr: str
    dst_port: int


def to_proxy(f: Fields, proxy_port: int) -> Fields:
    """Outbound sandbox packet -> inbound packet to the proxy (the original port is in the table)."""
    return Fields(f.dst_addr, f.src_port, f.src_addr, proxy_port, True)


def from_proxy(f: Fields, original_port: int) -> Fields:
    """Outbound proxy reply -> inbound packet from the original destination."""
    return Fields(f.dst_addr, original_port, f.src_addr, f.dst_port, True)


class NatTable:
    """Reflected flows, keyed as the proxy sees its peer: (original dst address, client port)."""

    def __init__(self) -> None:
        self._flows: dict[tuple[str, int], Original] = {}

    def add(self, f: Fields) -> bool:
        """Record a sandbox SYN's flow. False on a collision (two flows that would look alike to
        the proxy): that SYN is dropped, never mis-routed into another flow's connection."""
        key = (f.dst_addr, f.src_port)
        new = Original(f.src_addr, f.src_port, f.dst_addr, f.dst_port)
        old = self._flows.setdefault(key, new)
        return old == new

    def for_peer(self, peer_addr: str, peer_port: int) -> Original | None:
        """The original destination of the connection the proxy accepted from (peer_addr, peer_port)."""
        return self._flows.get((peer_addr, peer_port))

    def has_client(self, f: Fields) -> bool:
        """An outbound packet that belongs to a reflected flow (the client's later segments)."""
        o = self._flows.get((f.dst_addr, f.src_port))
        return o is not None and o.client_addr == f.src_addr and o.dst_port == f.dst_port

    def forget(self, peer_addr: str, peer_port: int) -> None:
        self._flows.pop((peer_addr, peer_port), None)

    def __len__(self) -> int:
        return len(self._flows)
