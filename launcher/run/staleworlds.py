"""The named network namespaces of `sandgate verify`'s and the tests' fake internet (selftest/world.py):
their names, their removal, and `sandgate cleanup`'s sweep of what a SIGKILLed run left behind (cleanup_stale).

Every name is <prefix><creating pid>x<n>, so cleanup_stale can tell a dead run's leftovers from a
live one's. Processes are killed by PID only, and only those found inside our own namespaces.
Here, below the self-test, because the product's cleanup needs it: the product never imports selftest.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
#: Name prefixes (world, client). Every name is <prefix><creating pid>x<n>, so cleanup_stale can
#: tell a dead run's leftovers from a live one's, whichever of the two created them.
TEST_PREFIXES = ("sandgate-w", "sandgate-c")
VERIFY_PREFIXES = ("sandgate-v", "sandgate-vc")
KNOWN_PREFIXES = TEST_PREFIXES + VERIFY_PREFIXES
# Only distinctive names: cleanup_stale deletes namespaces by these prefixes. No trailing digit,
# so the pid that follows is unambiguous.
_PREFIX_RE = re.compile(r"sandgate-[a-z]+(?:-[a-z]+)*")


def _ip(*args: str, check: bool = True) -> str:
    """`ip ARGS`; a failure carries its stderr (as selftest/nsexec.py's sh, which the product may not import)."""
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_list() -> list[str]:
    out = _ip("netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]


def sweep_netns(ns: str, grace: float = 2.0) -> None:
    """Kill, by PID, every process still inside one of OUR namespaces (daemons that left our process groups).

    Zombies are not listed (their netns reference is gone), so a reused PID cannot be hit unless it
    is re-used between listing and kill, within microseconds.
    """
    pids = netns_pids(ns)
    if not pids:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = netns_pids(ns)
        if not pids:
            return
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def delete_netns(ns: str) -> None:
    sweep_netns(ns)
    if ns in netns_list():
        _ip("netns", "del", ns)


def check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"name prefix {prefix!r} must match {_PREFIX_RE.pattern} (e.g. 'sandgate-w')")
    return prefix


def owner_pid(name: str, prefixes: Sequence[str], *, tmp: bool) -> int | None:
    """The creating pid in one of our names (netns / /etc/netns dir, or with tmp=True a mkdtemp dir)."""
    tail = r"-" if tmp else r"(?:-[a-z0-9]{1,16})?$"
    for prefix in prefixes:
        m = re.match(rf"{re.escape(prefix)}(\d+)x\d+{tail}", name)
        if m:
            return int(m.group(1))
    return None


def cleanup_stale(prefixes: Sequence[str] = KNOWN_PREFIXES) -> list[str]:
    """Remove namespaces, /etc/netns dirs and temp dirs left by a previous run whose pid is dead.

    A SIGKILLed run cannot clean up after itself; the creating pid is in every name, so anything
    whose creator is still alive (e.g. a parallel test run or verify) is left alone. `prefixes`
    defaults to the test and verify ones (world and client). Returns what was removed.
    """
    prefixes = [check_prefix(p) for p in prefixes]
    removed: list[str] = []

    def stale(name: str, *, tmp: bool = False) -> bool:
        pid = owner_pid(name, prefixes, tmp=tmp)
        return pid is not None and pid != os.getpid() and not pid_alive(pid)

    # The order does not matter: deleting either end's namespace destroys the veth pair.
    for ns in sorted(netns_list()):
        if stale(ns):
            delete_netns(ns)
            removed.append(f"netns {ns}")
    if NETNS_ETC.is_dir():
        for d in sorted(NETNS_ETC.iterdir()):
            if d.is_dir() and not d.is_symlink() and stale(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    tmp = Path(tempfile.gettempdir())
    for d in sorted(tmp.iterdir()):
        if d.is_dir() and not d.is_symlink() and stale(d.name, tmp=True):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed
