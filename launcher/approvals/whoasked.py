"""Which process inside a sandbox opened a given connection: (netns, local ip:port) -> pid and name.

When the sandbox connects somewhere that needs a human's approval, "some process wants
example.com:443" is not enough to decide on: the prompt should say WHICH program asked. The proxy
only sees the client socket's address (the sandbox-side source ip:port of a TCP connection, or of
a UDP datagram for DNS). This module maps that back to a process, from outside the sandbox (host
pid and network namespaces, as root):

1. the socket table of the SANDBOX's network namespace, /proc/<pid>/net/<proto> of any pid inside
   it (the host's /proc/net/tcp is the host's table, where the sandbox's sockets do not appear),
   gives the socket inode(s) whose local address is ip:port;
2. the processes in that same namespace (same /proc/<pid>/ns/net inode and device) are scanned
   for a file descriptor linking to `socket:[inode]`.

Parsing is pure (`parse_proc_net`); `find_asker` does the /proc reading and is best effort: the
answer is only shown to a human, so any failure (the process exited, the namespace is gone, a
permission error, a malformed line) yields None instead of an exception. Stdlib only.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CMDLINE_MAX", "PROTOS", "Asker", "find_asker", "parse_proc_net"]

# The socket tables find_asker reads. udplite/raw are not proxied, so never asked about.
PROTOS = ("tcp", "udp", "tcp6", "udp6")
# A prompt line, not a forensic record: long enough to tell `curl URL` from `pip install X`.
CMDLINE_MAX = 200

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Asker:
    """The process owning the client socket, for the approval prompt."""

    pid: int  # as seen from the host's pid namespace (the /proc we scan is the host's)
    name: str  # /proc/<pid>/comm (at most 15 characters, set by the kernel at exec or by prctl)
    cmdline: str  # first CMDLINE_MAX chars of /proc/<pid>/cmdline, NULs as spaces ("" for kernel threads)
    exe: str = ""  # /proc/<pid>/exe: the file the kernel runs, which the process cannot rename ("" unknown)

    def label(self) -> str:
        """What a human is shown: the executable, and the name only as the process's own claim.

        Threat: comm and argv are the process's to write (prctl(PR_SET_NAME, "pip") made a question
        read `asked_by: pip[...]`); the exe link is the kernel's."""
        if not self.exe:
            return f"{self.name}[{self.pid}] (name chosen by the process)"
        claimed = "" if self.name == os.path.basename(self.exe)[:15] else f' (calls itself "{self.name}")'
        return f"{self.exe}[{self.pid}]{claimed}"


# ---------------------------------------------------------------- pure parsing


def _normalize(addr: _IPAddress) -> _IPAddress:
    """IPv4-mapped IPv6 (::ffff:a.b.c.d) as plain IPv4: a dual-stack AF_INET6 socket talking IPv4
    shows up in tcp6/udp6 with the mapped form, while the proxy reports the plain IPv4 address."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _decode_addr(field: str, byteorder: Literal["little", "big"]) -> tuple[_IPAddress, int]:
    """One `ADDR:PORT` column of /proc/net/{tcp,udp}[6].

    The kernel prints the address as 32-bit words in HOST byte order (%08X of each __be32 word: one
    word for IPv4, four for IPv6), so on little-endian machines each word's bytes appear reversed;
    the port is printed as a plain number (%04X after ntohs).
    """
    hexaddr, sep, hexport = field.partition(":")
    if not sep or len(hexaddr) not in (8, 32) or len(hexport) != 4:
        raise ValueError(f"not an ADDR:PORT field: {field!r}")
    raw = bytearray()
    for i in range(0, len(hexaddr), 8):
        raw += int(hexaddr[i : i + 8], 16).to_bytes(4, byteorder)
    port = int(hexport, 16)
    addr: _IPAddress = ipaddress.IPv4Address(bytes(raw)) if len(raw) == 4 else ipaddress.IPv6Address(bytes(raw))
    return addr, port


def parse_proc_net(
    text: str,
    ip: str,
    port: int,
    *,
    wildcard: bool = False,
    byteorder: Literal["little", "big"] = sys.byteorder,
) -> list[int]:
    """Socket inodes in /proc/<pid>/net/tcp (or udp, tcp6, udp6) text whose LOCAL address is ip:port.

    Pure: the caller reads the file. The addresses are hex in host byte order as the kernel prints
    them (little-endian on x86/arm64; `byteorder` is only there for big-endian hosts and tests).
    IPv4 and IPv4-mapped IPv6 addresses compare equal, so "127.0.0.1" also matches a dual-stack
    socket's ::ffff:127.0.0.1 in tcp6. With `wildcard`, a socket bound to the unspecified address
    (0.0.0.0 / ::) on that port matches too: an unconnected UDP socket (a DNS client using sendto)
    has no specific local address, yet its datagrams leave from ip:port. Inode 0 (TIME_WAIT and
    other sockets no longer owned by any file) and malformed lines are skipped. Raises ValueError
    only for an invalid `ip`. Inodes are returned in table order, without duplicates.
    """
    want = _normalize(ipaddress.ip_address(ip))
    inodes: list[int] = []
    for line in text.splitlines():
        cols = line.split()
        # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...; the header's first column is "sl".
        if len(cols) < 10 or not cols[0].endswith(":"):
            continue
        try:
            addr, lport = _decode_addr(cols[1], byteorder)
            inode = int(cols[9])
        except ValueError:
            continue
        if lport != port or inode == 0 or inode in inodes:
            continue
        addr = _normalize(addr)
        if addr == want or (wildcard and addr.is_unspecified):
            inodes.append(inode)
    return inodes


# ---------------------------------------------------------------- /proc reading


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _netns_id(pid: int) -> tuple[int, int]:
    """Identity of pid's network namespace: (st_dev, st_ino) of the nsfs inode /proc/<pid>/ns/net."""
    st = os.stat(f"/proc/{pid}/ns/net")
    return st.st_dev, st.st_ino


