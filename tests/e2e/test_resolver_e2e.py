"""The daemon's one resolver, end to end (issue 23): `sandgate run` in a test World whose policy names a
fake resolver (tests.support.dnsfake, run inside the World on its loopback) that logs every query it gets.

- A resolver that answers after 5.3 s (glibc's retry is 5 s; the daemon used to give up at 5 s and
  refuse the host) still serves the allowed host, by name lookup inside the sandbox and through the
  proxy variables alike.
- 40 connections at once to one name cost one A and one AAAA query upstream (they used to cost 80+).
- A refusal says whether the name does not exist or the resolver failed, in the 403 and the exit line;
  a permitted request in the same run shows the path works.
"""

from __future__ import annotations

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

from netguard.audit import read_records

from ..support.runner import REPO, Sandgate, write_policy
from ..support.world import Server, World, new_world

WEB = "198.51.100.10"  # every name the fake resolver knows leads here
SLOW = 5.3  # seconds: longer than glibc's 5-s retry timer

POLICY = """\
version: 1
network:
  allow: [slow1.test, slow2.test, many.test, nx.test, servfail.test]
  resolver: 127.0.0.1:{port}
"""

# 40 connections at once in one sandbox: half through the proxy variables (the daemon resolves),
# half by name lookup inside the sandbox (its DNS server asks, then the redirected connection is decided).
MANY = textwrap.dedent("""\
    import concurrent.futures, json, socket, urllib.request
    def via_proxy(_):
        return urllib.request.urlopen("http://many.test/", timeout=30).read().decode()
    def direct(_):
        ip = socket.getaddrinfo("many.test", 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        with socket.create_connection((ip, 80), timeout=30) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\nHost: many.test\\r\\n\\r\\n")
            return s.makefile("rb").read().decode().split("\\r\\n\\r\\n", 1)[1]
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        got = list(pool.map(via_proxy, range(20))) + list(pool.map(direct, range(20)))
    print(json.dumps(got))
    """)


@dataclass
class Env:
    world: World
    web: Server
    dns_log: Path
    sg: Sandgate

    def asked(self, name: str, qtype: str | None = None) -> list[dict[str, Any]]:
        """What the fake resolver was asked for `name` (each copy of a resent query is one)."""
        if not self.dns_log.exists():
            return []
        lines = [json.loads(x) for x in self.dns_log.read_text().splitlines() if x.endswith("}")]
        return [x for x in lines if x["qname"] == name and (qtype is None or x["qtype"] == qtype)]

    def run(self, *cmd: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
        audit = self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"
        r = self.sg.run("--", *cmd, audit=audit, timeout=timeout)
        recs = [x for x in read_records(audit) if x["event"] == "decision"]
        return r, recs


@pytest.fixture(scope="module")
def e() -> Iterator[Env]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        web = w.serve("http", WEB, 80, "web")
        log = w.tmp / "fake-dns.jsonl"
        argv = [sys.executable, "-m", "tests.support.dnsfake", "--answer", WEB, "--log", str(log), "--slow", str(SLOW)]
        fake = w.popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert fake.stdout is not None
            ready = fake.stdout.readline().split()
            assert ready[:1] == ["ready"], ready
            policy = write_policy(w, POLICY.format(port=ready[1]))
            yield Env(w, web, log, Sandgate(w, policy=policy, cwd=w.tmp))
        finally:
            fake.kill()  # by its PID: we started it
            fake.wait()


def test_an_allowed_host_behind_a_resolver_that_answers_after_5_3_s_is_served(e: Env) -> None:
    before = len(e.web.log_records("http"))
    curl = "curl -sS -m 40 --retry 0"
    t0 = time.monotonic()
    r, recs = e.run(
        "sh",
        "-c",
        f'{curl} --noproxy "*" http://slow1.test/ & {curl} http://slow2.test/; wait',
    )
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("hello from web") == 2, (r.stdout, r.stderr)
    assert sorted(x["host"] for x in e.web.log_records("http")[before:]) == ["slow1.test", "slow2.test"]
    assert took >= SLOW  # the lookups really waited for the slow answers (nothing was cached before)
    assert e.asked("slow1.test", "A") and e.asked("slow2.test", "A")
    allowed = {(x["host"], x["kind"]) for x in recs if x["action"] == "allow"}
    assert {("slow1.test", "dns"), ("slow1.test", "http"), ("slow2.test", "http")} <= allowed, recs
    assert not [x for x in recs if x["action"] == "deny"], recs


def test_forty_connections_to_one_name_cost_a_handful_of_queries(e: Env) -> None:
    script = e.world.tmp / "many.py"
    script.write_text(MANY)
    r, recs = e.run(sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == ["hello from web\n"] * 40
    conns = [x for x in recs if x["host"] == "many.test" and x["kind"] != "dns"]
    assert len(conns) == 40 and all(x["action"] == "allow" and x["ip"] == WEB for x in conns)
    a, aaaa = len(e.asked("many.test", "A")), len(e.asked("many.test", "AAAA"))
    assert 1 <= a <= 2 and aaaa <= 2, (a, aaaa)  # without the shared cache: 120 (40 x A+AAAA, and 20 lookups)


def test_a_refusal_tells_a_name_that_does_not_exist_from_a_resolver_that_failed(e: Env) -> None:
    before = len(e.web.log_records("http"))
    curl = "curl -sS -m 20 -w ' %{http_code}\\n'"
    r, recs = e.run("sh", "-c", f"{curl} http://nx.test/; {curl} http://servfail.test/; {curl} http://many.test/")
    out = r.stdout
    assert "sandgate: blocked nx.test:80: cannot resolve nx.test: no such name (NXDOMAIN)" in out, out
    assert "sandgate: blocked servfail.test:80: cannot resolve servfail.test: the resolver failed (SERVFAIL)" in out
    assert out.count(" 403\n") == 2 and "hello from web\n 200" in out  # the permitted one, same run
    assert [x["host"] for x in e.web.log_records("http")[before:]] == ["many.test"]  # only the permitted one came
    reasons = {x["host"]: x["reason"] for x in recs if x["action"] == "deny"}
    assert reasons == {
        "nx.test": "cannot resolve nx.test: no such name (NXDOMAIN)",
        "servfail.test": "cannot resolve servfail.test: the resolver failed (SERVFAIL)",
    }
    assert "sandgate: denied nx.test:80: does not resolve" in r.stderr, r.stderr
    assert (
        "sandgate: denied servfail.test:80: the resolver failed (SERVFAIL) (a lookup failure, not the policy: try again)"
    ) in r.stderr
