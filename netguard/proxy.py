"""The egress proxy: one mitmproxy addon that is the single decision point for a sandbox's traffic.

Three kinds of listener per sandbox, each bound to that sandbox's policy by its "slot" (the
listen port in its mitmproxy mode spec: the real port for `sandgate proxy`, a unique number
for the daemon, whose sandboxes all listen on the same ports inside their own namespaces):
  regular      explicit proxy (HTTP_PROXY): CONNECT host:port and absolute-URI plain HTTP
  transparent  nftables-redirected TCP: decided by TLS SNI or HTTP Host, never by the original IP
  dns          the sandbox's only resolver (netguard.dnsgate, not mitmproxy): allowed names only

Why every decision ends in `server_connect`: mitmproxy calls that hook before *any*
upstream connection, whatever layer asked for it. We resolve the allowed name
ourselves, veto loopback/private/metadata answers and this host's own addresses
(rebinding, SSRF: netguard.localaddrs, rules.check_address) and then pin the
connection to the checked address, so the name that was judged is the only
thing that can be reached. TLS is never intercepted: after the decision the bytes
are relayed untouched. No mitmproxy addon but ours and the listener runs, so no
flow is stored, no CA is offered to clients and bodies are streamed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import dns.asyncresolver
import dns.resolver
from mitmproxy import connection, http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.master import Master
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.options import Options
from mitmproxy.proxy import events, layer, layers, server_hooks
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import modes
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.mode_specs import RegularMode

from netguard import dnsgate, hosts, localaddrs, rules
from netguard.asking import Approver
from netguard.audit import AuditLog, Kind, close_record, decision_record
from netguard.dnsgate import PENDING_ADDRESS, is_name
from netguard.localaddrs import RESOLVE_TIMEOUT

__all__ = ["PENDING_ADDRESS", "Binding", "Gate", "Listeners", "ProxyError", "make_master", "serve"]

logger = logging.getLogger("sandgate.proxy")


class ProxyError(Exception):
    """The proxy could not start (port in use, bad listener): reported as one line by the launcher."""


@dataclass
class Binding:
    """One sandbox as the proxy sees it: its task id, compiled policy and audit log."""

    task: str
    rules: rules.Ruleset
    audit: AuditLog
    learn: bool = False  # default-deny names pass, recorded as would: deny (issue: learn a policy)
    ask_all: bool = False  # every default-deny name becomes a question
    approver: Approver | None = None  # where `ask` questions go; None: they are denied
    _resolver: dns.asyncresolver.Resolver | None = field(default=None, init=False, repr=False)
    _system_dns: tuple[str, int] | None = field(default=None, init=False, repr=False)

    def upstream_dns(self) -> tuple[str, int]:
        """Where allowed queries are forwarded: the policy's resolver, else the system's first nameserver
        (read from /etc/resolv.conf once, not on every query)."""
        if self.rules.policy.resolver is not None:
            return self.rules.policy.resolver
        if self._system_dns is None:
            system = dns.resolver.Resolver()
            self._system_dns = (str(system.nameservers[0]), int(system.port))
        return self._system_dns

    def resolver(self) -> dns.asyncresolver.Resolver | None:
        """A resolver pinned to the policy's `resolver:`; None means the system's (getaddrinfo)."""
        target = self.rules.policy.resolver
        if target is None:
            return None
        if self._resolver is None:
            r = dns.asyncresolver.Resolver(configure=False)
            r.nameservers = [target[0]]
            r.port = target[1]
            r.lifetime = RESOLVE_TIMEOUT
            self._resolver = r
        return self._resolver


@dataclass
class Verdict:
    decision: rules.Decision
    id: str
    host: str
    port: int | None
    ip: str | None = None

    @property
    def allowed(self) -> bool:
        return self.decision.allowed and (self.ip is not None or self.port is None)


@dataclass
class _Conn:
    """What the proxy knows about one client connection."""

    binding: Binding
    peer: tuple[str, int] | None = None
    kind: Kind = "tcp"
    pins: dict[tuple[str, int], Verdict] = field(default_factory=dict)
    last: Verdict | None = None


class _Counter:
    """Stream callback for HTTP bodies: counts bytes without keeping them (stream_large_bodies)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, data: bytes) -> bytes:
        self.n += len(data)
        return data


