"""`sandgate verify` as the e2e tests start it, and its two whole runs shared by the modules that assert on them.

Why shared: a whole run (every probe, both identities) costs ~20 s of the serial e2e budget; the
root one and the ordinary user's one are each made once per session (tests/e2e/conftest.py) and
every test that asserts on their rows reads the same output, instead of re-running a subset.
The host's state is read right before and after the root run, so the leftover checks still judge
exactly that run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .rootless import UnprivilegedUser
from .world import new_world

REPO = Path(__file__).resolve().parent.parent.parent
Rows = list[dict[str, object]]


def sandgate_verify(*args: str, weaken: str = "") -> tuple[int, Rows, str]:
    """`sandgate verify --json ARGS` as root in the host's namespaces: (exit code, rows, stderr)."""
    if os.geteuid() != 0:
        pytest.fail("sandgate verify needs root", pytrace=False)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    if weaken:
        env["SANDGATE_INTERNAL_WEAKEN"] = weaken
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "verify", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else []), r.stderr


@dataclass(frozen=True)
class HostState:
    """What verify plants or could change outside its world: the host's name, its keys and SysV segments."""

    hostname: str
    keys: frozenset[str]  # live "sandgate-verify:" keys (not invalidated/dead/revoked)
    shm: frozenset[str]
    netns: str  # `ip netns list`


def host_state() -> HostState:
    keys = frozenset(
        line
        for line in Path("/proc/keys").read_text().splitlines()
        if "sandgate-verify:" in line and not set(line.split()[1]) & set("iDR")
    )
    shm = frozenset(line.split()[1] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:])
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return HostState(socket.gethostname(), keys, shm, netns)


@dataclass(frozen=True)
class VerifyRun:
    """One whole `sandgate verify --json` run: its exit code, rows, stderr and the host around it."""

    code: int
    rows: Rows
    err: str
    before: HostState | None = None
    after: HostState | None = None


def whole_run_as_root() -> VerifyRun:
    before = host_state()
    code, rows, err = sandgate_verify()
    return VerifyRun(code, rows, err, before, host_state())


def whole_run_as_user() -> VerifyRun:
    """An ordinary user without sudo, in a world of its own: world and user are gone again on return."""
    with new_world() as world, UnprivilegedUser() as user:
        r = user.runner(world).run(
            [sys.executable, "-m", "launcher.cli", "verify", "--json"], env={"PYTHONPATH": str(REPO)}, timeout=300
        )
    return VerifyRun(r.returncode, json.loads(r.stdout) if r.stdout.strip() else [], r.stderr)
