"""The runtime directories probe: no sandgate daemon's directory (this run's own or another spelling's)
and no /run/user/<uid> of the run's users is reachable from inside (issue 22).

Which users: the host uids this sandbox maps (/proc/self/uid_map's outside column), so the probe
names the same directories the launcher hid, whoever the command is inside (root inside a rootless
run, `--user nobody` of a root one). Which directories: launcher/run/runtimedirs.py's own list,
the one the launcher hides, so a spelling added there is probed here too. Stdlib only.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

from launcher.run import runtimedirs as rdirs
from selftest.probes.core import Ctx, Result, probe

CONNECT_TIMEOUT = 2.0
MAX_MAPPED = 64  # a wider uid_map range is a whole-namespace map (outside any sandbox): not a user's ids


def host_uids() -> list[int]:
    """The host uids this process's user namespace maps, one by one, and its own."""
    uids = {os.getuid()}
    try:
        lines = Path("/proc/self/uid_map").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _inside, outside, count = (int(x) for x in line.split())
        if count <= MAX_MAPPED:
            uids.update(range(outside, outside + count))
    return sorted(uids)


def candidates() -> tuple[str, ...]:
    """Every runtime directory spelling and /run/user/<uid> of those uids."""
    return rdirs.plan(os.environ, host_uids()).hide


def connects(path: str) -> bool:
    """A connection is established (nothing is sent: a daemon's protocol is not the probe's business)."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):  # the daemon's control socket is SEQPACKET
        with socket.socket(socket.AF_UNIX, kind) as s:
            s.settimeout(CONNECT_TIMEOUT)
            try:
                s.connect(path)
            except OSError as e:
                if e.errno == errno.EPROTOTYPE:
                    continue
                return False
            return True
    return False


def look(d: str) -> tuple[str, str]:
    """("absent" | "empty" | "refused" | "reachable", what was seen) for one directory."""
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return "absent", d
    except PermissionError:
        return "refused", d
    if not names:
        return "empty", d
    live = [n for n in names if connects(os.path.join(d, n))]
    return "reachable", f"{d} lists {names[:6]}" + (f", connected to {live[:3]}" if live else "")


@probe("filesystem", "runtime_dirs", "blocked")
def runtime_dirs(c: Ctx) -> Result:
    """Reaching this run's or another sandgate runtime directory (a daemon's control socket) or /run/user/<uid> (the user's systemd, D-Bus)."""
    seen: dict[str, list[str]] = {}
    for d in candidates():
        kind, what = look(d)
        seen.setdefault(kind, []).append(what)
    if "reachable" in seen:
        return "permitted", "; ".join(seen["reachable"])
    return "blocked", "; ".join(f"{kind}: {', '.join(v)}" for kind, v in sorted(seen.items()))