def _norm_key(host: str, port: int) -> tuple[str, int]:
    try:
        return str(rules.normalise(host)), port
    except hosts.HostError:
        return host, port


class Gate:
    """The mitmproxy addon. One instance serves every sandbox of the process; state is per connection.

    `bindings` maps a slot (the listen port of a connection's proxy mode) to its sandbox; the
    owner may add and remove slots while the proxy runs (the daemon does).
    """

    def __init__(self, bindings: dict[int, Binding]) -> None:
        self.bindings = bindings
        self._conns: dict[str, _Conn] = {}
        self.local = localaddrs.LocalAddrs()  # this host's own addresses: read now, refreshed when stale

    # ---- bookkeeping ------------------------------------------------------------------

    def _conn(self, client: connection.Client) -> _Conn | None:
        st = self._conns.get(client.id)
        if st is None:
            port = client.proxy_mode.listen_port()
            binding = self.bindings.get(port) if port is not None else None
            if binding is None:
                return None  # a listener without a policy: refuse (fail closed)
            st = self._conns[client.id] = _Conn(binding, tuple(client.peername[:2]) if client.peername else None)
        return st

    def client_connected(self, client: connection.Client) -> None:
        if self._conn(client) is None:
            client.error = "sandgate: no policy for this listener"

    def client_disconnected(self, client: connection.Client) -> None:
        self._conns.pop(client.id, None)

    # ---- the decision -----------------------------------------------------------------

    async def _authorize(
        self, st: _Conn, kind: Kind, host: str, port: int, *, method: str | None = None, url: str | None = None
    ) -> Verdict:
        """Decide, resolve, veto special addresses, write exactly one audit record; pin if allowed."""
        key = _norm_key(host, port)
        b = st.binding
        d, would = await self._decide(st, kind, host, key[0], port)
        v = Verdict(d, uuid.uuid4().hex[:12], key[0], port)
        if d.allowed:
            pinned = st.pins.get(key)
            if pinned is not None:
                v.ip = pinned.ip
            else:
                dest = rules.normalise(host)
                if isinstance(dest, str):
                    v.decision, v.ip = await self._resolve_checked(b, dest, port, d)
                else:
                    v.ip = str(dest)  # an address allowed by a cidr rule: nothing to resolve
        b.audit.write(
            decision_record(
                b.task,
                v.id,
                kind,
                "allow" if v.allowed else "deny",
                v.host,
                port,
                ip=v.ip if v.allowed else None,
                method=method,
                url=url,
                rule=v.decision.rule,
                reason=v.decision.reason,
                would=would if v.allowed else None,
            )
        )
        if v.allowed:
            st.pins[key] = v
            st.last = v
        return v

    async def _decide(
        self, st: _Conn, kind: Kind, host: str, name: str, port: int | None
    ) -> tuple[rules.Decision, str | None]:
        """The policy's decision, then learn mode and human approval: (decision, would)."""
        b = st.binding
        d = rules.decide(b.rules, host, port)
        default_deny = d.action == "deny" and d.rule is None and is_name(host)
        if default_deny and b.learn:
            return rules.Decision("allow", None, f"learn mode: {d.reason}"), "deny"
        if default_deny and b.ask_all:
            d = rules.Decision("ask", None, f"{d.reason} (--ask)")
        if d.action != "ask":
            return d, None
        if b.approver is None or port is None:
            return rules.Decision("deny", d.rule, d.reason + " (no approval channel; denied)"), None
        answer = await b.approver.ask(name, port, kind, st.peer, d.reason)
        if answer in ("once", "run", "always"):
            return rules.Decision("allow", d.rule, f"approved by a human ({answer})"), None
        why = "no answer in time" if answer == "timeout" else "denied by a human"
        return rules.Decision("deny", d.rule, f"{d.reason}: {why}"), None

    async def _resolve_checked(
        self, b: Binding, name: str, port: int, d: rules.Decision
    ) -> tuple[rules.Decision, str | None]:
        return await localaddrs.resolve_checked(b.resolver(), b.rules, name, port, d, self.local.table())

    # ---- layers: what each listener speaks ----------------------------------------------

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        """Our own protocol detection; mitmproxy's default one (which can intercept TLS) is not loaded."""
        if nextlayer.layer is not None:
            return
        ctx = nextlayer.context
        st = self._conn(ctx.client)
        if st is None:
            return
        if len(ctx.layers) == 1 and isinstance(ctx.layers[0], modes.HttpProxy):
            nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.regular)
            return
        if isinstance(ctx.client.proxy_mode, RegularMode):
            # Inside a CONNECT tunnel that was already allowed: relay bytes, never parse or intercept.
            nextlayer.layer = self._relay(ctx)
            return
        # Transparent: the original destination (an IP) is only a fallback for raw TCP.
        assert ctx.server.address is not None
        dst_ip, dst_port = ctx.server.address[0], ctx.server.address[1]
        data = nextlayer.data_client()
        if not data:
            if rules.decide(st.binding.rules, dst_ip, dst_port).allowed:
                st.kind = "tcp"  # a cidr-allowed address: server-speaks-first protocols must not wait
                nextlayer.layer = self._relay(ctx)
            return  # wait for the first bytes (SNI or Host header)
        if starts_like_tls_record(data):
            try:
                hello = parse_client_hello(data)
            except ValueError:
                hello = None
            else:
                if hello is None:
                    return  # ClientHello split over several segments
            st.kind = "tls"
            if hello is not None and hello.sni:
                # Re-target to the *name*: a client sending SNI allowed.test to a blocked IP reaches allowed.test.
                ctx.server.address = (hello.sni, dst_port)
            nextlayer.layer = self._relay(ctx)
        elif data[:3].isalpha() and b" " in data.split(b"\n", 1)[0]:
            st.kind = "http"
            nextlayer.layer = layers.HttpLayer(ctx, HTTPMode.transparent)
        else:
            st.kind = "tcp"
            nextlayer.layer = self._relay(ctx)

    # ---- explicit proxy and plain HTTP --------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        st = self._conn(flow.client_conn)
        assert st is not None
        st.kind = "connect"
        v = await self._authorize(st, "connect", flow.request.host, flow.request.port)
        if not v.allowed:
            flow.response = _refusal(v)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        st = self._conn(flow.client_conn)
        assert st is not None
        req = flow.request
        if not isinstance(flow.client_conn.proxy_mode, RegularMode):
            # Transparent: the Host header names the destination; the original IP is not trusted.
            name = (req.host_header or "").strip()
            if name:
                name = name.rsplit(":", 1)[0] if not name.endswith("]") and name.count(":") == 1 else name
                name = name.strip("[]")
                try:
                    req.host = str(hosts.normalise(name))
                except hosts.HostError:
                    req.host = name
        v = await self._authorize(st, "http", req.host, req.port, method=req.method, url=req.pretty_url)
        if not v.allowed:
            flow.response = _refusal(v)
            return
        flow.metadata["sandgate"] = (v, time.monotonic(), _Counter(), _Counter())
        req.stream = flow.metadata["sandgate"][2]

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if (meta := flow.metadata.get("sandgate")) and flow.response is not None:
            flow.response.stream = meta[3]

    def response(self, flow: http.HTTPFlow) -> None:
        self._http_closed(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._http_closed(flow)

    def _http_closed(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.pop("sandgate", None)
        st = self._conns.get(flow.client_conn.id)
        if meta is None or st is None:
            return
        v, t0, up, down = meta
        st.binding.audit.write(
            close_record(
                st.binding.task, v.id, "http", v.host, v.port, v.ip, up.n, down.n, int((time.monotonic() - t0) * 1000)
            )
        )

    # ---- every upstream connection ------------------------------------------------------

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        st = self._conn(data.client)
        if st is None or data.server.address is None:
            data.server.error = "sandgate: no policy"
            return
        host, port = data.server.address[0], data.server.address[1]
        v = st.pins.get(_norm_key(host, port))
        if v is None:
            # Nothing decided this destination yet (transparent TLS/raw TCP): decide now.
            v = await self._authorize(st, st.kind, host, port)
            if not v.allowed:
                data.server.error = f"sandgate: {v.decision.reason}"
                return
        assert v.ip is not None
        data.server.address = (v.ip, port)  # pin: the checked address, not a second lookup

    # ---- raw TCP relays ----------------------------------------------------------------

    def _relay(self, ctx: Context) -> _Relay:
        def closed(relay: _Relay) -> None:
            st = self._conns.get(ctx.client.id)
            if st is None or st.last is None:
                return
            v = st.last
            st.binding.audit.write(
                close_record(
                    st.binding.task,
                    v.id,
                    st.kind,
                    v.host,
                    v.port,
                    v.ip,
                    relay.up,
                    relay.down,
                    int((time.monotonic() - relay.t0) * 1000),
                )
            )

        return _Relay(ctx, closed)


class _Relay(layers.TCPLayer):
    """Relays bytes untouched and counts them.

    mitmproxy's flow-backed TCP layer runs an addon hook per chunk, which decouples reading
    from writing: a fast server then fills the proxy's memory (measured: ~0.6x the download
    size). The hookless relay keeps mitmproxy's read-after-drain backpressure; we only count.
    """

    def __init__(self, ctx: Context, on_close: Callable[[_Relay], None]) -> None:
        super().__init__(ctx, ignore=True)
        self.up = self.down = 0
        self.t0 = time.monotonic()
        self._on_close: Callable[[_Relay], None] | None = on_close

    def relay_messages(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.DataReceived):
            if event.connection is self.context.client:
                self.up += len(event.data)
            else:
                self.down += len(event.data)
        yield from super().relay_messages(event)
        if self._handle_event == self.done and self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(self)


def _refusal(v: Verdict) -> http.Response:
    rule = f" [{v.decision.rule}]" if v.decision.rule else ""
    body = f"sandgate: blocked {v.host}:{v.port}: {v.decision.reason}{rule}\n"
    return http.Response.make(
        403, body, {"Content-Type": "text/plain; charset=utf-8", "Connection": "close", "X-Sandgate": "blocked"}
    )


@dataclass(frozen=True)
class Listeners:
    """The listen addresses of one sandbox for `sandgate proxy`; every one maps to the same Binding."""

    regular: tuple[str, int] | None = None
    transparent: tuple[str, int] | None = None
    dns: tuple[str, int] | None = None

    def modes(self) -> list[tuple[str, int]]:
        """(spec, port) of every listener, DNS included (it is served by dnsgate, not mitmproxy)."""
        out = []
        for name in ("regular", "transparent", "dns"):
            addr = getattr(self, name)
            if addr is not None:
                out.append((f"{name}@{_fmt(addr)}", addr[1]))
        return out


def _fmt(addr: tuple[str, int]) -> str:
    host = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
    return f"{host}:{addr[1]}"


def make_master(bindings: dict[int, Binding], modes: list[str]) -> tuple[Master, Proxyserver, Gate]:
    """mitmproxy with only the Proxyserver and our Gate: the one setup `serve` and the daemon share.

    No TLS addon is loaded, so mitmproxy never creates its CA or touches its confdir (~/.mitmproxy):
    nothing is written outside the audit log (tests check the home directory stays empty).
    Must be called with an event loop running.
    """
    opts = Options(mode=modes)
    master = Master(opts)
    proxyserver = Proxyserver()
    gate = Gate(bindings)
    master.addons.add(proxyserver, gate)
    opts.update(
        connection_strategy="lazy",  # decide on the name (SNI/Host) before any upstream connection exists
        stream_large_bodies="64k",  # bodies pass through, never buffered whole
        store_streamed_bodies=False,
    )
    return master, proxyserver, gate


def _dns_sockets(addr: tuple[str, int]) -> tuple[socket.socket, socket.socket]:
    """A bound UDP socket and a listening TCP socket on `addr`, for dnsgate (ProxyError if taken)."""
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


async def serve(
    sandboxes: list[tuple[Listeners, Binding]],
    ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the proxy until `stop` is set. Raises ProxyError if a listener cannot be opened."""
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
    master, proxyserver, _ = make_master(bindings, specs)
    if not await proxyserver.setup_servers():
        await master.done()
        raise ProxyError(f"cannot listen on {', '.join(specs)} (address in use or not available?)")
    services: list[dnsgate.DnsService] = []
    try:
        gate = dnsgate.DnsGate()
        for addr, binding in dns_addrs:
            udp, tcp = _dns_sockets(addr)
            services.append(await dnsgate.serve_udp(udp, binding, gate))
            services.append(await dnsgate.serve_tcp(tcp, binding, gate))
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
