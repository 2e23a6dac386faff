"""TLS for inspected destinations: the pyOpenSSL objects mitmproxy's TLS layers need, made by us.

mitmproxy's own TlsConfig addon is never loaded: it creates a CA in ~/.mitmproxy, can switch
verification off (ssl_insecure) and honours SSLKEYLOGFILE. Here the client side is served a leaf
from the run's CA (netguard.decision.leafcerts) for the name the Gate judged (netguard.decision.layers
puts it in `context.server.sni`); the server side always verifies the upstream's chain and name
against the host's trust store plus the sandbox's `upstream_ca`. Only connections that
netguard.decision.layers chose to intercept ever reach these hooks: every other TLS byte is relayed.
"""

from __future__ import annotations

import ipaddress
import ssl
import weakref
from dataclasses import dataclass, field
from typing import cast

import certifi
from cryptography import x509
from mitmproxy import connection, http, tls
from mitmproxy.addons.tlsconfig import DEFAULT_HOSTFLAGS, AppData, alpn_select_callback
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.tls import HTTP_ALPNS
from OpenSSL import SSL, crypto

from netguard import hosts, rules
from netguard.decision.binding import Binding
from netguard.decision.leafcerts import MAX_CACHED, Issuer, Leaf, LeafError

_OPTIONS = SSL.OP_CIPHER_SERVER_PREFERENCE | SSL.OP_NO_COMPRESSION | SSL.OP_NO_RENEGOTIATION


@dataclass
class Material:
    """One sandbox's TLS material: built once (loading a trust store per connection is slow)."""

    binding: Binding  # held so its id() is not reused while this entry lives
    issuer: Issuer
    server: SSL.Context  # proxy as client, towards the upstream
    leaves: dict[str, tuple[Leaf, SSL.Context]] = field(default_factory=dict)  # towards the sandbox, per name
    # (name, port) -> the protocol its upstream chose last time; this sandbox's own, at most MAX_CACHED.
    upstream_alpn: dict[tuple[str, int], bytes] = field(default_factory=dict)

    def remember_alpn(self, key: tuple[str, int], alpn: bytes) -> None:
        self.upstream_alpn.pop(key, None)
        if len(self.upstream_alpn) >= MAX_CACHED:
            self.upstream_alpn.pop(next(iter(self.upstream_alpn)))
        self.upstream_alpn[key] = alpn

    def client(self, leaf: Leaf) -> SSL.Context:
        """The context serving `leaf`, made once per leaf: handing pyOpenSSL a leaf's cryptography objects
        converts them (~0.5 ms of a new inspected connection); a context keeps them converted."""
        hit = self.leaves.get(leaf.name)
        if hit is not None and hit[0] is leaf:
            return hit[1]
        if len(self.leaves) >= MAX_CACHED:  # the Issuer's own bound: a name it dropped is dropped here
            self.leaves.pop(next(iter(self.leaves)))
        ctx = _client_context()
        ctx.use_certificate(leaf.cert)
        ctx.use_privatekey(leaf.key)
        self.leaves[leaf.name] = (leaf, ctx)
        return ctx


def trust_store(ctx: SSL.Context, upstream_ca: str | None) -> None:
    """The host's roots (cafile and capath, else certifi's bundle) plus the sandbox's extra PEM roots.

    The extra roots come from the spec in memory: a path named by the sandbox is never opened.
    """
    paths = ssl.get_default_verify_paths()
    # None where the file or directory does not exist (typeshed says str)
    cafile, capath = cast(str | None, paths.cafile), cast(str | None, paths.capath)
    if cafile is None and capath is None:
        ctx.load_verify_locations(certifi.where())
    else:
        ctx.load_verify_locations(cafile, capath)
    if upstream_ca:
        store = ctx.get_cert_store()
        assert store is not None
        for cert in x509.load_pem_x509_certificates(upstream_ca.encode()):
            store.add_cert(crypto.X509.from_cryptography(cert))


def _client_context() -> SSL.Context:
    client = SSL.Context(SSL.TLS_SERVER_METHOD)
    client.set_min_proto_version(SSL.TLS1_2_VERSION)  # no downgrade below TLS 1.2 towards the sandbox
    client.set_options(_OPTIONS)
    client.set_alpn_select_callback(alpn_select_callback)
    return client


def _contexts(b: Binding) -> Material:
    assert b.ca is not None
    server = SSL.Context(SSL.TLS_CLIENT_METHOD)
    server.set_min_proto_version(SSL.TLS1_2_VERSION)
    server.set_options(_OPTIONS)
    # MITM of the proxy itself: the upstream must prove it is the host; there is no switch to turn this off.
    server.set_verify(SSL.VERIFY_PEER)
    trust_store(server, b.upstream_ca)
    return Material(b, Issuer(b.ca.cert, b.ca.key), server)


def verify_name(conn: SSL.Connection, name: str) -> None:
    """SNI = `name` and OpenSSL's hostname (or IP) check against it, as mitmproxy's TlsConfig does."""
    param = SSL._lib.SSL_get0_param(conn._ssl)  # type: ignore[attr-defined]  # pyOpenSSL internals
    SSL._lib.X509_VERIFY_PARAM_set_hostflags(param, DEFAULT_HOSTFLAGS)  # type: ignore[attr-defined]
    try:
        ip = ipaddress.ip_address(name).packed
    except ValueError:
        host = name.encode("idna")
        conn.set_tlsext_host_name(host)
        ok = SSL._lib.X509_VERIFY_PARAM_set1_host(param, host, len(host))  # type: ignore[attr-defined]
    else:
        ok = SSL._lib.X509_VERIFY_PARAM_set1_ip(param, ip, len(ip))  # type: ignore[attr-defined]
    if ok != 1:
        raise SSL.Error(f"cannot verify upstream name {name!r}")


