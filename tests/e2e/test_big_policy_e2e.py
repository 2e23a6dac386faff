"""Policies of 10^5 names run: a `hosts_file:` allow list and deny list, and a 10,000-entry `allow:` list.

The spec of such a policy is megabytes: it reaches the daemon in a sealed memfd (netguard.daemon.specfd),
not in one control message. Each test shows a listed name reachable (its fake server saw the request)
and an unlisted or denied one refused (its server saw nothing), in the same run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from netguard.audit import read_records

from ..support.runner import Sandgate, write_policy
from ..support.world import Server, World, new_world

LISTED, DENIED, UNLISTED = "198.51.100.10", "198.51.100.20", "198.51.100.30"
NAMES = 100_000


@dataclass
class Env:
    world: World
    servers: dict[str, Server]

    def seen(self) -> dict[str, int]:
        return {k: len(v.log_records()) for k, v in self.servers.items()}


@pytest.fixture(scope="module")
def e() -> Iterator[Env]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        servers = {}
        for name, ip in (("listed", LISTED), ("denied", DENIED), ("unlisted", UNLISTED)):
            w.add_host(f"{name}.test", ip)
            servers[name] = w.serve("https", ip, 443, f"{name}.test")
        yield Env(w, servers)


def curl_all(e: Env, *names: str) -> list[str]:
    """One shell in the sandbox fetching each name; prints NAME=HTTP_CODE lines."""
    fetch = [
        f"echo {n}=$(curl -sS -m 10 --cacert {e.world.ca_pem} -o /dev/null -w '%{{http_code}}' https://{n}.test/)"
        for n in names
    ]
    return ["sh", "-c", " ; ".join(fetch)]


def codes(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def test_a_100000_name_hosts_file_allows_what_it_lists_and_a_deny_file_wins(e: Env) -> None:
    names = [f"h{i}.bulk{i % 211}.example" for i in range(NAMES - 2)]
    allow = e.world.tmp / "corp-allow.txt"
    allow.write_text(
        "# corporate allowlist\n" + "\n".join([*names[:50_000], "listed.test", "denied.test", *names[50_000:]]) + "\n"
    )
    deny = e.world.tmp / "threat-feed.txt"
    deny.write_text("# feed\ndenied.test\n*.bad.example\n")
    policy = write_policy(
        e.world,
        "version: 1\nnetwork:\n  allow:\n    - hosts_file: corp-allow.txt\n      ports: [443]\n"
        "  deny:\n    - hosts_file: threat-feed.txt\n",
        "big",
    )
    audit = e.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"
    before = e.seen()
    r = Sandgate(e.world, policy=policy, cwd=e.world.tmp).run(
        cmd=curl_all(e, "listed", "denied", "unlisted"), audit=audit, timeout=60
    )
    assert r.returncode == 0, r.stderr
    got = codes(r.stdout)
    assert got["listed"] == "200", (got, r.stderr)
    assert got["denied"] != "200" and got["unlisted"] != "200", got
    after = e.seen()
    assert after["listed"] > before["listed"]
    assert after["denied"] == before["denied"] and after["unlisted"] == before["unlisted"]
    decisions = {(x["host"], x["action"]): x for x in read_records(audit) if x["event"] == "decision"}
    # Each record points at the exact line of the list that decided: line 1 is a comment in both files.
    assert decisions[("listed.test", "allow")]["rule"] == f"{allow}:50002"
    assert decisions[("denied.test", "deny")]["rule"] == f"{deny}:2"
    assert decisions[("unlisted.test", "deny")]["rule"] is None


def test_a_10000_entry_allow_list_binds(e: Env) -> None:
    hosts = "".join(f"    - host: h{i}.plain.example\n" for i in range(10_000 - 1))
    policy = write_policy(e.world, "version: 1\nnetwork:\n  allow:\n" + hosts + "    - host: listed.test\n", "plain")
    before = e.seen()
    r = Sandgate(e.world, policy=policy, cwd=e.world.tmp).run(cmd=curl_all(e, "listed", "unlisted"), timeout=60)
    assert r.returncode == 0, r.stderr
    got = codes(r.stdout)
    assert got["listed"] == "200" and got["unlisted"] != "200", (got, r.stderr)
    after = e.seen()
    assert after["listed"] > before["listed"] and after["unlisted"] == before["unlisted"]


def test_a_bad_line_of_a_hosts_file_is_one_error_naming_that_line(e: Env) -> None:
    listed = e.world.tmp / "typo.txt"
    listed.write_text("ok.example\n\n# fine\nnot a name\n")
    policy = write_policy(e.world, "version: 1\nnetwork:\n  allow:\n    - hosts_file: typo.txt\n", "typo")
    r = Sandgate(e.world, policy=policy, cwd=e.world.tmp).run(cmd=["true"], timeout=30)
    assert r.returncode == 125
    assert r.stderr.startswith(f"sandgate: error: {listed}:4: two words on one line;"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and "not a name" not in r.stderr  # the file is never quoted
    missing = write_policy(e.world, "version: 1\nnetwork:\n  deny:\n    - hosts_file: nowhere.txt\n", "missing")
    r = Sandgate(e.world, policy=missing, cwd=e.world.tmp).run(cmd=["true"], timeout=30)
    assert r.returncode == 125 and r.stderr.startswith(f"sandgate: error: {missing}:4: hosts_file 'nowhere.txt'")
