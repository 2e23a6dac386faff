"""`sandgate verify`: prove the boundary on this machine, with this kernel and this policy.

Builds a disposable world (a network namespace with canary servers that log everything they
see; run by an ordinary user, inside a user namespace of its own), plants host state for the
probes to reach for (a SysV segment, a key, the file handle of a fake key), and runs the probe
runner (selftest/probes/) inside a real `sandgate run`, from the command itself, a
grandchild and a setsid daemon, in two passes: the command as root inside and as an
unprivileged command (the rows' "identity"). Every probe is judged twice: by what the probe
saw, and by what the canaries or the host saw. A blocked probe whose marker reached a canary,
or that left a trace on the host, is a failure, whatever the probe thought.

Nothing leaves the world: its namespace has no route out, every canary lives inside it, and
everything is removed afterwards (also on Ctrl-C).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import asdict
from pathlib import Path

from selftest import fakenet
from selftest.errors import VerifyError
from selftest.frontdoorrow import front_door_row
from selftest.hostrows import FRONT_DOOR, UNTRUSTED
from selftest.judge import Row
from selftest.passes import Pass, passes, run_pass, secret_of
from selftest.planted import Planted
from selftest.probes.core import CONTEXTS, ordered
from selftest.selection import Selection
from selftest.untrusted import untrusted_row
from selftest.world import World

#: What the command (launcher/cli.py) uses: the run, and the failure it reports as a usage error.
__all__ = ["VerifyError", "coverage_markdown", "main", "run_verify"]


def run_verify(policies: list[Path], only: Selection) -> list[Row]:
    """Root: the world is named network namespaces; anyone else: a world in a user namespace of its own."""
    the_passes = passes()
    scratch = Path(tempfile.mkdtemp(prefix="sandgate-verify-", dir="/var/tmp"))
    scratch.chmod(0o755)  # the unprivileged pass's command must reach its own tree below
    sockdir = Path(tempfile.mkdtemp(prefix="sandgate-verify-", dir="/tmp"))
    sockdir.chmod(0o755)  # like an ssh-agent dir a user could enter: only sandgate may keep the probe out
    try:
        with World(prefix="sandgate-v") as w:
            return _in_world(w, scratch, sockdir, policies, only, the_passes)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(scratch))  # the fake homes' sandbox layers go with them
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def _in_world(
    w: World, scratch: Path, sockdir: Path, policies: list[Path], only: Selection, the_passes: list[Pass]
) -> list[Row]:
    token = uuid.uuid4().hex[:10]
    facts = fakenet.build_world(w, scratch, sockdir, token)
    policy = scratch / "verify.yaml"
    policy.write_text(fakenet.POLICY)
    policy.chmod(0o644)
    planted = Planted.plant(token)
    rows: list[Row] = []
    try:
        planted.controls()
        for p in the_passes:
            base = scratch / p.identity
            rows += run_pass(w, p, base, facts, [policy, *policies], only, planted, token)
            if only.wants("filesystem", UNTRUSTED):
                rows.append(untrusted_row(w, p, base, base / "home", secret_of(token), token))
            if only.wants("network", FRONT_DOOR):
                rows.append(front_door_row(w, p, base, base / "home", secret_of(token), token))
    finally:
        planted.remove()
    return rows


def coverage_markdown() -> str:
    """The table of docs/verify.md (what the boundary covers), generated from the probe list."""
    lines = ["| group | probe | expected | what it tries |", "|---|---|---|---|"]
    for p in ordered():
        where = "" if p.contexts == frozenset(CONTEXTS) else f" ({', '.join(sorted(p.contexts))} only)"
        lines.append(f"| {p.group} | `{p.name}` | {p.expected} | {p.threat.rstrip('.')}{where} |")
    lines.append(
        "| process | `daemon_after_run` | blocked | a setsid daemon started by the task is still running, "
        "or still reaching the network, after `sandgate run` returned |"
    )
    lines.append(
        f"| filesystem | `{UNTRUSTED}` | blocked | a checkout's own untrusted `.sandgate.yaml` allows the "
        "blocked host, every IPv4 address, every variable and the home: a separate `sandgate run` "
        "without --policy |"
    )
    lines.append(
        f"| network | `{FRONT_DOOR}` | blocked | the front door's own inspected path (no credential brokered, "
        "HTTP/1.1 learnt): a push (receive-pack POST) and a Host naming another host, each on a new connection "
        "beside allowed GETs, in a separate `sandgate run` whose policy is the git host's read-only entry alone |"
    )
    return "\n".join(lines) + "\n"


def main(policies: list[Path], as_json: bool, only: Selection) -> int:
    """`sandgate verify`: run, report every row, exit 0 only if every probe behaved as expected."""
    rows = run_verify(policies, only)
    if as_json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        for r in rows:
            print(r.as_text())
        bad = [r for r in rows if not r.ok]
        print(
            f"\n{len(rows) - len(bad)} of {len(rows)} probes behaved as expected"
            + (f"; {len(bad)} did not" if bad else "")
        )
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--coverage-markdown"]:
        sys.stdout.write(coverage_markdown())