def upstream_failure(name: str, port: int, why: str) -> str:
    """What a refused upstream TLS connection's request record and error say, on either path."""
    if "verify failed" in why.lower():
        return f"sandgate: upstream certificate verify failed for {name}:{port} ({why})"
    return f"sandgate: upstream TLS failed for {name}:{port} ({why})"


def _port(context: Context) -> int:
    """The upstream port of an inspected connection (its CONNECT or redirected destination)."""
    address = context.server.address
    return address[1] if address else 0


def _name(host: str) -> str:
    try:
        return str(rules.normalise(host))
    except hosts.HostError:
        return host


class TlsInspect:
    """The mitmproxy addon for intercepted TLS; shares the Gate's `bindings` (slot -> sandbox).

    Registered before the Gate so that a verification failure's message is final when the Gate's
    `error` hook (and its audit record) sees the flow.
    """

    def __init__(self, bindings: dict[int, Binding]) -> None:
        self.bindings = bindings
        self._ctx: dict[int, Material] = {}
        self._failed: dict[tuple[str, str], str] = {}  # (client id, host) -> why its upstream was refused
        # Each connection's TLS session by connection id, for the Gate's body takeover (netguard.relay.tlsbody);
        # weak: a session lives exactly as long as mitmproxy's TLS layer holds it.
        self.sessions: weakref.WeakValueDictionary[str, SSL.Connection] = weakref.WeakValueDictionary()

    def _for(self, client: connection.Client) -> Material | None:
        slot = client.proxy_mode.listen_port()
        return self.material(self.bindings.get(slot)) if slot is not None else None

    def material(self, b: Binding | None) -> Material | None:
        """Sandbox `b`'s TLS material, made once; shared with the front door's inspected path (netguard.daemon.tlshttp)."""
        if b is None or b.ca is None:
            return None
        entry = self._ctx.get(id(b))
        if entry is None or entry.binding is not b:
            live = {id(x) for x in self.bindings.values()}
            self._ctx = {k: v for k, v in self._ctx.items() if k in live}  # ended sandboxes: drop their keys
            entry = self._ctx[id(b)] = _contexts(b)
        return entry

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        # Never connect upstream before the request was judged (connection_strategy "lazy").
        data.establish_server_tls_first = False

    def tls_start_client(self, data: tls.TlsData) -> None:
        """Towards the sandbox: a leaf for the judged name (never the client's SNI inside CONNECT)."""
        entry = self._for(data.context.client)
        name = data.context.server.sni
        if entry is None or not name or data.ssl_conn is not None:
            return  # no ssl_conn: mitmproxy fails the connection (fail closed)
        try:
            leaf = entry.issuer.leaf(name)
        except LeafError as e:
            data.conn.error = f"sandgate: no certificate for {name}: {e}"
            return
        conn = SSL.Connection(entry.client(leaf))
        # Both h2 and http/1.1 clients: the upstream's protocol is not known yet (lazy), mitmproxy translates.
        # Except where this upstream answered HTTP/1.1 before: a client offering it gets it too, so a large
        # body can leave mitmproxy's layers (netguard.relay.tlsbody; h2 frames cannot), and h2 translated
        # to HTTP/1.1 would multiplex nothing upstream anyway. An h2-only client (gRPC) still gets h2.
        known = entry.upstream_alpn.get((name, _port(data.context)))
        conn.set_app_data(AppData(client_alpn=None, server_alpn=known if known == b"http/1.1" else None, http2=True))
        conn.set_accept_state()
        data.ssl_conn = self.sessions[data.conn.id] = conn

    def tls_start_server(self, data: tls.TlsData) -> None:
        """Towards the upstream: SNI and verification for the name the connection was made for."""
        entry = self._for(data.context.client)
        server = data.conn
        assert isinstance(server, connection.Server)
        name = server.sni or (server.address[0] if server.address else None)
        if entry is None or not name or data.ssl_conn is not None:
            return
        client = data.context.client
        offers = [a for a in client.alpn_offers if a in HTTP_ALPNS] or [b"http/1.1"]
        server.alpn_offers = tuple(offers)
        conn = SSL.Connection(entry.server)
        verify_name(conn, name)
        conn.set_alpn_protos(offers)
        conn.set_connect_state()
        data.ssl_conn = self.sessions[server.id] = conn

    def tls_established_server(self, data: tls.TlsData) -> None:
        """Remember what the upstream chose (see tls_start_client)."""
        entry, server = self._for(data.context.client), data.conn
        assert isinstance(server, connection.Server)
        if entry is not None and server.sni:  # no ALPN at all: an HTTP/1.1 server (RFC 7301 predates h2 in TLS)
            alpn = server.alpn or b"http/1.1"
            entry.remember_alpn((server.sni, _port(data.context)), alpn if alpn in HTTP_ALPNS else b"")

    def tls_failed_server(self, data: tls.TlsData) -> None:
        """Name the refused upstream in the error the flow (and its audit record) will carry."""
        server = data.conn
        assert isinstance(server, connection.Server)
        name = _name(server.sni or "?")
        port = server.address[1] if server.address else 0
        why = upstream_failure(name, port, server.error or "handshake failed")
        server.error = why  # a later request reusing this connection gets the same message
        self._failed[(data.context.client.id, name)] = why

    def error(self, flow: http.HTTPFlow) -> None:
        why = self._failed.get((flow.client_conn.id, _name(flow.request.host)))
        if why is not None and flow.error is not None and not flow.error.msg.startswith("sandgate:"):
            flow.error.msg = why

    def client_disconnected(self, client: connection.Client) -> None:
        for key in [k for k in self._failed if k[0] == client.id]:
            del self._failed[key]
