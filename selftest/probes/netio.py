"""The network probes' tools: HTTP(S) with or without the proxy, raw TCP/UDP/unix exchanges with the
canaries, ICMP echo; each maps "the exchange did not happen" to Blocked. Stdlib only."""

from __future__ import annotations

import errno
import http.client
import os
import socket
import ssl
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

from selftest.probes.core import Blocked, Result, Unsupported, describe
from selftest.spec import VerifySpec

HTTP_TIMEOUT = 5.0  # every HTTP(S) exchange
TCP_TIMEOUT = 3.0  # raw TCP / unix connect and reply
ECHO_WAIT = 1.5  # UDP / QUIC / ICMP: how long to wait for an echo
BODY_LIMIT = 4096
USER_AGENT = "sandgate-verify"


def _ca_context(spec: VerifySpec) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=spec.ca)


def blind_context() -> ssl.SSLContext:
    """No verification: a bypass probe wants to see WHO answered, whatever certificate it shows."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def net_failure(exc: BaseException) -> BaseException:
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


def proxy_address(scheme: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(_env_proxy(scheme))
    if not u.hostname:
        raise Unsupported(f"cannot parse {scheme.upper()}_PROXY")
    return u.hostname, u.port or 80


def fetch(url: str, spec: VerifySpec, *, env_proxy: bool) -> tuple[int, bytes]:
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
            raise net_failure(reason) from e
        raise Blocked(f"URLError: {reason}") from e
    except OSError as e:
        raise net_failure(e) from e


def http_verdict(status: int, body: bytes) -> Result:
    """Permitted for a 2xx: the request went through and data came back."""
    return ("permitted" if 200 <= status < 300 else "blocked"), f"HTTP {status}: {body[:120]!r}"


def http_exchange(sock: socket.socket, target: str, host: str, *, close: bool = True) -> tuple[int, bytes]:
    """One hand-written GET over an open (TLS or plain) socket: (status, body). `close` False: the
    connection is kept alive for another request (the body is read by its length)."""
    sock.sendall(
        (
            f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        ).encode("ascii")
    )
    resp = http.client.HTTPResponse(sock, method="GET")
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
            with blind_context().wrap_socket(raw, server_hostname=sni) as tls:
                return http_exchange(tls, target, host)
    except OSError as e:
        raise net_failure(e) from e


def says(body: bytes, host: str) -> bool:
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
    total = sum(int(x) for x in struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def icmp_echo_request(ident: int, seq: int, payload: bytes) -> bytes:
    head = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    csum = icmp_checksum(head + payload)
    return struct.pack("!BBHHH", 8, 0, csum, ident, seq) + payload


def icmp_ping(target: str, payload: bytes, kind: int) -> Result:
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
