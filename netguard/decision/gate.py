"""The egress proxy's mitmproxy addon: the single decision point for a sandbox's TCP, TLS and HTTP.

Three kinds of listener per sandbox, each bound to that sandbox's policy by its "slot" (the
listen port in its mitmproxy mode spec: the real port for `sandgate proxy`, a unique number
for the daemon, whose sandboxes all listen on the same ports inside their own namespaces):
  regular      explicit proxy (HTTP_PROXY): CONNECT host:port and absolute-URI plain HTTP
  transparent  nftables-redirected TCP: decided by TLS SNI or HTTP Host, never by the original IP
  dns          the sandbox's only resolver (netguard.decision.dns, not mitmproxy): allowed names only

Why every decision ends in `server_connect`: mitmproxy calls that hook before *any*
upstream connection, whatever layer asked for it. We resolve the allowed name
ourselves, veto loopback/private/metadata answers and this host's own addresses
(rebinding, SSRF: netguard.localaddrs, netguard.verdict.veto) and then pin the
connection to the checked address, so the name that was judged is the only
thing that can be reached. TLS is relayed untouched after the decision (netguard.decision.layers)
unless the destination's allow entry asks for inspection: then netguard.decision.tlsinspect
terminates it with a leaf from the run's own CA and every request is judged here
(netguard.decision.inspected: request rules, brokered credentials, leaks). No mitmproxy addon but
ours and the listener runs, so no flow is stored, mitmproxy's own CA is never made and bodies
are streamed. The plainest flows (a CONNECT or transparent TLS the policy allows by itself, not
inspected) never reach this addon: netguard.daemon.frontdoor decides them with the same code
(netguard.decision.decide) and splices them before mitmproxy's per-connection setup.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mitmproxy import connection, http
from mitmproxy.proxy import layer, server_hooks
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.mode_specs import RegularMode
from OpenSSL import SSL

from netguard import hosts, rules, upstreamproxy
from netguard.audit import Kind, Limit, close_record
from netguard.decision import decide, flowview, inspected, layers, trim, viamitm
from netguard.decision.binding import Binding
from netguard.decision.decide import Conn, Decided
from netguard.relay import bodycopy, bodyrelay


@dataclass
class _Exchange:
    """One allowed request in flight: its connection's decision, when it began, the bytes each way."""

    decided: Decided
    t0: float
    up: bodycopy.Counter
    down: bodycopy.Counter
    request: inspected.Logged | None = None  # judged (inspected or a leak check): a `request` record, not a `close`
    scan: bool = False  # the body is held (up to stream_large_bodies) and looked into for a sentinel
    body: bodyrelay.BodyRelay | None = None  # the response body left mitmproxy for a counted splice


