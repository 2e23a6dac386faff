"""The network probes: egress by every path a tool or an attacker takes (proxy variables, transparent,
raw TCP/UDP/ICMP, IPv6, unix sockets, CONNECT to an IP, SNI and Host header games, rebinding).

Every one carries its marker (selftest/markers.py) so verify can find it in the canaries' logs.
"""

from __future__ import annotations

import http.client
import socket

from selftest.probes.core import Blocked, Ctx, Result, Unsupported, attempt, combine, describe, probe
from selftest.probes.netio import (
    BODY_LIMIT,
    HTTP_TIMEOUT,
    TCP_TIMEOUT,
    USER_AGENT,
    blind_context,
    fetch,
    http_exchange,
    http_verdict,
    icmp_ping,
    net_failure,
    proxy_address,
    raw_http,
    says,
    tcp_canary,
    udp_echo,
    unix_canary,
)


@probe("network", "https_proxy_vars", "permitted")
def https_proxy_vars(c: Ctx) -> Result:
    """Control: HTTPS to an allowed host through HTTPS_PROXY, as well-behaved tools do."""
    return http_verdict(*fetch(c.url("https", c.spec.allowed_host), c.spec, env_proxy=True))


@probe("network", "http_proxy_vars", "permitted")
def http_proxy_vars(c: Ctx) -> Result:
    """Control: plain HTTP to an allowed host through HTTP_PROXY."""
    return http_verdict(*fetch(c.url("http", c.spec.allowed_host), c.spec, env_proxy=True))


@probe("network", "https_transparent", "permitted")
def https_transparent(c: Ctx) -> Result:
    """Control: a tool that ignores proxy variables still reaches an allowed host (sandbox DNS + redirect)."""
    return http_verdict(*fetch(c.url("https", c.spec.allowed_host), c.spec, env_proxy=False))


@probe("network", "blocked_via_proxy", "blocked")
def blocked_via_proxy(c: Ctx) -> Result:
    """Egress to a host off the allowlist through the explicit proxy (403 / refused tunnel = blocked)."""
    return http_verdict(*fetch(c.url("https", c.spec.blocked_host), c.spec, env_proxy=True))


@probe("network", "blocked_transparent", "blocked")
def blocked_transparent(c: Ctx) -> Result:
    """Egress to a blocked host by a tool that ignores the proxy; if its name does not resolve, by IP + SNI."""
    try:
        return http_verdict(*fetch(c.url("https", c.spec.blocked_host), c.spec, env_proxy=False))
    except Blocked as e:
        if not str(e).startswith("name did not resolve"):
            raise
        why = str(e)
    ip = c.spec.blocked_ip
    observed, detail = attempt(
        lambda: http_verdict(*raw_http(ip, 443, c.path, c.spec.blocked_host, sni=c.spec.blocked_host))
    )
    return observed, f"{why}; by hand to {ip}:443: {detail}"


@probe("network", "direct_tcp_ip", "blocked")
def direct_tcp_ip(c: Ctx) -> Result:
    """Raw TCP to a blocked IP (no name for the proxy to judge): exfiltration over any protocol."""
    return tcp_canary(c.spec.blocked_ip, c.spec.tcp_port, c.marker)


@probe("network", "allowed_ip_other_port", "blocked")
def allowed_ip_other_port(c: Ctx) -> Result:
    """An allowed host's IP on a port that is not allowed (rules are host AND port)."""
    return tcp_canary(c.spec.allowed_ip, c.spec.other_port, c.marker)


@probe("network", "connect_ip_literal", "blocked")
def connect_ip_literal(c: Ctx) -> Result:
    """CONNECT to a bare IP through the explicit proxy: skips every name-based decision."""
    target = f"{c.spec.blocked_ip}:443"
    proxy = proxy_address("https")
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
            with blind_context().wrap_socket(s, server_hostname=None) as tls:
                status, body = http_exchange(tls, c.path, c.spec.blocked_ip)
            extra = f"then HTTP {status}: {body[:60]!r}"
        except (OSError, http.client.HTTPException) as e:
            extra = f"then {describe(e)}"
    return "permitted", f"proxy answered {status_line!r}; {extra}"


@probe("network", "sni_spoof", "blocked")
def sni_spoof(c: Ctx) -> Result:
    """TLS to a blocked IP with an allowed SNI: the proxy must go to the NAME, never the original IP."""
    status, body = raw_http(c.spec.blocked_ip, 443, c.path, c.spec.allowed_host, sni=c.spec.allowed_host)
    observed = "permitted" if says(body, c.spec.blocked_host) else "blocked"
    return observed, f"HTTP {status}: {body[:120]!r}"


def _host_mismatch_transparent(c: Ctx) -> Result:
    status, body = raw_http(c.spec.blocked_ip, 80, c.path, c.spec.allowed_host)
    return ("permitted" if says(body, c.spec.blocked_host) else "blocked"), f"HTTP {status}: {body[:80]!r}"


def _host_mismatch_proxy(c: Ctx) -> Result:
    host, port = proxy_address("http")
    target = f"http://{c.spec.blocked_host}{c.path}"
    try:
        with socket.create_connection((host, port), timeout=HTTP_TIMEOUT) as s:
            status, body = http_exchange(s, target, c.spec.allowed_host)
    except OSError as e:
        raise net_failure(e) from e
    return http_verdict(status, body)


