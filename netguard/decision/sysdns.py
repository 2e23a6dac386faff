"""What the system's resolver would use: /etc/hosts first, then the nameservers of /etc/resolv.conf.

The daemon asks those nameservers itself (netguard.decision.resolver) instead of calling getaddrinfo,
which hides the TTLs a cache needs and retries on glibc's 5-s timer. Names in /etc/hosts keep
working as they do for glibc's `hosts: files dns`: a name found there is answered from it and
never asked upstream. Both files are re-read when they change (checked at most every RECHECK s):
a laptop that moves between networks gets its new resolver without restarting the daemon.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import dns.exception
import dns.resolver

from netguard.dnscache import Servers

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
RESOLV_CONF = Path("/etc/resolv.conf")
HOSTS = Path("/etc/hosts")
RECHECK = 2.0  # seconds between looks at the files' mtimes
MAX_HOSTS_BYTES = 16 << 20  # a blocklist-sized hosts file is fine; a huge or endless one is cut
FALLBACK: Servers = (("127.0.0.1", 53),)  # glibc's default when resolv.conf names no nameserver
logger = logging.getLogger("sandgate.proxy")


def parse_hosts(text: str) -> dict[str, tuple[Address, ...]]:
    """hosts(5): `address name [aliases...]` lines, `#` comments; names case-insensitive. Pure."""
    out: dict[str, list[Address]] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            addr = ipaddress.ip_address(fields[0].split("%", 1)[0])
        except ValueError:
            continue
        for name in fields[1:]:
            found = out.setdefault(name.lower().rstrip("."), [])
            if addr not in found:
                found.append(addr)
    return {name: tuple(addrs) for name, addrs in out.items()}


def read_servers(path: Path) -> Servers:
    """The nameservers of a resolv.conf, as dnspython reads it; FALLBACK when it names none."""
    try:
        r = dns.resolver.Resolver(filename=str(path))
    except (OSError, dns.exception.DNSException) as e:  # NoResolverConfiguration: missing file, no nameserver
        logger.info("%s: %s; asking %s:%d", path, e or type(e).__name__, *FALLBACK[0])
        return FALLBACK
    servers = tuple((ns, int(r.port)) for ns in r.nameservers if isinstance(ns, str))
    return servers or FALLBACK


def read_hosts(path: Path) -> dict[str, tuple[Address, ...]]:
    try:
        with path.open("rb") as f:
            return parse_hosts(f.read(MAX_HOSTS_BYTES).decode("utf-8", "replace"))
    except OSError:
        return {}


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class SystemDns:
    """The system's nameservers and hosts file, re-read when either file changes."""

    def __init__(
        self, resolv: Path = RESOLV_CONF, hosts: Path = HOSTS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._resolv, self._hosts, self._clock = resolv, hosts, clock
        self._checked = -RECHECK
        self._stamps: tuple[object, object] = (object(), object())  # never equal to a real stamp: read at first use
        self._servers: Servers = FALLBACK
        self._names: dict[str, tuple[Address, ...]] = {}

    def servers(self) -> Servers:
        self._refresh()
        return self._servers

    def hosts(self, name: str) -> tuple[Address, ...]:
        """The addresses /etc/hosts gives `name` (empty: not there, ask DNS)."""
        self._refresh()
        return self._names.get(name.lower().rstrip("."), ())

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked < RECHECK:
            return
        self._checked = now
        resolv, hosts = _stamp(self._resolv), _stamp(self._hosts)
        if resolv != self._stamps[0]:
            self._servers = read_servers(self._resolv)
        if hosts != self._stamps[1]:
            self._names = read_hosts(self._hosts)
        self._stamps = (resolv, hosts)
