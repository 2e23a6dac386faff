"""`sandgate proxy`: the daemon's Gate and DNS server on listeners it opens itself, for containers and CI.

The same decision code as the per-user daemon (netguard.proxy.serve); only where the listeners
come from differs: TCP/UDP ports given on the command line instead of sockets passed in.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

from netguard.proxy import dns
from netguard.proxy.binding import Binding
from netguard.proxy.master import make_master


class ProxyError(Exception):
    """The proxy could not start (port in use, bad listener): reported as one line by the launcher."""


@dataclass(frozen=True)
class Listeners:
    """The listen addresses of one sandbox for `sandgate proxy`; every one maps to the same Binding."""

    regular: tuple[str, int] | None = None
    transparent: tuple[str, int] | None = None
    dns: tuple[str, int] | None = None

    def modes(self) -> list[tuple[str, int]]:
        """(spec, port) of every listener, DNS included (it is served by netguard.proxy.dns, not mitmproxy)."""
        out = []
        for name in ("regular", "transparent", "dns"):
            addr = getattr(self, name)
            if addr is not None:
                out.append((f"{name}@{_fmt(addr)}", addr[1]))
        return out


def _fmt(addr: tuple[str, int]) -> str:
    host = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
    return f"{host}:{addr[1]}"


def _dns_sockets(addr: tuple[str, int]) -> tuple[socket.socket, socket.socket]:
    """A bound UDP socket and a listening TCP socket on `addr`, for the DNS server (ProxyError if taken)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr[0], addr[1], type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE
        )[0]
        udp = socket.socket(family, socket.SOCK_DGRAM)
        tcp = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise ProxyError(f"cannot listen on dns@{_fmt(addr)}: {e.strerror or e}") from None
    try:
        udp.bind(sockaddr)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(sockaddr)
        tcp.listen(128)
    except OSError as e:
        udp.close()
        tcp.close()
        raise ProxyError(f"cannot listen on dns@{_fmt(addr)}: {e.strerror or e} (address in use?)") from None
    return udp, tcp


def _plan(
    sandboxes: list[tuple[Listeners, Binding]],
) -> tuple[dict[int, Binding], list[str], list[tuple[tuple[str, int], Binding]]]:
    """(slot -> binding, mitmproxy mode specs, DNS addresses): a slot is the listener's real port here."""
    bindings: dict[int, Binding] = {}
    specs: list[str] = []
    dns_addrs: list[tuple[tuple[str, int], Binding]] = []
    for listeners, binding in sandboxes:
        if listeners.dns is not None:
            dns_addrs.append((listeners.dns, binding))
        for spec, port in listeners.modes():
            if spec.startswith("dns@"):
                continue
            if port in bindings:
                raise ProxyError(f"port {port} is used by two listeners")
            bindings[port] = binding
            specs.append(spec)
    return bindings, specs, dns_addrs


async def serve(
    sandboxes: list[tuple[Listeners, Binding]],
    ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the proxy until `stop` is set. Raises ProxyError if a listener cannot be opened."""
    bindings, specs, dns_addrs = _plan(sandboxes)
    master, proxyserver, _ = make_master(bindings, specs)
    if not await proxyserver.setup_servers():
        await master.done()
        raise ProxyError(f"cannot listen on {', '.join(specs)} (address in use or not available?)")
    services: list[dns.DnsService] = []
    try:
        gate = dns.DnsGate()
        for addr, binding in dns_addrs:
            udp, tcp = _dns_sockets(addr)
            services.append(await dns.serve_udp(udp, binding, gate))
            services.append(await dns.serve_tcp(tcp, binding, gate))
        await master.running()
        if ready is not None:
            ready()
        await (stop or master.should_exit).wait()
    finally:
        for service in services:
            service.close()
        master.should_exit.set()
        await proxyserver.servers.update([])
        await master.done()
