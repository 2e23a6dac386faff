"""Pure halves of the kernel layer: the in-namespace nftables ruleset, set parsing, the audit schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netguard import audit, nft

PORTS = nft.Ports(3128, 3129, 53)


def _chain(text: str, name: str) -> list[str]:
    body = text.split(f"chain {name} {{")[1].split("\n  }")[0]
    return [x.strip() for x in body.strip().splitlines() if x.strip()]


def test_ruleset_is_one_table_inside_the_sandbox_with_no_interface_names() -> None:
    text = nft.build_ruleset(PORTS)
    assert text.startswith("table inet sandgate {")
    # Inside the sandbox's own namespace there is nothing to tell apart: no iifname/oifname matches.
    assert "iifname" not in text and "oifname" not in text
    assert text.count("chain ") == 2


def test_steering_order_dns_first_then_loopback_then_every_tcp() -> None:
    steer = _chain(nft.build_ruleset(PORTS), "steer")
    assert steer[0].startswith("type nat hook output")
    rules = steer[1:]
    assert rules[0].endswith("th dport 53 redirect to :53")  # even 127.0.0.53: the only resolver is ours
    assert rules[1] == "ip daddr 127.0.0.0/8 accept"  # a test suite's own local servers stay local
    assert rules[2] == "meta l4proto tcp redirect to :3129"  # every other TCP, any address or port


def test_everything_not_steered_is_counted_and_dropped() -> None:
    guard = _chain(nft.build_ruleset(PORTS), "guard")
    assert guard[1] == "ct state established,related accept" and guard[2] == "ip daddr 127.0.0.0/8 accept"
    drops = guard[3:]
    assert drops[0].startswith("meta nfproto ipv6") and all(r.endswith("drop") for r in drops)
    assert drops[-1] == "update @dropped4x { ip daddr . meta l4proto } drop"  # ICMP, SCTP, GRE...


def test_parse_set_elements() -> None:
    text = json.dumps(
        {
            "nftables": [
                {"metainfo": {}},
                {
                    "set": {
                        "name": "dropped4",
                        "elem": [
                            {
                                "elem": {
                                    "val": {"concat": ["198.51.100.60", "udp", 9999]},
                                    "counter": {"packets": 3, "bytes": 99},
                                }
                            },
                            {"concat": ["198.51.100.61", "udp", 53]},
                        ],
                    }
                },
            ]
        }
    )
    assert nft.parse_set_elements(text) == [("198.51.100.60", "udp", 9999, 3), ("198.51.100.61", "udp", 53, 0)]


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


def test_weakening_switch_rejects_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.errors import RunError
    from launcher.run import options as run

    monkeypatch.setenv(run.WEAKEN_ENV, "firewall,landlock")
    with pytest.raises(RunError, match="unknown weakenings"):
        run.Weakenings.read()
    monkeypatch.setenv(run.WEAKEN_ENV, "git-hooks")
    assert run.Weakenings.read() == run.Weakenings(git_hooks=True)
    assert run.Weakenings.read().names() == ("git-hooks",)
    assert run.Weakenings.read({run.WEAKEN_ENV: "nested-userns,firewall"}).names() == ("firewall", "nested-userns")
    assert run.Weakenings.read({}) == run.Weakenings()  # a real run: no hole
