"""The Gate addon's hooks, driven through mitmproxy's own addon machinery (taddons, tflow).

No sockets but a fake upstream resolver (tests.test_dns.FakeDns, which answers 192.0.2.1 for
names and 127.0.0.1 for rebind.test): each test hands a hook what mitmproxy would hand it and
reads back the flow, the pinned server address and the audit log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.rrset
import pytest
from mitmproxy import connection, http
from mitmproxy.proxy import layer, server_hooks
from mitmproxy.proxy.layers.http._hooks import HttpConnectHook, HttpRequestHeadersHook
from mitmproxy.test import taddons, tflow, tutils

from netguard import rules
from netguard.audit import AuditLog, read_records
from netguard.decision import layers
from netguard.decision.binding import Binding
from netguard.decision.gate import Gate
from netguard.policy import parse_network

from ..support.dnsfake import FakeDns, standard_answer
from ..support.mitmhooks import client, client_hello, next_layer

REGULAR, TRANSPARENT = 3128, 3129  # slots: the listen ports of the two modes


def answer(q: dns.message.Message, proto: str) -> dns.message.Message | None:
    if q.question[0].name.labels[0] == b"rebind":
        r = dns.message.make_response(q)
        r.answer.append(dns.rrset.from_text(q.question[0].name, 60, "IN", "A", "127.0.0.1"))
        return r
    return standard_answer(q, proto)


@pytest.fixture
def upstream() -> Iterator[FakeDns]:
    srv = FakeDns(answer)
    try:
        yield srv
    finally:
        srv.close()


class World:
    """One sandbox behind a Gate, its audit log, and mitmproxy's addon context to drive the hooks."""

    def __init__(self, tmp_path: Path, upstream: FakeDns, *, learn: bool = False) -> None:
        pol = parse_network(
            {
                "allow": ["allowed.test", "rebind.test", {"cidr": "203.0.113.0/24", "ports": [5432]}],
                "deny": ["evil.allowed.test"],
                "resolver": f"127.0.0.1:{upstream.port}",
            },
            "p.yaml",
        )
        self.log = tmp_path / "audit.jsonl"
        self.binding = Binding("t1", rules.compile_policy(pol), AuditLog(self.log), learn=learn)
        self.gate = Gate({REGULAR: self.binding, TRANSPARENT: self.binding})

    def records(self, event: str = "decision") -> list[Any]:
        return [r for r in read_records(self.log) if r["event"] == event]


def drive(world: World, body: Callable[[taddons.context], Awaitable[None]]) -> None:
    async def main() -> None:
        with taddons.context(world.gate, loadcore=False) as tctx:  # type: ignore[no-untyped-call]  # mitmproxy
            await body(tctx)

    asyncio.run(main())


def connect_flow(host: str, port: int) -> http.HTTPFlow:
    req = tutils.treq(method=b"CONNECT", host=host, port=port, authority=f"{host}:{port}".encode(), path=b"")
    return tflow.tflow(client_conn=client(f"regular@127.0.0.1:{REGULAR}"), req=req)


async def server_connect(tctx: taddons.context, c: connection.Client, host: str, port: int) -> connection.Server:
    """What mitmproxy asks the Gate before any upstream connection; returns the server as the Gate left it."""
    server = connection.Server(address=(host, port))
    (gate,) = tctx.master.addons.chain
    hook = server_hooks.ServerConnectHook(server_hooks.ServerConnectionHookData(server=server, client=c))
    await tctx.master.addons.invoke_addon(gate, hook)
    return server


# ---- CONNECT (explicit proxy) -------------------------------------------------------------------


def test_an_allowed_connect_is_pinned_to_the_checked_address(tmp_path: Path, upstream: FakeDns) -> None:
    w = World(tmp_path, upstream)
    flow = connect_flow("Allowed.Test", 443)

    async def body(tctx: taddons.context) -> None:
        await tctx.master.addons.invoke_addon(w.gate, HttpConnectHook(flow))
        assert flow.response is None  # mitmproxy answers 200 and opens the tunnel
        server = await server_connect(tctx, flow.client_conn, "allowed.test", 443)
        assert server.address == ("192.0.2.1", 443) and server.error is None

    drive(w, body)
    (rec,) = w.records()  # the server connection reused the decision: one record
    assert (rec["kind"], rec["action"], rec["host"], rec["port"], rec["ip"]) == (
        "connect",
        "allow",
        "allowed.test",
        443,
        "192.0.2.1",
    )
    assert rec["rule"] == "p.yaml" and rec["would"] is None


