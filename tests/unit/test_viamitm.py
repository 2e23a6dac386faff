"""netguard.decision.viamitm: mitmproxy's CONNECT to a run's corporate proxy names the checked address, carries the
credentials, goes only to the run's own proxy, and a refusal is one record (the e2e tests drive the real layers)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from mitmproxy import connection, http
from mitmproxy.test import tflow

from netguard import rules
from netguard.audit import AuditLog
from netguard.decision import viamitm
from netguard.decision.binding import Binding
from netguard.decision.decide import Decided
from netguard.policy import NetworkPolicy
from netguard.upstreamproxy import Proxy, Upstream
from netguard.verdict import Verdict

PROXY = Proxy("10.0.0.8", 3128, "u:pw")


def _binding(tmp_path: Path, by_name: bool = False) -> Binding:
    up = Upstream(PROXY, PROXY, "direct.test", by_name)
    return Binding("t1", rules.compile_policy(NetworkPolicy()), AuditLog(tmp_path / "a.jsonl"), upstream_proxy=up)


def _decided(host: str = "a.test", ip: str = "198.51.100.7") -> Decided:
    return Decided("id1", host, 443, Verdict(rules.Decision("allow", "p.yaml:3", "allowed"), ip=ip))


def _connect_flow(tunnel: connection.Server) -> http.HTTPFlow:
    """The CONNECT flow mitmproxy builds for a tunnel: to the *name*, as the request was addressed."""
    f = tflow.tflow()
    f.server_conn = tunnel
    f.request.method, f.request.host, f.request.port = "CONNECT", "a.test", 443
    f.request.authority = "a.test:443"
    f.request.headers.clear()
    f.request.headers["Host"] = "a.test:443"
    return f


def test_the_connect_names_the_checked_address_and_carries_the_credentials(tmp_path: Path) -> None:
    tunnel = connection.Server(address=("10.0.0.8", 3128))
    assert viamitm.opened(_binding(tmp_path), _decided(), "tls", tunnel) is None
    f = _connect_flow(tunnel)
    viamitm.connect_upstream(f)
    assert (f.request.authority, f.request.host, f.request.port) == ("198.51.100.7:443", "198.51.100.7", 443)
    assert f.request.headers["host"] == "198.51.100.7:443"
    assert f.request.headers["proxy-authorization"] == "Basic " + base64.b64encode(b"u:pw").decode()


def test_by_name_the_connect_names_the_host(tmp_path: Path) -> None:
    tunnel = connection.Server(address=("10.0.0.8", 3128))
    assert viamitm.opened(_binding(tmp_path, by_name=True), _decided(), "tls", tunnel) is None
    f = _connect_flow(tunnel)
    viamitm.connect_upstream(f)
    assert f.request.authority == "a.test:443"


def test_an_unjudged_tunnel_asks_for_nowhere_and_sends_no_credentials() -> None:
    f = _connect_flow(connection.Server(address=("10.0.0.8", 3128)))
    viamitm.connect_upstream(f)
    assert f.request.authority == viamitm.UNREACHABLE and "proxy-authorization" not in f.request.headers


def test_a_tunnel_goes_only_to_the_runs_own_proxy(tmp_path: Path) -> None:
    b = _binding(tmp_path)
    elsewhere = connection.Server(address=("10.0.0.9", 3128))
    assert viamitm.opened(b, _decided(), "tls", elsewhere) is not None
    direct = connection.Server(address=("10.0.0.8", 3128))
    assert viamitm.opened(b, _decided("direct.test"), "tls", direct) is not None  # NO_PROXY: never tunnelled


def test_a_refused_tunnel_is_one_record_without_the_credentials(tmp_path: Path) -> None:
    b = _binding(tmp_path)
    tunnel = connection.Server(address=("10.0.0.8", 3128))
    assert viamitm.opened(b, _decided(), "connect", tunnel) is None
    viamitm.failed(tunnel, "Upstream proxy 10.0.0.8:3128 refused HTTP CONNECT request: 407 Proxy Auth Required")
    viamitm.failed(tunnel, "again")  # once per tunnel
    b.audit.close()
    [rec] = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert (rec["event"], rec["kind"], rec["action"], rec["method"], rec["path"], rec["status"]) == (
        "request", "connect", "allow", "CONNECT", "198.51.100.7:443", None
    )  # fmt: skip
    assert rec["reason"] == (
        "failed: upstream proxy http://10.0.0.8:3128 did not tunnel CONNECT 198.51.100.7:443: 407 Proxy Auth Required"
    )
    assert "pw" not in json.dumps(rec) and rec["id"] == "id1" and rec["rule"] == "p.yaml:3"


def test_route_sets_via_or_replaces_an_open_connection() -> None:
    f = tflow.tflow()
    f.server_conn = connection.Server(address=("a.test", 443))
    viamitm.route(f, PROXY)
    assert f.server_conn.via == ("http", ("10.0.0.8", 3128))
    opened = connection.Server(address=("a.test", 443))
    opened.state = connection.ConnectionState.OPEN
    f.server_conn = opened
    viamitm.route(f, PROXY)
    assert f.server_conn is not opened and f.server_conn.via == ("http", ("10.0.0.8", 3128))
    viamitm.route(f, PROXY)  # the same route: nothing changes
    assert f.server_conn.via == ("http", ("10.0.0.8", 3128))
    f.server_conn = connection.Server(address=("a.test", 443))
    viamitm.route(f, None)
    assert f.server_conn.via is None
