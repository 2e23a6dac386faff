"""`sandgate proxy`: the daemon's Gate and DNS server on listeners it opens itself, for containers and CI.

The same decision code as the per-user daemon (netguard.daemon.serve); only where the listeners
come from differs: TCP/UDP ports given on the command line instead of sockets passed in.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mitmproxy.proxy.mode_servers import ServerInstance

from netguard.daemon.fdlimit import Budget
from netguard.daemon.frontdoor import FrontDoor, Mode
from netguard.daemon.master import make_master
from netguard.decision import dns, limits
from netguard.decision.binding import Binding
from netguard.decision.tlsinspect import TlsInspect
from netguard.relay import handoff, relaypool

#: Windows: the SelectorEventLoop (loop_factory) waits with select(), whose sets CPython builds there with
#: FD_SETSIZE 512 (Modules/selectmodule.c); one socket more and select() raises "too many file descriptors in
#: select()", the loop stops and every connection of the run with it. Each proxied connection holds two sockets
#: (client, upstream): a sandbox's share of this budget keeps them, the listeners and DNS under the set's size,
#: and a connection past it is refused and recorded, never a crash (issue 28).
WINDOWS_BUDGET = 448  # connections; one sandbox may hold half (limits.share_cap): 224, i.e. 448 sockets


class ProxyError(Exception):
    """The proxy could not start (port in use, bad listener): reported as one line by the launcher."""


def loop_factory(platform: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop `serve` needs; None: asyncio's default. On Windows the default is the ProactorEventLoop,
    which has no add_reader (NotImplementedError: docs.python.org/3/library/asyncio-platforms.html#windows),
    and every front door waits for its listener and its clients' first bytes with add_reader (win-py P6).
    The SelectorEventLoop has it for sockets, and sockets are all this proxy waits on."""
    return asyncio.SelectorEventLoop if (platform or sys.platform) == "win32" else None


def budget(platform: str | None = None) -> Budget | None:
    """The connection budget of this proxy: none on Linux (its epoll loop has no set size), select()'s on Windows."""
    return Budget.of(WINDOWS_BUDGET) if (platform or sys.platform) == "win32" else None


@dataclass(frozen=True)
class Listeners:
    """The listen addresses of one sandbox for `sandgate proxy`; every one maps to the same Binding."""

    regular: tuple[str, int] | None = None
    transparent: tuple[str, int] | None = None
    dns: tuple[str, int] | None = None

    def modes(self) -> list[tuple[str, int]]:
        """(spec, port) of every listener, DNS included (it is served by netguard.decision.dns, not mitmproxy)."""
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
        _reuse_addr(tcp)
        tcp.bind(sockaddr)
        tcp.listen(128)
    except OSError as e:
        udp.close()
        tcp.close()
        raise ProxyError(f"cannot listen on dns@{_fmt(addr)}: {e.strerror or e} (address in use?)") from None
    return udp, tcp


def _reuse_addr(sock: socket.socket) -> None:
    """SO_REUSEADDR only where it means "rebind over TIME_WAIT" (POSIX). On Windows it lets a socket
    "forcibly bind to a port in use by another socket" (learn.microsoft.com/windows/win32/winsock/
    using-so-reuseaddr-and-so-exclusiveaddruse), listening or held: a second run's proxy would share
    127.0.0.1:3128 with the first run's proxy or held port instead of being refused (r3-day D1).
    CPython's asyncio leaves it off on Windows for the same reason."""
    if sys.platform != "win32":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def _tcp_socket(spec: str, addr: tuple[str, int]) -> socket.socket:
    """A bound TCP socket on `addr` for one front door (ProxyError if taken); it listens once served."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr[0], addr[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise ProxyError(f"cannot listen on {spec}: {e.strerror or e}") from None
    try:
        _reuse_addr(sock)
        sock.bind(sockaddr)
    except OSError as e:
        sock.close()
        raise ProxyError(f"cannot listen on {spec}: {e.strerror or e} (address in use or not available?)") from None
    return sock


@dataclass(frozen=True)
class _Door:
    """One TCP listener of `sandgate proxy`: its mitmproxy mode spec, the front door's mode, where it listens."""

    spec: str
    mode: Mode
    addr: tuple[str, int]


def _plan(
    sandboxes: list[tuple[Listeners, Binding]],
) -> tuple[dict[int, Binding], list[_Door], list[tuple[tuple[str, int], Binding]]]:
    """(slot -> binding, TCP listeners, DNS addresses): a slot is the listener's real port here."""
    bindings: dict[int, Binding] = {}
    doors: list[_Door] = []
    dns_addrs: list[tuple[tuple[str, int], Binding]] = []
    for listeners, binding in sandboxes:
        if listeners.dns is not None:
            dns_addrs.append((listeners.dns, binding))
        for mode, addr in (("regular", listeners.regular), ("transparent", listeners.transparent)):
            if addr is None:
                continue
            if addr[1] in bindings:
                raise ProxyError(f"port {addr[1]} is used by two listeners")
            bindings[addr[1]] = binding
            doors.append(_Door(f"{mode}@{_fmt(addr)}", "regular" if mode == "regular" else "transparent", addr))
    return bindings, doors, dns_addrs


async def serve(
    sandboxes: list[tuple[Listeners, Binding]],
    ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the proxy until `stop` is set. Raises ProxyError if a listener cannot be opened.

    The regular and transparent listeners are front doors (netguard.daemon.frontdoor) on sockets opened
    here; what they do not relay themselves goes to mitmproxy's handler for that mode spec."""
    bindings, planned, dns_addrs = _plan(sandboxes)
    master, proxyserver, gate = make_master(bindings, [])
    tls: TlsInspect = master.addons.get("tlsinspect")  # type: ignore[no-untyped-call]
    doors: list[FrontDoor] = []
    services: list[dns.DnsService] = []
    fds = budget()
    shares = {id(b): limits.Share() for b in bindings.values()}  # one per sandbox, whichever of its listeners
    if fds is not None:
        fds.sandboxes = len(shares)
    try:
        idle = float(master.options.tcp_timeout)
        for p in planned:
            sock = _tcp_socket(p.spec, p.addr)
            instance: ServerInstance[Any] = ServerInstance.make(p.spec, proxyserver)  # the fallback: mitmproxy
            b = bindings[p.addr[1]]
            if b.refusals is None:  # the deadline and head limits are said in this proxy's log too
                b.refusals = limits.Refusals(b.task, b.audit.write)
            door = FrontDoor(
                sock, p.addr[1], p.mode, bindings, gate.decider, instance.handle_stream, idle=idle, refusals=b.refusals,
                tls=tls.material, budget=fds, share=shares[id(b)],
            )  # fmt: skip
            doors.append(door)
            door.start(1024)
        gate_dns = dns.DnsGate()
        for addr, binding in dns_addrs:
            udp, tcp = _dns_sockets(addr)
            services.append(await dns.serve_udp(udp, binding, gate_dns))
            services.append(await dns.serve_tcp(tcp, binding, gate_dns))
        await master.running()
        if ready is not None:
            ready()
        await (stop or master.should_exit).wait()
    finally:
        for door in doors:
            door.close()
        for b in {id(b): b for b in bindings.values()}.values():
            if b.refusals is not None:
                b.refusals.flush()
        handoff.cut_slots(list(bindings), "proxy exit")  # spliced flows hold no transport mitmproxy could close
        relaypool.pool().stop()  # the workers this proxy started (a caller's loop may outlive it: tests)
        for service in services:
            service.close()
        master.should_exit.set()
        await master.done()