def test_a_blocked_connect_gets_a_403_that_says_why(tmp_path: Path, upstream: FakeDns) -> None:
    w = World(tmp_path, upstream)
    flows = [connect_flow("pypi.org", 443), connect_flow("evil.allowed.test", 443)]

    async def body(tctx: taddons.context) -> None:
        for flow in flows:
            await tctx.master.addons.invoke_addon(w.gate, HttpConnectHook(flow))

    drive(w, body)
    for flow, text in zip(
        flows,
        [
            "sandgate: blocked pypi.org:443: no allow rule matches\n",
            "sandgate: blocked evil.allowed.test:443: denied by rule evil.allowed.test [p.yaml]\n",
        ],
        strict=True,
    ):
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.response.get_text() == text
        assert flow.response.headers["Connection"] == "close" and flow.response.headers["X-Sandgate"] == "blocked"
    assert [(r["action"], r["host"], r["ip"]) for r in w.records()] == [
        ("deny", "pypi.org", None),
        ("deny", "evil.allowed.test", None),
    ]
    assert upstream.queries == []  # a denied name is never looked up


def test_an_allowed_name_that_resolves_to_loopback_is_refused(tmp_path: Path, upstream: FakeDns) -> None:
    w = World(tmp_path, upstream)
    flow = connect_flow("rebind.test", 443)

    async def body(tctx: taddons.context) -> None:
        await tctx.master.addons.invoke_addon(w.gate, HttpConnectHook(flow))

    drive(w, body)
    assert flow.response is not None and flow.response.status_code == 403
    assert "rebind.test:443: resolved to loopback address 127.0.0.1" in (flow.response.get_text() or "")
    (rec,) = w.records()
    assert rec["action"] == "deny" and rec["ip"] is None


def test_learn_mode_lets_a_default_deny_pass_and_says_what_it_would_have_done(
    tmp_path: Path, upstream: FakeDns
) -> None:
    w = World(tmp_path, upstream, learn=True)
    flows = [connect_flow("pypi.org", 443), connect_flow("evil.allowed.test", 443)]

    async def body(tctx: taddons.context) -> None:
        for flow in flows:
            await tctx.master.addons.invoke_addon(w.gate, HttpConnectHook(flow))

    drive(w, body)
    assert flows[0].response is None
    assert flows[1].response is not None and flows[1].response.status_code == 403  # an explicit deny holds
    learned, denied = w.records()
    assert (learned["action"], learned["would"], learned["ip"]) == ("allow", "deny", "192.0.2.1")
    assert learned["reason"] == "learn mode: no allow rule matches"
    assert (denied["action"], denied["would"]) == ("deny", None)


# ---- transparent: HTTP Host header, TLS SNI, raw TCP --------------------------------------------


def test_transparent_http_is_decided_by_the_host_header_not_the_original_address(
    tmp_path: Path, upstream: FakeDns
) -> None:
    w = World(tmp_path, upstream)
    c = client(f"transparent@127.0.0.1:{TRANSPARENT}")
    ok = tflow.tflow(client_conn=c, req=tutils.treq(host="198.51.100.9", port=80, authority=b""))
    ok.request.headers["Host"] = "Allowed.TEST:80"
    blocked = tflow.tflow(client_conn=c, req=tutils.treq(host="198.51.100.9", port=80, authority=b""))
    blocked.request.headers["Host"] = "[2001:db8::1]:80"  # an address: only a cidr rule could allow it

    async def body(tctx: taddons.context) -> None:
        await tctx.master.addons.invoke_addon(w.gate, HttpRequestHeadersHook(ok))
        await tctx.master.addons.invoke_addon(w.gate, HttpRequestHeadersHook(blocked))
        server = await server_connect(tctx, c, ok.request.host, 80)
        assert server.address == ("192.0.2.1", 80)

    drive(w, body)
    assert ok.request.host == "allowed.test" and ok.response is None
    assert blocked.request.host == "2001:db8::1" and blocked.response is not None
    assert blocked.response.get_text() == "sandgate: blocked 2001:db8::1:80: IP address not in any allowed cidr\n"
    allowed, denied = w.records()
    assert (allowed["kind"], allowed["host"], allowed["method"], allowed["ip"]) == (
        "http",
        "allowed.test",
        "GET",
        "192.0.2.1",
    )
    assert allowed["url"] == "http://allowed.test/path"
    assert (denied["kind"], denied["action"]) == ("http", "deny")


