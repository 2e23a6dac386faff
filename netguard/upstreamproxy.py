"""A corporate proxy upstream of the daemon: its URL, which connections skip it, and the CONNECT it is sent.

A run's `--upstream-proxy URL|none`, else the standard variables of sandgate's own environment, name
an HTTP proxy through which the daemon tunnels the connections it *allowed*, after deciding, to the
address it checked (`CONNECT <checked-ip>:<port>`): the SSRF veto still judged that address, and a
denied connection never reaches the proxy. Variables, as curl and Python's requests read them (the
lower-case spelling first; an empty value is unset):
  https_proxy / HTTPS_PROXY   every tunnel: CONNECT, TLS, raw TCP
  http_proxy / HTTP_PROXY     plain HTTP requests (also sent as a CONNECT tunnel to port 80)
  no_proxy / NO_PROXY         hosts dialled directly, with curl's matching (`bypass`)
`--upstream-proxy URL` is used for both kinds and wins over the variables (NO_PROXY still applies);
`--upstream-proxy none` ignores them all. ALL_PROXY is not read (it is often a SOCKS proxy).

Only `http://` proxies, with an explicit port (curl would default to 1080, requests to 80: a guess
would send the traffic to a wrong port). Credentials in the URL (`http://user:pass@host:port`) become
a `Proxy-Authorization: Basic` header sent by the daemon; they never enter the sandbox, and `shown`
(the only form written to logs and errors) leaves them out. Pure: no I/O.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

MAX_HEAD = 16 * 1024  # a proxy's answer to CONNECT longer than this is refused, never buffered without bound
OPTION = "--upstream-proxy"


class UpstreamError(ValueError):
    """A proxy setting sandgate cannot use; the message names where it came from and what to do."""


@dataclass(frozen=True)
class Proxy:
    """One HTTP proxy: where it listens, and its credentials (never logged)."""

    host: str  # a name or an IP literal, lower-case, no brackets
    port: int
    auth: str | None = None  # "user:password", percent-decoded: only ever sent as Proxy-Authorization

    @property
    def shown(self) -> str:
        """The proxy as logs and errors name it: never its credentials."""
        return f"http://{_authority(self.host, self.port)}"

    def authorization(self) -> str | None:
        """The Proxy-Authorization header's value, or None without credentials."""
        if self.auth is None:
            return None
        return "Basic " + base64.b64encode(self.auth.encode()).decode("ascii")


@dataclass(frozen=True)
class Upstream:
    """One run's proxy settings: the daemon is shared, so each binding carries its own run's."""

    https: Proxy | None = None  # tunnels: CONNECT, TLS, raw TCP
    http: Proxy | None = None  # plain HTTP requests
    no_proxy: str = ""  # the NO_PROXY text, matched with curl's rules (bypass)
    by_name: bool = False  # CONNECT host:port by name: the proxy resolves, the SSRF pin cannot hold

    def route(self, host: str, plain_http: bool) -> Proxy | None:
        """The proxy a connection to `host` goes through, or None: dialled directly."""
        proxy = self.http if plain_http else self.https
        if proxy is None or bypass(self.no_proxy, host):
            return None
        return proxy


@dataclass(frozen=True)
class Reply:
    """The status line of a proxy's answer to CONNECT."""

    status: int
    reason: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


# ---- where the settings come from --------------------------------------------------------------


def _pick(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) for `name`, the lower-case spelling first, as curl and requests do; empty is unset."""
    for var in (name.lower(), name.upper()):
        value = env.get(var, "")
        if value.strip():
            return var, value.strip()
    return None


def choose(option: str | None, env: Mapping[str, str]) -> Upstream | None:
    """The run's settings: `--upstream-proxy` (URL or `none`) wins, else the environment; None: no proxy."""
    no = _pick(env, "no_proxy")
    no_proxy = no[1] if no else ""
    if option is not None:
        if option.strip().lower() == "none":
            return None
        proxy = parse_url(option, OPTION)
        return Upstream(proxy, proxy, no_proxy)
    https, http = _pick(env, "https_proxy"), _pick(env, "http_proxy")
    if https is None and http is None:
        return None
    return Upstream(
        parse_url(https[1], https[0]) if https else None,
        parse_url(http[1], http[0]) if http else None,
        no_proxy,
    )