def _pids() -> list[int]:
    """Host pids (thread-group leaders: /proc lists no other threads at the top level), ascending."""
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


def _owns_socket(pid: int, targets: set[str]) -> bool:
    """Whether one of pid's file descriptors is a socket in `targets` ('socket:[inode]' links)."""
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{fd}") in targets:
                return True
        except OSError:  # the fd was closed while we looked
            continue
    return False


def _asker(pid: int) -> Asker:
    name = _read_text(f"/proc/{pid}/comm").rstrip("\n")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = f.read(CMDLINE_MAX * 4)  # UTF-8: at most 4 bytes a character
    cmdline = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", errors="replace")[:CMDLINE_MAX]
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    return Asker(pid=pid, name=name, cmdline=cmdline, exe=exe)


def _socket_inodes(netns_pid: int, ip: str, port: int, tables: Iterable[str], *, wildcard: bool) -> list[int]:
    inodes: list[int] = []
    for table in tables:
        try:
            text = _read_text(f"/proc/{netns_pid}/net/{table}")
        except OSError:  # e.g. tcp6 without IPv6 in the kernel
            continue
        inodes += [i for i in parse_proc_net(text, ip, port, wildcard=wildcard) if i not in inodes]
    return inodes


def find_asker(netns_pid: int, ip: str, port: int, proto: str = "tcp") -> Asker | None:
    """The process owning the socket with local address ip:port in netns_pid's network namespace.

    Best effort, never raises: the answer only labels an approval prompt. Reads the socket table of
    THAT namespace (/proc/<netns_pid>/net/<proto>; for "tcp"/"udp" also tcp6/udp6, where a dual-stack
    socket talking IPv4 appears with an IPv4-mapped address), then scans /proc/*/fd/* of the
    processes whose /proc/<pid>/ns/net is the same namespace (same st_dev and st_ino) for a link
    'socket:[inode]'. Returns the first owner (lowest host pid; a socket inherited across fork has
    several), or None: no such socket, a dead or invalid netns_pid, an unknown proto, an invalid ip.
    For UDP, when no socket has exactly ip:port, one bound to the wildcard address on that port
    counts (a resolver's unconnected socket). Races (processes exiting while we scan, permission
    errors) are skipped silently. The socket can outlive the request: whoever holds it NOW is named.
    """
    try:
        if proto not in PROTOS or netns_pid <= 0 or not 0 <= port <= 0xFFFF:
            return None
        ipaddress.ip_address(ip)
        tables = (proto, proto + "6") if proto in ("tcp", "udp") else (proto,)
        netns = _netns_id(netns_pid)
        inodes = _socket_inodes(netns_pid, ip, port, tables, wildcard=False)
        if not inodes and proto.startswith("udp"):
            inodes = _socket_inodes(netns_pid, ip, port, tables, wildcard=True)
        # netns_pid could have exited and its pid been reused while we read: then the table we read
        # may belong to another namespace, and we would name a process that never asked.
        if not inodes or _netns_id(netns_pid) != netns:
            return None
        targets = {f"socket:[{inode}]" for inode in inodes}
        for pid in _pids():
            try:
                if _netns_id(pid) != netns or not _owns_socket(pid, targets):
                    continue
                return _asker(pid)
            except OSError:  # exited while we scanned, or not ours to read: the next one may be
                continue
        return None
    except Exception:
        return None
