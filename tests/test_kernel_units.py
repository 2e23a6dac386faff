"""Pure halves of the kernel layer: the nftables ruleset text, set parsing, subnet choice, audit schema."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard import audit, netns, nft

NET = nft.SandboxNet("0123abcd", "sg0123abcdh", "10.237.0.1", 3128, 3129, 53)


def test_ruleset_only_matches_our_interface_and_has_no_accept_for_forwarding() -> None:
    text = nft.build_ruleset(NET)
    assert text.startswith("table inet sandgate_0123abcd {")
    rules = [line.strip() for line in text.splitlines() if line.strip().startswith(("iifname", "oifname"))]
    assert rules and all('"sg0123abcdh"' in r for r in rules)
    forward = text.split("chain nofwd")[1]
    assert "accept" not in forward.split("policy accept;")[1]
    # The gateway's services: only the three listeners are accepted on input.
    guard = text.split("chain guard")[1].split("chain nofwd")[0]
    accepts = [r for r in guard.splitlines() if r.strip().endswith("accept") and "policy" not in r]
    assert len(accepts) == 2 and all("ip daddr 10.237.0.1" in r for r in accepts)
    assert "tcp dport { 3128, 3129, 53 }" in accepts[0] and "udp dport 53" in accepts[1]
    assert guard.strip().splitlines()[-2].strip() == 'iifname "sg0123abcdh" drop'


def test_ipv6_and_non_tcp_non_dns_are_dropped_before_nat() -> None:
    early = nft.build_ruleset(NET).split("chain early")[1].split("chain steer")[0]
    lines = [x.strip() for x in early.strip().splitlines()[2:-1]]
    assert lines[0].startswith('iifname "sg0123abcdh" meta nfproto ipv6') and lines[0].endswith("drop")
    assert lines[-1].endswith("drop") and "update @dropped4x" in lines[-1]


def test_remove_refuses_foreign_tables() -> None:
    with pytest.raises(ValueError):
        nft.remove("filter")


def test_parse_set_elements() -> None:
    text = json.dumps({"nftables": [{"metainfo": {}}, {"set": {"name": "dropped4", "elem": [
        {"elem": {"val": {"concat": ["198.51.100.60", "udp", 9999]}, "counter": {"packets": 3, "bytes": 99}}},
        {"concat": ["198.51.100.61", "udp", 53]}]}}]})
    assert nft.parse_set_elements(text) == [("198.51.100.60", "udp", 9999, 3), ("198.51.100.61", "udp", 53, 0)]


def test_pick_subnet_avoids_every_taken_range() -> None:
    pool = ipaddress.ip_network("10.237.0.0/16")
    taken = [ipaddress.ip_network("10.237.0.0/30"), ipaddress.ip_network("10.237.0.4/31"),
             ipaddress.ip_network("10.0.0.0/8")]
    with pytest.raises(netns.NetnsError, match="no free /30"):
        netns.pick_subnet(pool, taken)
    assert netns.pick_subnet(pool, taken[:2]) == ipaddress.ip_network("10.237.0.8/30")


@given(st.lists(st.integers(0, 2**14 - 1), max_size=50))
def test_pick_subnet_never_overlaps(used: list[int]) -> None:
    pool = ipaddress.ip_network("10.237.0.0/16")
    taken = [ipaddress.ip_network((int(pool.network_address) + 4 * u, 30)) for u in used]
    got = netns.pick_subnet(pool, taken)
    assert got.subnet_of(pool) and not any(got.overlaps(t) for t in taken)


def test_audit_records_follow_the_schema(tmp_path: Path) -> None:
    log = audit.AuditLog(tmp_path / "a.jsonl")
    log.write(audit.decision_record("t", "i1", "dns", "deny", "x.test", None, qtype="TXT", reason="no"))
    log.write(audit.close_record("t", "i1", "connect", "x.test", 443, "198.51.100.1", 1, 2, 3))
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('{"truncated": ')  # a writer killed mid-line
    log.close()
    recs = audit.read_records(tmp_path / "a.jsonl")
    assert tuple(recs[0]) == audit.DECISION_FIELDS and tuple(recs[1]) == audit.CLOSE_FIELDS
    assert recs[0]["ts"].endswith("Z") and len(recs[0]["ts"]) == len("2026-11-29T09:48:43.080Z")
    assert log.counts == {"allow": 0, "deny": 1}
    assert (tmp_path / "a.jsonl").stat().st_mode & 0o777 == 0o644


def test_open_firewall_is_only_a_self_test_hole() -> None:
    closed, opened = nft.build_ruleset(NET), nft.build_ruleset(NET, open_firewall=True)
    def drops(text: str) -> list[str]:
        return [x for x in text.splitlines() if x.strip().endswith("drop")]
    assert len(drops(closed)) >= 6 and "redirect to :3129" in closed
    assert drops(opened) == [] and "redirect to :3129" not in opened
    assert "redirect to :53" in opened  # DNS still goes to sandgate


def test_weakening_switch_rejects_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher import run
    monkeypatch.setenv(run.WEAKEN_ENV, "firewall,landlock")
    with pytest.raises(run.RunError, match="unknown weakenings"):
        run.weakened()
    monkeypatch.setenv(run.WEAKEN_ENV, "git-hooks")
    assert run.weakened() == {"git-hooks"}
