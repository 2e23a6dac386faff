"""Audit records for the report tests: as schema-1 logs hold them, read as netguard.audit reads them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.config import bundled
from launcher.config import load as lpolicy
from netguard import audit, rules
from netguard import policy as netpolicy
from netguard.audit import Record
from sgbase.origin import Origin

TS = "2026-11-29T09:48:{:02d}.000Z"
_ids = iter(range(10**9))


def dec(
    task: str,
    host: str | None,
    port: int | None,
    action: str = "allow",
    *,
    kind: str = "connect",
    sec: int = 0,
    would: str | None = None,
    rule: str | None = "policy.yaml:3",
    id: str | None = None,
    proto: str | None = None,
    qtype: str | None = None,
) -> Record:
    """A decision record as a schema-1 log holds it (no `would` unless learn mode set it), read as netguard.audit reads it."""
    allowed_by_rule = action == "allow" and would is None
    r: dict[str, Any] = {
        "ts": TS.format(sec),
        "task": task,
        "event": "decision",
        "id": id or f"id{next(_ids)}",
        "kind": kind,
        "action": action,
        "host": host,
        "port": port,
        "ip": "198.51.100.7" if action == "allow" else None,
        "proto": proto,
        "method": None,
        "url": None,
        "qtype": qtype,
        "rule": rule if allowed_by_rule else None,
        "reason": "allowed by rule" if allowed_by_rule else "no allow rule matches",
    }
    if would is not None:
        r["would"] = would
    return audit.parse(r)


def close(task: str, id: str, host: str, port: int, up: int, down: int, sec: int = 1) -> Record:
    return audit.parse(
        {
            "ts": TS.format(sec),
            "task": task,
            "event": "close",
            "id": id,
            "kind": "connect",
            "host": host,
            "port": port,
            "ip": "198.51.100.7",
            "bytes_up": up,
            "bytes_down": down,
            "duration_ms": 12,
        }
    )


def write_log(path: Path, records: Sequence[Mapping[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def real_bundled(*names: str) -> dict[str, rules.Ruleset]:
    out = {}
    for n in names:
        path = bundled.bundled_path(n)
        assert path is not None
        sections = lpolicy.load_policy_file(path)
        out[n] = rules.compile_policy(netpolicy.merge([s.network for s in sections]))
    return out


def patterns(*pats: str) -> rules.Ruleset:
    """A bundled list of plain entries (`host`, `*.suffix`), as a list file would compile them: web ports."""
    return rules.compile_policy(
        netpolicy.NetworkPolicy(
            allow=tuple(
                netpolicy.parse_host_pattern(p, netpolicy.DEFAULT_ALLOW_PORTS, Origin("list"), None) for p in pats
            )
        )
    )


def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    run1: list[Mapping[str, Any]] = [
        {
            "ts": TS.format(0),
            "task": "run1",
            "event": "policy",
            "kind": "policy",
            "write": ["."],
            "private_tmp": True,
            "protect": [],
            "hidden": [],
            "env_dropped": [],
            "landlock_abi": 4,
            "warnings": [],
        },
        dec("run1", "pypi.org", None, kind="dns", sec=1, qtype="A"),
        dec("run1", "pypi.org", 443, sec=2, id="same-id"),
        dec("run1", "files.pythonhosted.org", 443, sec=3, id="f1"),
        close("run1", "same-id", "pypi.org", 443, 100, 2000, sec=4),
        close("run1", "f1", "files.pythonhosted.org", 443, 50, 70000, sec=5),
        dec("run1", "evil.test", 443, "deny", sec=6),
    ]
    run2 = [
        # The same decision id in another run must not steal run1's bytes.
        dec("run2", "pypi.org", 443, sec=10, id="same-id"),
        close("run2", "same-id", "pypi.org", 443, 1, 2, sec=11),
        dec("run2", "pypi.org", 443, sec=12, id="p2"),
        dec("run2", "new.example.com", 443, would="deny", sec=13, id="n1"),
        close("run2", "n1", "new.example.com", 443, 3, 4, sec=14),
        dec("run2", "evil.test", 443, "deny", sec=15),
        dec("run2", "evil.test", 443, "deny", sec=16),
        dec("run2", "9.9.9.9", 53, "deny", kind="packet", proto="udp", sec=17),
    ]
    return write_log(tmp_path / "a.jsonl", run1), write_log(tmp_path / "b.jsonl", run2)


def empty_policy(task: str, cwd: str | None, learn: bool | None) -> audit.PolicyRecord:
    """A run's first record with an empty boundary: where it ran (`cwd`) and whether it learned."""
    return audit.policy_record(
        task,
        write=[],
        private_tmp=True,
        protect=[],
        hidden=[],
        env_dropped=[],
        landlock_abi=0,
        warnings=[],
        cwd=cwd,
        learn=learn,
    )
