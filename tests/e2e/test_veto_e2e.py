"""Where an allowed name may not lead, and what a wildcard name may ask: the real proxy in a test World.

The proxy runs inside the World's namespace, so the World's addresses are "this host's own": a
canary on one of them (a sandbox link end, 198.18.k.1) stands for sshd or a database on the host.
Every refusal is shown by the proxy's evidence (403 and the audit record's reason) and by the
canary's (it saw nothing), and every canary is shown alive in the same run.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard import localaddrs, rules

from ..support.runner import REPO, Proxy, curl, write_policy
from ..support.world import Client, Server, World, new_world

ALLOWED, WILD, TXT = "198.51.100.10", "198.51.100.11", "198.51.100.12"
V6_DNS_PORT = 5354

POLICY = textwrap.dedent("""\
    version: 1
    network:
      allow:
        - allowed.test
        - own.test
        - late.test
        - "*.wild.test"
        - host: "*.txt.test"
          dns: [TXT]
      resolver: 198.51.100.53:53
    """)

V6_POLICY = textwrap.dedent(f"""\
    version: 1
    network:
      allow: [nat64.test, teredo.test, mapped.test, v4ok.test]
      resolver: 127.0.0.1:{V6_DNS_PORT}
    """)

# A resolver that can say AAAA (the World's canary DNS knows only A records); logs every query.
V6_DNS = textwrap.dedent("""\
    import json, socket, sys
    import dns.message, dns.rcode, dns.rdatatype, dns.rrset
    records, log = json.loads(sys.argv[2]), open(sys.argv[3], "a", buffering=1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    print("ready", flush=True)
    while True:
        wire, peer = s.recvfrom(4096)
        q = dns.message.from_wire(wire)
        name, qtype = q.question[0].name.to_text(True).lower(), dns.rdatatype.to_text(q.question[0].rdtype)
        log.write(json.dumps({"qname": name, "qtype": qtype}) + "\\n")
        r = dns.message.make_response(q)
        if name not in records:
            r.set_rcode(dns.rcode.NXDOMAIN)
        elif records[name].get(qtype):
            r.answer.append(dns.rrset.from_text(q.question[0].name, 1, "IN", qtype, *records[name][qtype]))
        s.sendto(r.to_wire(), peer)
    """)
V6_RECORDS = {
    "nat64.test": {"AAAA": ["64:ff9b:1::1"]},
    "teredo.test": {"AAAA": ["2001::1"]},
    "mapped.test": {"AAAA": ["::ffff:127.0.0.1"]},
    "v4ok.test": {"A": [ALLOWED]},
}


@dataclass
class Net:
    world: World
    proxy: Proxy
    v6proxy: Proxy
    own_link: Client
    servers: dict[str, Server]
    v6_log: Path

    def untouched(self, server: str, mark: int) -> bool:
        return len(self.servers[server].log_records()) == mark

    def dns_seen(self, start: int = 0) -> list[tuple[str, str]]:
        assert self.world.dns is not None
        return [(x["qname"], x["qtype"]) for x in self.world.dns.log_records()[start:]]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        w.add_host("allowed.test", ALLOWED)
        w.add_host("a.wild.test", WILD)
        w.add_host("t.txt.test", TXT)
        link = w.sandbox("own")  # its world end, 198.18.1.1, is an address of the proxy's host
        w.add_host("own.test", link.world_ip)
        servers = {
            "allowed": w.serve("http", ALLOWED, 80, "allowed.test"),
            "own": w.serve("http", link.world_ip, 80, "own-canary"),
        }
        log = w.tmp / "v6-dns.jsonl"
        resolver = w.popen(
            [sys.executable, "-c", V6_DNS, str(V6_DNS_PORT), json.dumps(V6_RECORDS), str(log)],
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
        assert resolver.stdout is not None and resolver.stdout.readline().strip() == b"ready"
        proxy = Proxy(w, write_policy(w, POLICY), listen="127.0.0.1:3128", dns="127.0.0.1:5353")
        v6proxy = Proxy(w, write_policy(w, V6_POLICY, "v6"), listen="127.0.0.1:3130")
        try:
            yield Net(w, proxy, v6proxy, link, servers, log)
        finally:
            proxy.stop()
            v6proxy.stop()


# ---- the host's own addresses ------------------------------------------------------------------


def test_a_name_resolving_to_an_address_of_the_proxys_host_is_refused(net: Net) -> None:
    mark = len(net.servers["own"].log_records())
    r = curl(net.world, "http://own.test/", "-x", net.proxy.url)
    ip = net.own_link.world_ip
    assert r.status == 403 and f"resolved to this host's own address {ip}" in r.body, r
    rec = net.proxy.wait_record(lambda x: x["host"] == "own.test")
    assert (
        rec["action"] == "deny"
        and rec["ip"] is None
        and rec["reason"].startswith(f"resolved to this host's own address {ip}")
    )
    assert net.untouched("own", mark)
    # The canary is up (a direct request reaches it) and an ordinary allowed name still passes.
    assert curl(net.world, f"http://{ip}/").body == "hello from own-canary"
    assert curl(net.world, "http://allowed.test/", "-x", net.proxy.url).body == "hello from allowed.test"


def test_an_address_the_host_gains_later_is_refused_within_the_ttl(net: Net) -> None:
    late = net.world.sandbox("late")  # a new link end appears on the proxy's host after it started
    server = net.world.serve("http", late.world_ip, 80, "late-canary")
    net.world.add_host("late.test", late.world_ip)
    mark = len(server.log_records())
    time.sleep(localaddrs.TTL + 0.5)
    r = curl(net.world, "http://late.test/", "-x", net.proxy.url)
    assert r.status == 403 and f"resolved to this host's own address {late.world_ip}" in r.body, r
    assert len(server.log_records()) == mark
    assert curl(net.world, f"http://{late.world_ip}/").body == "hello from late-canary"


def test_read_local_lists_the_worlds_addresses_and_local_routes(net: Net) -> None:
    net.world.admin(["ip", "route", "add", "local", "192.0.2.0/28", "dev", "lo"])  # AnyIP, in the world only
    try:
        code = "from netguard import localaddrs\nprint(' '.join(map(str, localaddrs.read_local())))"
        out = net.world.run(
            [sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
        )
    finally:
        net.world.admin(["ip", "route", "del", "local", "192.0.2.0/28", "dev", "lo"])
    assert out.returncode == 0, out.stderr
    got = set(out.stdout.split())
    assert {f"{ALLOWED}/32", f"{net.own_link.world_ip}/32", "127.0.0.0/8", "192.0.2.0/28"} <= got, got


# ---- IPv6 special-purpose ranges: vetoed before any connection is tried ------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("nat64.test", "resolved to local-use NAT64 (embeds an IPv4 address) address 64:ff9b:1::1"),
        ("teredo.test", "resolved to Teredo (embeds an IPv4 address) address 2001::1"),
        ("mapped.test", "resolved to loopback address 127.0.0.1"),
    ],
)
def test_a_name_resolving_to_a_special_ipv6_range_is_refused(net: Net, name: str, reason: str) -> None:
    r = curl(net.world, f"http://{name}/", "-x", net.v6proxy.url)
    assert r.status == 403 and reason in r.body, r
    rec = net.v6proxy.wait_record(lambda x: x["host"] == name)
    assert rec["action"] == "deny" and rec["reason"].startswith(reason)  # the veto, not a connect failure
    seen = [json.loads(line) for line in net.v6_log.read_text().splitlines()]
    assert {"qname": name, "qtype": "AAAA"} in seen  # it was resolved, then refused


def test_the_ipv6_test_resolver_is_alive(net: Net) -> None:
    assert curl(net.world, "http://v4ok.test/", "-x", net.v6proxy.url).body == "hello from allowed.test"


# ---- DNS: what a wildcard name may ask --------------------------------------------------------------

DIG = textwrap.dedent("""\
    import sys, dns.message, dns.query, dns.rcode
    r = dns.query.udp(dns.message.make_query(sys.argv[1], sys.argv[2]), "127.0.0.1", port=5353, timeout=5)
    print(dns.rcode.to_text(r.rcode()), " ".join(rr.to_text() for a in r.answer for rr in a))""")


def dig(net: Net, name: str, qtype: str = "A") -> str:
    r = net.world.run([sys.executable, "-c", DIG, name, qtype], cwd=REPO)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_wildcard_names_txt_query_is_refused_and_never_sent_while_its_a_query_is_answered(net: Net) -> None:
    start = len(net.dns_seen())
    assert dig(net, "a.wild.test") == f"NOERROR {WILD}"
    secret = "c2VjcmV0LXRva2Vu"
    for name, qtype in (
        (f"{secret}.wild.test", "TXT"),
        ("a.wild.test", "TXT"),
        ("a.wild.test", "NULL"),
        ("a.wild.test", "MX"),
        ("a.wild.test", "ANY"),
    ):
        assert dig(net, name, qtype) == "REFUSED", (name, qtype)
    assert dig(net, "a.wild.test", "HTTPS") == "NOERROR"  # empty, answered here
    assert net.world.dns is not None
    net.world.dns.wait_for(lambda x: x["qname"] == "a.wild.test" and x["qtype"] == "A")
    seen = net.dns_seen(start)
    assert ("a.wild.test", "A") in seen
    assert [q for q in seen if q[1] != "A"] == [], seen  # no TXT, NULL, MX, ANY or HTTPS reached the resolver
    denied = [x for x in net.proxy.records() if x["kind"] == "dns" and x["action"] == "deny"]
    assert {(x["host"], x["qtype"]) for x in denied} >= {(f"{secret.lower()}.wild.test", "TXT"), ("a.wild.test", "ANY")}
    assert all("allowed only by a wildcard rule" in x["reason"] for x in denied)


def test_a_dns_list_on_the_wildcard_entry_lets_txt_through(net: Net) -> None:
    start = len(net.dns_seen())
    assert dig(net, "t.txt.test", "TXT") == 'NOERROR "canary"'
    assert dig(net, "t.txt.test", "NULL") == "REFUSED"  # only what the entry lists
    assert dig(net, "allowed.test", "TXT") == 'NOERROR "canary"'  # exact names keep every type
    assert net.world.dns is not None
    net.world.dns.wait_for(lambda x: x["qname"] == "allowed.test" and x["qtype"] == "TXT")
    seen = net.dns_seen(start)
    assert ("t.txt.test", "TXT") in seen and ("t.txt.test", "NULL") not in seen


# ---- localaddrs on the host running the tests --------------------------------------------------------


def test_read_local_agrees_with_ip_addr() -> None:
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True)
    expected = {
        ipaddress.ip_network(a["local"].split("%")[0])
        for link in json.loads(out.stdout)
        for a in link.get("addr_info", [])
    }
    got = set(localaddrs.read_local())
    assert expected <= got, expected - got
    assert ipaddress.ip_network("127.0.0.0/8") in got  # the local route for all of loopback


def test_local_addrs_are_re_read_at_most_once_per_ttl_and_kept_on_failure() -> None:
    now = [100.0]
    reads: list[int] = []
    answer: list[Any] = [[ipaddress.ip_network("8.8.4.4/32")]]

    def reader() -> list[Any]:
        reads.append(1)
        if isinstance(answer[0], OSError):
            raise answer[0]
        return list(answer[0])

    cache = localaddrs.LocalAddrs(ttl=2.0, reader=reader, clock=lambda: now[0])
    ip = ipaddress.ip_address
    assert len(reads) == 1 and cache.table().lookup(ip("8.8.4.4")) == rules.OWN_REASON
    for _ in range(1000):
        cache.table()
    assert len(reads) == 1  # not per connection
    answer[0] = [ipaddress.ip_network("8.8.4.5/32")]
    now[0] += 2.0
    assert cache.table().lookup(ip("8.8.4.5")) == rules.OWN_REASON and cache.table().lookup(ip("8.8.4.4")) is None
    assert len(reads) == 2
    answer[0] = OSError("netlink gone")
    now[0] += 5.0
    assert cache.table().lookup(ip("8.8.4.5")) == rules.OWN_REASON  # the last good table stays
    cache.table()
    assert len(reads) == 3  # and a failed read is not retried per connection either