def parse_url(text: str, where: str) -> Proxy:
    """`http://[user[:password]@]host:port[/]` (the scheme may be left out); UpstreamError naming `where`."""
    raw = text.strip()
    if "://" not in raw:
        raw = "http://" + raw  # curl and requests read a bare host:port as http://
    try:
        u = urlsplit(raw)
        port = u.port
    except ValueError as e:
        raise UpstreamError(f"{where}: not a proxy URL ({e})") from None
    scheme = u.scheme.lower()
    if scheme != "http":
        raise UpstreamError(f"{where}: only http:// proxies are supported, not {scheme}://")
    host = (u.hostname or "").lower()
    if not host or any(c in host for c in " \t\r\n/\\"):
        raise UpstreamError(f"{where}: the proxy URL names no host")
    if port is None or port == 0:
        raise UpstreamError(f"{where}: give the proxy's port (http://HOST:PORT)")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise UpstreamError(f"{where}: a proxy URL has no path, query or fragment")
    auth = None
    if u.username is not None:
        auth = unquote(u.username) + ":" + unquote(u.password or "")
        if any(c in auth for c in "\r\n\0"):
            raise UpstreamError(f"{where}: a line break in the proxy's credentials")
    return Proxy(host, port, auth)


# ---- NO_PROXY, as curl matches it (lib/noproxy.c) ----------------------------------------------


def bypass(no_proxy: str, host: str) -> bool:
    """True when `host` (a name, or an IP literal with or without brackets) is dialled directly.

    curl's rules: the whole list `*` matches every host; entries are separated by commas (blanks
    around them ignored; a blank not followed by a comma ends the list); for a name, an entry
    matches it exactly or as a parent domain (`example.com` and `.example.com` both match
    `example.com` and `a.example.com`, never `badexample.com`), case-insensitively, a trailing
    dot ignored; for an IP literal, an entry is an address or a CIDR range (`10.0.0.0/8`,
    `fd00::/8`), compared as addresses. No port and no `*.` wildcard is understood."""
    if not host:
        return False
    text = no_proxy.strip(" \t")
    if text == "*":
        return True
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ip = _ip(name)
    if ip is None and name.endswith("."):
        name = name[:-1]
    return any(_match(entry, name, ip) for entry in _entries(text))