@probe("network", "host_mismatch", "blocked")
def host_mismatch(c: Ctx) -> Result:
    """Plain HTTP whose Host header names an allowed host while the IP / absolute URI is a blocked one."""
    return combine(
        [("transparent", attempt(_host_mismatch_transparent, c)), ("explicit proxy", attempt(_host_mismatch_proxy, c))],
        need="any",
    )


@probe("network", "host_fronting", "blocked", contexts=("child",))
def host_fronting(c: Ctx) -> Result:
    """Plain HTTP to an allowed URI with a Host header naming a blocked host: domain fronting on a shared server.

    A CDN picks its site by Host, so the daemon must refuse it. One context: the daemon decides, whoever
    asks. Evidence: the allowed canary must not log the marker."""
    host, port = proxy_address("http")
    try:
        with socket.create_connection((host, port), timeout=HTTP_TIMEOUT) as s:
            status, body = http_exchange(s, f"http://{c.spec.allowed_host}{c.path}", c.spec.blocked_host)
    except OSError as e:
        raise net_failure(e) from e
    return http_verdict(status, body)


@probe("network", "keepalive_blocked_host", "blocked", contexts=("child",))
def keepalive_blocked_host(c: Ctx) -> Result:
    """A request for a blocked host on a plain-HTTP connection kept alive after an allowed one: each is judged.

    The first request (no marker: the allowed canary may log it) must be answered, or the row proves
    nothing; the second names the blocked host, and its canary must not see it."""
    host, port = proxy_address("http")
    try:
        s = socket.create_connection((host, port), timeout=HTTP_TIMEOUT)
        with s:
            status, _ = http_exchange(s, f"http://{c.spec.allowed_host}/", c.spec.allowed_host, close=False)
            if status != 200:
                raise Unsupported(f"the allowed control request got HTTP {status}")
            try:  # a connection cut here is no refusal: the second request was never judged
                status, body = http_exchange(s, f"http://{c.spec.blocked_host}{c.path}", c.spec.blocked_host)
            except (OSError, http.client.HTTPException) as e:
                raise Unsupported(f"the kept-alive connection ended before its second answer: {describe(e)}") from e
    except OSError as e:
        raise net_failure(e) from e
    return http_verdict(status, body)


@probe("network", "rebind_loopback", "blocked")
def rebind_loopback(c: Ctx) -> Result:
    """An allowed name resolving to 127.0.0.1 (DNS rebinding): SSRF into the proxy host's own services."""
    return http_verdict(*fetch(c.url("http", c.spec.rebind_loopback_host), c.spec, env_proxy=True))


@probe("network", "rebind_metadata", "blocked")
def rebind_metadata(c: Ctx) -> Result:
    """An allowed name resolving to 169.254.169.254: SSRF into the cloud metadata service (credentials)."""
    return http_verdict(*fetch(c.url("http", c.spec.rebind_metadata_host), c.spec, env_proxy=True))


@probe("network", "udp", "blocked")
def udp(c: Ctx) -> Result:
    """A UDP datagram to a blocked IP: exfiltration without TCP."""
    return udp_echo(c.spec.blocked_ip, c.spec.udp_port, c.marker)


@probe("network", "quic", "blocked")
def quic(c: Ctx) -> Result:
    """UDP 443 (QUIC / HTTP/3) to a blocked IP: TLS the TCP proxy never sees."""
    return udp_echo(c.spec.blocked_ip, c.spec.quic_port, c.marker)


@probe("network", "ipv6", "blocked")
def ipv6(c: Ctx) -> Result:
    """IPv6 egress, which an IPv4-only firewall would not see."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.settimeout(TCP_TIMEOUT)
            s.connect(("2001:db8::1", 80))
            s.sendall(c.marker)
    except OSError as e:
        raise net_failure(e) from e
    return "permitted", "connected to [2001:db8::1]:80"


@probe("network", "raw_icmp", "blocked")
def raw_icmp(c: Ctx) -> Result:
    """ICMP echo (raw and ping sockets) to a blocked IP: a classic tunnel that is neither TCP nor UDP."""
    target = c.spec.blocked_ip
    return combine(
        [
            ("raw socket", attempt(icmp_ping, target, c.marker, socket.SOCK_RAW)),
            ("ping socket", attempt(icmp_ping, target, c.marker, socket.SOCK_DGRAM)),
        ],
        need="any",
    )


@probe("network", "abstract_unix", "blocked")
def abstract_unix(c: Ctx) -> Result:
    """An abstract unix socket served outside (X11, D-Bus, container runtimes live there)."""
    name = c.spec.abstract_socket
    return unix_canary(b"\0" + name.encode(), c.marker, f"@{name}")


@probe("network", "path_unix", "blocked")
def path_unix(c: Ctx) -> Result:
    """A filesystem unix socket served outside (docker.sock-like), under the host's /tmp."""
    path = c.spec.path_socket
    try:
        return unix_canary(path, c.marker, path)
    except FileNotFoundError:
        return "blocked", f"{path} does not exist here (hidden)"


def _fetch_verdict(url: str, c: Ctx, env_proxy: bool) -> Result:
    return http_verdict(*fetch(url, c.spec, env_proxy=env_proxy))


@probe("network", "rebind_own_address", "blocked")
def rebind_own_address(c: Ctx) -> Result:
    """An allowed name resolving to an address the proxy host holds itself (not loopback): SSRF into its own services."""
    url = c.url("http", c.spec.rebind_own_host)
    return combine(
        [
            ("explicit proxy", attempt(_fetch_verdict, url, c, True)),
            ("transparent", attempt(_fetch_verdict, url, c, False)),
        ],
        need="any",
    )