def test_tls_is_decided_by_sni_and_relayed_untouched(tmp_path: Path, upstream: FakeDns) -> None:
    w = World(tmp_path, upstream)
    c = client(f"transparent@127.0.0.1:{TRANSPARENT}")
    blocked_c = client(f"transparent@127.0.0.1:{TRANSPARENT}")

    async def body(tctx: taddons.context) -> None:
        for cl in (c, blocked_c):
            await tctx.master.addons.invoke_addon(w.gate, server_hooks.ClientConnectedHook(cl))
        nl, ctx = next_layer(tctx, c, ("198.51.100.9", 443), client_hello("allowed.test"))
        await tctx.master.addons.invoke_addon(w.gate, layer.NextLayerHook(nl))
        assert isinstance(nl.layer, layers.Relay)  # never a TLS layer: no interception
        assert ctx.server.address == ("allowed.test", 443)  # re-targeted to the name
        server = await server_connect(tctx, c, "allowed.test", 443)
        assert server.address == ("192.0.2.1", 443)
        nl, ctx = next_layer(tctx, blocked_c, ("192.0.2.1", 443), client_hello("pypi.org"))
        await tctx.master.addons.invoke_addon(w.gate, layer.NextLayerHook(nl))
        server = await server_connect(tctx, blocked_c, *ctx.server.address)  # type: ignore[misc]
        assert server.error == "sandgate: no allow rule matches"

    drive(w, body)
    assert [(r["kind"], r["action"], r["host"]) for r in w.records()] == [
        ("tls", "allow", "allowed.test"),
        ("tls", "deny", "pypi.org"),
    ]


def test_transparent_detection_waits_for_a_name_unless_a_cidr_allows_the_address(
    tmp_path: Path, upstream: FakeDns
) -> None:
    w = World(tmp_path, upstream)
    c = client(f"transparent@127.0.0.1:{TRANSPARENT}")

    async def body(tctx: taddons.context) -> None:
        nl, _ = next_layer(tctx, c, ("198.51.100.9", 443), b"")
        await tctx.master.addons.invoke_addon(w.gate, layer.NextLayerHook(nl))
        assert nl.layer is None  # no bytes yet: wait for the SNI or Host header
        nl, _ = next_layer(tctx, c, ("203.0.113.5", 5432), b"")
        await tctx.master.addons.invoke_addon(w.gate, layer.NextLayerHook(nl))
        assert isinstance(nl.layer, layers.Relay)  # server-speaks-first protocols must not wait
        nl, _ = next_layer(tctx, c, ("198.51.100.9", 80), b"GET / HTTP/1.1\r\n")
        await tctx.master.addons.invoke_addon(w.gate, layer.NextLayerHook(nl))
        assert type(nl.layer).__name__ == "HttpLayer"

    drive(w, body)
    assert w.records() == []  # detection decides nothing by itself


def test_one_record_per_decision(tmp_path: Path, upstream: FakeDns) -> None:
    """A decision is written once; reusing it for the upstream connection writes nothing more."""
    w = World(tmp_path, upstream)
    flows = [connect_flow("allowed.test", 443), connect_flow("allowed.test", 443), connect_flow("pypi.org", 443)]

    async def body(tctx: taddons.context) -> None:
        for flow in flows:
            await tctx.master.addons.invoke_addon(w.gate, HttpConnectHook(flow))
            if flow.response is None:  # mitmproxy connects upstream only for an open tunnel
                await server_connect(tctx, flow.client_conn, flow.request.host, 443)

    drive(w, body)
    recs = w.records()
    assert [(r["action"], r["host"]) for r in recs] == [("allow", "allowed.test")] * 2 + [("deny", "pypi.org")]
    assert len({r["id"] for r in recs}) == 3


def test_a_listener_without_a_binding_is_refused(tmp_path: Path, upstream: FakeDns) -> None:
    w = World(tmp_path, upstream)
    c = client("regular@127.0.0.1:9999")

    async def body(tctx: taddons.context) -> None:
        await tctx.master.addons.invoke_addon(w.gate, server_hooks.ClientConnectedHook(c))
        server = await server_connect(tctx, c, "allowed.test", 443)
        assert server.error == "sandgate: no policy"

    drive(w, body)
    assert c.error == "sandgate: no policy for this listener" and w.records() == []
