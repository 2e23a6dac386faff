"""The verdicts: a probe's own view, overruled by what the canaries or the host saw.

A blocked probe whose marker reached a canary, or that left a trace on the host, is a failure,
whatever the probe thought.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftest import markers
from selftest.fakenet import ALLOWED_HOST, BLOCKED, wild_control
from selftest.hostrows import DAEMON_AFTER_RUN
from selftest.probes.core import Record
from selftest.world import World


@dataclass
class Row:
    """One line of verify's report (and one object of --json)."""

    group: str
    probe: str
    context: str
    expected: str
    observed: str
    ok: bool
    evidence: str
    identity: str = "root"  # who the command was inside the sandbox: "root" (uid 0) or "user" (no privilege)

    def as_text(self) -> str:
        mark = "ok  " if self.ok else ("SKIP" if self.observed == "unsupported" else "FAIL")
        line = (
            f"{mark} {self.group:<10} {self.probe:<24} {self.context:<10} {self.identity:<4} "
            f"expected {self.expected:<9} observed {self.observed}"
        )
        return line + (f"\n       evidence: {self.evidence}" if not self.ok and self.evidence else "")


#: Probes whose correct outcome sends the marker to the *allowed* host (the name wins over the
#: address): only the blocked host's canaries count as evidence against them.
NAME_WINS = ("sni_spoof", "host_mismatch")


def canary_hits(world: World, probe: str, mark: str) -> list[dict[str, Any]]:
    """Every canary log record that carries the probe's marker (mark = <context>-<tag>)."""
    wanted = markers.in_logs(probe, mark)
    if probe == "dns_smuggling":  # letter case is its channel too: the name as the probe spelled it
        wanted += (f'"{markers.case_name(ALLOWED_HOST, mark)}"',)
    hits = []
    for server in world.servers:
        if probe in NAME_WINS and server.ip != BLOCKED:
            continue
        for rec in server.log_records():
            text = json.dumps(rec)
            if any(m in text for m in wanted):
                hits.append({"server": f"{server.kind} {server.name} {server.address}", **rec})
    return hits


def judge(
    w: World, r: Record, tag: str, host: dict[tuple[str, str], str], missing: dict[tuple[str, str], str] | None = None
) -> Row:
    """The probe's view, overruled by what the canaries or the host saw for a blocked probe; `missing`
    names what the outside must show for a row to hold (the bound upstream got the secret...)."""
    probe, ctx, expected, observed = r["probe"], r["context"], r["expected"], r["observed"]
    evidence = r.get("detail", "")
    hits = canary_hits(w, probe, markers.mark(ctx, tag)) if r["group"] == "network" else []
    seen = host.get((probe, ctx)) or host.get((probe, "*"))
    if probe == "dns_smuggling" and observed == "blocked" and not _allowed_query_seen(w):
        observed, evidence = (
            "unsupported",
            f"no query for {ALLOWED_HOST} reached the DNS canary: cannot tell; {evidence}",
        )
    if probe == "wildcard_dns_types" and observed == "blocked" and not _qname_seen(w, wild_control(ctx, tag)):
        observed, evidence = "unsupported", f"the control A query never reached the DNS canary: cannot tell; {evidence}"
    if expected == "blocked" and hits:
        observed = "permitted"
        evidence = "canary saw it: " + "; ".join(json.dumps(h, sort_keys=True)[:300] for h in hits[:3])
    elif expected == "blocked" and seen:
        observed, evidence = "permitted", f"the host shows it: {seen}; probe: {evidence}"
    ok = observed == expected
    if ok and (lack := (missing or {}).get((probe, ctx))):
        ok, evidence = False, f"but {lack}; probe: {evidence}"
    return Row(r["group"], probe, ctx, expected, observed, ok, evidence, tag)


def _allowed_query_seen(w: World) -> bool:
    """The control of dns_smuggling: allowed queries reach the world's DNS canary at all."""
    return _qname_seen(w, ALLOWED_HOST)


def _qname_seen(w: World, name: str) -> bool:
    return w.dns is not None and any(r.get("qname") == name for r in w.dns.log_records("dns"))


def daemon_row(token: str, heartbeat: Path, identity: str) -> Row:
    """After the run: the daemon must be gone, and must have stopped reaching anything."""
    alive = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout.split()
    before = heartbeat.read_text() if heartbeat.exists() else ""
    time.sleep(1.2)
    after = heartbeat.read_text() if heartbeat.exists() else ""
    still_writing = after != before
    observed = "permitted" if alive or still_writing else "blocked"
    evidence = (f"processes {alive} still running" if alive else "") + (
        " heartbeat still growing" if still_writing else ""
    )
    return Row(
        "process", DAEMON_AFTER_RUN, "daemon", "blocked", observed, observed == "blocked", evidence.strip(), identity
    )