def _entries(text: str) -> list[str]:
    """The list's entries in curl's order: a token ends at a blank or a comma; only a comma goes on."""
    out: list[str] = []
    p, n = 0, len(text)
    while p < n:
        while p < n and text[p] in " \t":
            p += 1
        start = p
        while p < n and text[p] not in " \t,":
            p += 1
        if p > start:
            out.append(text[start:p])
        while p < n and text[p] in " \t":
            p += 1
        if p >= n or text[p] != ",":
            break
        while p < n and text[p] == ",":
            p += 1
    return out


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _match(entry: str, name: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    if ip is None:
        token = entry[:-1] if entry.endswith(".") else entry
        token = token[1:] if token.startswith(".") else token
        token, name = token.lower(), name.lower()
        if not token:
            return False
        return name == token or name.endswith("." + token)
    text, _, bits_text = entry.partition("/")
    addr = _ip(text)
    digits = bits_text[: len(bits_text) - len(bits_text.lstrip("0123456789"))]
    bits = int(digits) if digits else 0  # atoi: no digits is 0
    if addr is None or addr.version != ip.version or bits > addr.max_prefixlen:
        return False
    if bits in (0, addr.max_prefixlen):  # curl: no prefix, /0 and a full prefix compare the address itself
        return ip == addr
    return ip in ipaddress.ip_network(f"{addr}/{bits}", strict=False)


# ---- the CONNECT and its answer ----------------------------------------------------------------


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target(ip: str, name: str, port: int, by_name: bool) -> str:
    """The CONNECT's request target: the checked address, or the judged name when the proxy must resolve."""
    return _authority(name if by_name else ip, port)


def connect_request(authority: str, proxy: Proxy) -> bytes:
    """The CONNECT request sent to `proxy` for `authority` (host:port, IPv6 bracketed)."""
    if any(c in authority for c in " \r\n\0"):
        raise UpstreamError(f"not a CONNECT target: {authority!r}")
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    auth = proxy.authorization()
    if auth is not None:
        lines.append(f"Proxy-Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head_end(buf: bytes) -> int | None:
    """The length of the answer's head (through its blank line) once it is whole, else None.

    UpstreamError past MAX_HEAD: a proxy that never ends its head is refused, not buffered."""
    i = buf.find(b"\r\n\r\n")
    if i >= 0 and i + 4 <= MAX_HEAD:
        return i + 4
    if len(buf) >= MAX_HEAD:
        raise UpstreamError(f"the proxy's answer to CONNECT has no end within {MAX_HEAD} bytes")
    return None


def parse_reply(head: bytes) -> Reply:
    """The status of a proxy's answer head (`HTTP/1.x NNN reason`); UpstreamError if it is none."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (len(parts[1]) == 3 and parts[1].isdigit()):
        raise UpstreamError(f"the proxy did not answer CONNECT with HTTP: {line[:80]!r}")
    reason = parts[2].strip() if len(parts) > 2 else ""
    return Reply(int(parts[1]), "".join(c for c in reason[:120] if c.isprintable()))


def refusal(proxy: Proxy, authority: str, why: str) -> str:
    """How a failed tunnel is said to the client and in the audit log (never the credentials)."""
    return f"upstream proxy {proxy.shown} did not tunnel CONNECT {authority}: {why}"


# ---- in the spec the launcher sends the daemon (netguard.spec) ---------------------------

_PROXY_KEYS = ("host", "port", "auth")
_KEYS = ("https", "http", "no_proxy", "by_name")
_MAX_TEXT = 4096


def encode(up: Upstream | None) -> dict[str, object] | None:
    """Plain JSON-able data for the spec (credentials included: the spec goes to the daemon only)."""
    if up is None:
        return None
    proxies = {k: None if p is None else {"host": p.host, "port": p.port, "auth": p.auth} for k, p in
               (("https", up.https), ("http", up.http))}  # fmt: skip
    return {**proxies, "no_proxy": up.no_proxy, "by_name": up.by_name}


def decode(obj: object, error: type[ValueError]) -> Upstream | None:
    """What `encode` made, checked strictly; `error` (the spec's SpecError) for anything else."""
    if obj is None:
        return None
    if not isinstance(obj, dict) or sorted(obj) != sorted(_KEYS):
        raise error(f"upstream_proxy must be null or an object with exactly {', '.join(_KEYS)}")
    no_proxy, by_name = obj["no_proxy"], obj["by_name"]
    if not isinstance(no_proxy, str) or len(no_proxy) > _MAX_TEXT or not isinstance(by_name, bool):
        raise error("upstream_proxy.no_proxy must be a string, by_name true or false")
    https, http = (_decode_proxy(obj[k], f"upstream_proxy.{k}", error) for k in ("https", "http"))
    if https is None and http is None:
        raise error("upstream_proxy names no proxy")
    return Upstream(https, http, no_proxy, by_name)


def _decode_proxy(obj: object, where: str, error: type[ValueError]) -> Proxy | None:
    if obj is None:
        return None
    if not isinstance(obj, dict) or sorted(obj) != sorted(_PROXY_KEYS):
        raise error(f"{where} must be null or an object with exactly {', '.join(_PROXY_KEYS)}")
    host, port, auth = obj["host"], obj["port"], obj["auth"]
    if not isinstance(host, str) or not host or len(host) > 255 or any(c in host for c in " \t\r\n/[]@"):
        raise error(f"{where}.host must be a host name or IP address")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise error(f"{where}.port must be a port number from 1 to 65535")
    if auth is not None and (not isinstance(auth, str) or len(auth) > _MAX_TEXT or any(c in auth for c in "\r\n\0")):
        raise error(f"{where}.auth must be null or one line")
    return Proxy(host, port, auth)
