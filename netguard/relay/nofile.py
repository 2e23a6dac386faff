"""The process's open-file limit, raised once at start (the daemon, and each relay worker): every
proxied connection holds two sockets, so the usual soft limit of 1024 would refuse connections at a
few hundred. Soft goes to the hard limit; a privileged process (root, or CAP_SYS_RESOURCE) also lifts
the hard limit to WANT when the kernel allows it (fs.nr_open). The standard library only: a relay
worker imports it."""

from __future__ import annotations

import sys

WANT = 1 << 20  # 10,000 tunnels need ~20,000 over the daemon's processes; a million costs nothing until used


def raise_nofile(want: int = WANT) -> int:
    """Raise RLIMIT_NOFILE as far as allowed; the soft limit it ended at (never lowered)."""
    if sys.platform == "win32":
        return want  # sockets are handles there: no per-process descriptor limit to raise
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            want = min(want, int(f.read()))
    except (OSError, ValueError):
        pass
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (OSError, ValueError):
            pass  # unprivileged: up to the hard limit only
    target = hard if hard != resource.RLIM_INFINITY else max(soft, want)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (OSError, ValueError):
            pass
    return soft