class Gate:
    """The mitmproxy addon. One instance serves every sandbox of the process; state is per connection.

    `bindings` maps a slot (the listen port of a connection's proxy mode) to its sandbox; the
    owner may add and remove slots while the proxy runs (the daemon does).
    """

    def __init__(self, bindings: dict[int, Binding]) -> None:
        self.bindings = bindings
        self._conns: dict[str, Conn] = {}
        self.decider = decide.Decider()  # the one decision code, shared with the front door (netguard.daemon.frontdoor)
        self._named: dict[str, tuple[str, int]] = {}  # server id -> the name it was judged for (keep-alive)
        self.handlers: Mapping[Any, Any] = {}  # mitmproxy's handlers by client id (make_master): the kernel relay
        self.trimmer = trim.Trimmer()
        self.sessions: Mapping[str, SSL.Connection] = {}  # TlsInspect's TLS sessions by connection id (make_master)
        viamitm.install()  # tunnels to a run's corporate proxy are judged like any connection (netguard.decision.viamitm)

    # ---- bookkeeping ------------------------------------------------------------------

    def _conn(self, client: connection.Client) -> Conn | None:
        st = self._conns.get(client.id)
        if st is None:
            port = client.proxy_mode.listen_port()
            binding = self.bindings.get(port) if port is not None else None
            if binding is None:
                return None  # a listener without a policy: refuse (fail closed)
            peer = (str(client.peername[0]), int(client.peername[1])) if client.peername else None
            st = self._conns[client.id] = Conn(binding, peer)
        return st

    def client_connected(self, client: connection.Client) -> None:
        if self._conn(client) is None:
            client.error = "sandgate: no policy for this listener"

    def client_disconnected(self, client: connection.Client) -> None:
        self._conns.pop(client.id, None)
        self.trimmer.closed()  # what the connection held goes back to the system, not only to the heap

    def head_refused(self, client: connection.Client, limit: Limit, kind: Kind, why: str) -> None:
        """netguard.decision.headlimit closed this client: its sandbox's log says so."""
        st = self._conn(client)
        if st is not None and st.binding.refusals is not None:
            st.binding.refusals.refuse(limit, kind, why)

    # ---- layers: what each listener speaks ----------------------------------------------

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        """Our own protocol detection (mitmproxy's default one is not loaded); TLS is terminated only where inspected."""
        if nextlayer.layer is not None:
            return
        st = self._conn(nextlayer.context.client)
        if st is None:
            return
        kind = layers.choose(nextlayer, st.binding.rules, self._relay, st.binding.inspection)
        if kind is not None:
            st.kind = kind
        self._via_relay(nextlayer, st.binding)

    def _via_relay(self, nextlayer: layer.NextLayer, b: Binding) -> None:
        """A raw relay of a run with a corporate proxy goes through it (NO_PROXY aside): viamitm.tunnelled."""
        relay, server = nextlayer.layer, nextlayer.context.server
        if isinstance(relay, layers.Relay) and server.address is not None:
            proxy = b.via(flowview.norm_key(server.address[0], server.address[1])[0])
            if proxy is not None:
                nextlayer.layer = viamitm.tunnelled(nextlayer.context, relay, proxy)

    # ---- explicit proxy and plain HTTP --------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        st = self._conn(flow.client_conn)
        assert st is not None
        st.kind = "connect"
        d = await self.decider.authorize(st, "connect", flow.request.host, flow.request.port)
        if not d.allowed:
            flow.response = flowview.refusal(d.host, d.port, d.verdict.decision)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Every request the proxy reads: its destination decided, then (netguard.decision.inspected) leaks
        refused, an inspected destination's method/path rules applied, credentials brokered."""
        st = self._conn(flow.client_conn)
        assert st is not None
        req = flow.request
        if not isinstance(flow.client_conn.proxy_mode, RegularMode):
            _named_by_host(req)  # transparent: the Host header names the destination; the original IP is not trusted
        b = st.binding
        host, port = flowview.norm_key(req.host, req.port)
        https = req.scheme == "https"
        insp = b.inspection(host, port)
        if https:
            d = st.pins.get((host, port)) or await self.decider.authorize(st, st.kind, req.host, req.port)
        else:
            url = req.pretty_url if insp is None or insp.log_query else req.pretty_url.split("?", 1)[0]
            url = inspected.redact(url, b.secrets)  # a leak attempt's URL: never the value in the log
            d = await self.decider.authorize(st, "http", req.host, req.port, method=req.method, url=url)
        sent = req.data.method.decode(flowview.ENC, flowview.ESC)  # req.method is upper-cased; `post` goes as sent
        readable = bool(b.secrets) or insp is not None or https  # plain, uninspected, no credential: the hot path
        fields = flowview.fields(req.headers) if readable else []
        # A denied destination is judged for leaks only: refused anyway, but a key sent there must show.
        j = (
            inspected.judge(insp if d.allowed else None, b.secrets, host, sent, req.path, fields, https)
            if readable
            else None
        )
        front = flowview.fronted(flow, host) if d.allowed else None
        if front and (j is None or j.allowed):
            j = inspected.Judged(False, insp.origin if insp else None, front)
        ex = _Exchange(d, time.monotonic(), bodycopy.Counter(), bodycopy.Counter())
        if j is not None:
            method = inspected.redact(sent, b.secrets)
            path = inspected.logged_path(req.path, insp is not None and insp.log_query, b.secrets)
            ex.request = inspected.Logged(st.kind if https else "http", host, port, method, path, j)
        if not d.allowed:
            if ex.request is not None and ex.request.judged.leak is not None:
                self._write_request(st, ex, 403, 0, 0, 0)
            if not flowview.answerable(req):
                flow.kill()  # type: ignore[no-untyped-call]  # a 403 before a streamed body crashes the layer
                return
            # HTTP/2 has no Connection header: the stream ends
            flow.response = flowview.refusal(d.host, d.port, d.verdict.decision, close=not https)
            return
        if j is not None and not j.allowed:
            self._refuse(flow, st, ex)
            return
        if https and insp is not None:
            brokered = inspected.broker(fields, b.secrets, host, lower=req.is_http2)
            if brokered != fields:
                req.headers = http.Headers(
                    [(n.encode(flowview.ENC, flowview.ESC), v.encode(flowview.ENC, flowview.ESC)) for n, v in brokered]
                )
        self._goes_on(flow, ex, b.via(host, plain_http=not https))
        if b.secrets and not (https and any(s.host == host for s in b.secrets)):
            ex.scan = True  # a body to anywhere but a credential's own host: held and scanned in `request`
            return
        req.stream = ex.up

    @staticmethod
    def _goes_on(flow: http.HTTPFlow, ex: _Exchange, proxy: upstreamproxy.Proxy | None) -> None:
        """An allowed request goes on: its exchange kept for the hooks after it, its upstream through the
        run's corporate proxy (None: direct; netguard.decision.viamitm)."""
        viamitm.route(flow, proxy)
        flow.metadata["sandgate"] = ex

    def request(self, flow: http.HTTPFlow) -> None:
        """A held body (ex.scan) carrying a sentinel or real value is an attempted leak: 403 before it leaves.

        Bodies past stream_large_bodies (1 MiB) or of unknown length past it are streamed unscanned:
        holding them would cost the daemon their size, and the sentinel they could carry is worthless."""
        ex = flow.metadata.get("sandgate")
        st = self._conns.get(flow.client_conn.id)
        if not isinstance(ex, _Exchange) or not ex.scan or st is None or flow.request.raw_content is None:
            return
        body = flow.request.raw_content
        ex.up.n += len(body)
        j = inspected.body_leak(st.binding.secrets, ex.decided.host, body)
        if j is None:
            return
        del flow.metadata["sandgate"]  # the refusal writes its record: no second one at `response`
        req = flow.request
        path = inspected.logged_path(req.path, False, st.binding.secrets)
        ex.request = inspected.Logged(st.kind if req.scheme == "https" else "http", ex.decided.host, req.port,
                                      req.data.method.decode(flowview.ENC, flowview.ESC), path, j)  # fmt: skip
        self._refuse(flow, st, ex)

    def _refuse(self, flow: http.HTTPFlow, st: Conn, ex: _Exchange) -> None:
        """A 403 for one request; the connection stays open (kept-alive HTTP/1.1, HTTP/2: others go on)."""
        r = ex.request
        assert r is not None
        if not flowview.answerable(flow.request):
            # mitmproxy cannot answer before a body it streams (the layer would crash): refuse by closing
            # (HTTP/1) the connection. The upstream still never sees the request.
            flow.kill()  # type: ignore[no-untyped-call]  # mitmproxy leaves it unannotated
            j = r.judged
            r.judged = inspected.Judged(False, j.rule, f"{j.reason} (body too large to drain: closed)", j.leak)
            self._write_request(st, ex, 403, 0, 0, 0)
            return
        body = inspected.refusal_text(r.method, r.path, r.host, r.judged)
        flow.response = http.Response.make(
            403, body, {"Content-Type": "text/plain; charset=utf-8", "X-Sandgate": "blocked"}
        )
        flow.response.http_version = flow.request.http_version
        self._write_request(st, ex, 403, 0, 0, 0)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if isinstance(ex := flow.metadata.get("sandgate"), _Exchange) and flow.response is not None:
            flow.response.stream = ex.down
            st = self._conns.get(flow.client_conn.id)
            r = ex.request
            bound = [s for s in st.binding.secrets if s.host == r.host] if st and r else []
            if bound:  # an upstream echoing the header it got would hand the sandbox the real value
                fields = flow.response.headers.fields
                flow.response.headers = http.Headers([(n, inspected.unsecret(v, bound)) for n, v in fields])
                flow.response.stream = inspected.Scrub(ex.down, bound)
            elif not ex.scan:  # no credential is in play: a large body may leave mitmproxy's layers
                ex.body = bodyrelay.BodyRelay.take(self.handlers, flow, ex.down, self._sessions(flow))

    def _sessions(self, flow: http.HTTPFlow) -> bodyrelay.Sessions | None:
        """An inspected flow's (upstream, client) TLS sessions, as TlsInspect made them for mitmproxy."""
        up, down = self.sessions.get(flow.server_conn.id), self.sessions.get(flow.client_conn.id)
        return (up, down) if up is not None and down is not None else None

    def response(self, flow: http.HTTPFlow) -> None:
        self._http_closed(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._http_closed(flow)

    def _http_closed(self, flow: http.HTTPFlow) -> None:
        """One record per allowed request: a `request` record when it was judged, else a `close`."""
        ex = flow.metadata.pop("sandgate", None)
        st = self._conns.get(flow.client_conn.id)
        if not isinstance(ex, _Exchange) or st is None:
            return
        if ex.body is not None:
            ex.body.cut()  # first: the bytes it moved are counted in the record below
        d = ex.decided
        ms = int((time.monotonic() - ex.t0) * 1000)
        if ex.request is not None:
            whole = ex.body is not None and ex.body.complete  # the takeover's end aborts the upstream: no failure
            failed = (flow.error is not None and not whole) or flow.response is None
            status = None if failed or flow.response is None else flow.response.status_code
            if flow.error is not None and not whole:
                why = inspected.redact(flow.error.msg, st.binding.secrets)
                ex.request.judged = inspected.Judged(True, ex.request.judged.rule, f"failed: {why}")
            self._write_request(st, ex, status, ex.up.n, ex.down.n, ms)
            return
        st.binding.audit.write(
            close_record(st.binding.task, d.id, "http", d.host, d.port, d.verdict.ip, ex.up.n, ex.down.n, ms)
        )

    def _write_request(self, st: Conn, ex: _Exchange, status: int | None, up: int, down: int, ms: int) -> None:
        assert ex.request is not None  # a refused request counts among the run's capped denials
        st.binding.write_decision(ex.request.record(st.binding.task, ex.decided.id, status, up, down, ms))

    # ---- every upstream connection ------------------------------------------------------

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        st = self._conn(data.client)
        inner = viamitm.inner(data.server)  # a connection to the run's corporate proxy: judged by where it leads
        target = inner if inner is not None else data.server
        if st is None or target.address is None:
            data.server.error = "sandgate: no policy"
            return
        host, port = target.address[0], target.address[1]
        d = st.pins.get(flowview.norm_key(host, port))
        if d is None:
            # Nothing decided this destination yet (transparent TLS/raw TCP): decide now.
            d = await self.decider.authorize(st, st.kind, host, port)
            if not d.allowed:
                data.server.error = f"sandgate: {d.verdict.decision.reason}"
                return
        assert d.verdict.ip is not None
        if inner is not None:  # the proxy is dialled, the CONNECT names d's checked address (connect_upstream)
            if (why := viamitm.opened(st.binding, d, st.kind, data.server)) is not None:
                data.server.error = why
            return
        data.server.address = (d.verdict.ip, port)  # pin: the checked address, not a second lookup
        self._named[data.server.id] = (host, port)

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        """A connection, once made to the pinned address, is named again by the host it was judged for:
        mitmproxy reuses one only for a request whose (host, port) is its address. With the pinned IP there,
        every request opened a new upstream connection and the old ones stayed open, and mitmproxy lets one
        client connection hold at most 5 per address (ConnectionHandler.max_conns, held for a connection's
        life): the 6th request of a kept-alive inspected connection waited for ever (issue 25: `npm ci`
        stalled until npm's 5-minute timeout). Plain and inspected TLS alike: a TLS connection is verified
        for this same name (its SNI), and each request on it is still judged against this client's pin."""
        named = self._named.pop(data.server.id, None)
        if named is not None and data.server.peername is not None:
            # A label only: mitmproxy forbids moving an open connection (it would not reconnect); it stays on the pin.
            object.__setattr__(data.server, "address", named)

    def server_connect_error(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._named.pop(data.server.id, None)
        viamitm.failed(data.server, data.server.error or "cannot connect")  # a corporate proxy out of reach

    def http_connect_upstream(self, flow: http.HTTPFlow) -> None:
        """The CONNECT to a run's corporate proxy: to the checked address, with its credentials (viamitm)."""
        viamitm.connect_upstream(flow)

    # ---- raw TCP relays ----------------------------------------------------------------

    def _relay(self, ctx: Context) -> layers.Relay:
        def closed(relay: layers.Relay) -> None:
            st = self._conns.get(ctx.client.id)
            if st is None or st.last is None:
                return
            d = st.last
            st.binding.audit.write(
                close_record(
                    st.binding.task,
                    d.id,
                    st.kind,
                    d.host,
                    d.port,
                    d.verdict.ip,
                    relay.up,
                    relay.down,
                    int((time.monotonic() - relay.t0) * 1000),
                )
            )

        return layers.Relay(ctx, closed, self.handlers)


def _named_by_host(req: http.Request) -> None:
    """A transparent request's host becomes its Host header's name (normalised; as sent if it is none)."""
    name, _ = hosts.split_host_port((req.host_header or "").strip())
    if name:
        try:
            req.host = str(rules.normalise(name))  # cached: a kept-alive connection asks per request
        except hosts.HostError:
            req.host = name
