"""What of the caller's process a run inherits: the fork server's key (only `os` and `sys`: the console
script computes it before it imports anything else).

A worker is a fork of the server, not of the caller, so the server must be the caller's twin in
everything a run inherits and does not receive per request (the threat: a run that escapes a caller's
limits, cgroup, seccomp filter or namespaces by being served by a server started elsewhere). The
request carries the rest: streams, directory, umask, environment, arguments.
"""

from __future__ import annotations

import os
import sys

# Namespaces a process lives in; a run made in another network namespace is another machine. The mount
# namespace is compared by what it shows (mounts()), not by its number: `ip netns exec` makes a new one
# for every command, with the same view each time.
NAMESPACES = ("cgroup", "ipc", "net", "pid", "pid_for_children", "time", "time_for_children", "user", "uts")
# /proc/self/status lines a run inherits: capabilities (the bounding set included), no_new_privs, seccomp.
STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters")
# Interpreter settings from sys.flags that change how the same code runs (safe_path left out: the server
# is started with -P, and it only decides the first sys.path entry, which no sandgate module comes from).
FLAGS = ("optimize", "dev_mode", "utf8_mode", "isolated", "ignore_environment", "no_user_site", "no_site")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return "-"  # absent (no LSM, an old kernel): the same "-" on both sides


def _ns(name: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{name}")
    except OSError:
        return "-"


def mounts(mountinfo: str) -> list[str]:
    """The filesystem a process sees: each mount's device, root, place, options and source, without the
    numbers a new mount namespace renumbers (mount ids, propagation peers), and what the mount point
    is now (device and inode: a file bound over /etc/hosts from a file since replaced is another view).
    Namespace files (nsfs) are left out: every `ip netns add` or container start mounts one."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if fields[sep + 1 : sep + 2] == ["nsfs"]:
            continue  # a namespace pinned by a file (`ip netns add`, a container): no file a run reads
        point = fields[4]
        try:
            st = os.stat(point.replace("\\040", " ")) if "\\" not in point.replace("\\040", "") else None
        except OSError:
            st = None
        now = f"{st.st_dev}:{st.st_ino}" if st is not None else "-"
        out.append(" ".join([*fields[2:6], *fields[sep + 1 :], now]))
    return out


def _status() -> str:
    lines = _read("/proc/self/status").splitlines()
    return "\n".join(line for line in lines if line.split(":", 1)[0] in STATUS_FIELDS)


def parts(environ: dict[str, str] | os._Environ[str], launcher_dir: str) -> list[str]:
    """The key's parts, readable (tests compare them; key() hashes them)."""
    interp = [
        sys.executable,
        sys.prefix,
        launcher_dir,  # where `launcher` was imported from: a checkout on PYTHONPATH is another program
        repr([getattr(sys.flags, f) for f in FLAGS]),
        # -X importtime, -X dev: measured or checked, not forked; -X utf8 is the utf8_mode flag above (the
        # server gets its caller's: client.server_flags), however the caller came by it
        repr(sorted((k, v) for k, v in sys._xoptions.items() if k != "utf8")),
        repr(sorted((k, v) for k, v in environ.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG")),
    ]
    creds = [repr(os.getresuid()), repr(os.getresgid()), repr(sorted(os.getgroups()))]
    where = [f"{n}={_ns(n)}" for n in NAMESPACES] + [repr(os.stat("/proc/self/root")[1:3])]
    where += mounts(_read("/proc/self/mountinfo"))
    limits = [
        _read("/proc/self/cgroup"),
        _status(),
        _read("/proc/self/limits"),
        _read("/proc/self/oom_score_adj"),
        _read("/proc/self/attr/current"),  # the LSM label (AppArmor, SELinux)
        str(os.getpriority(os.PRIO_PROCESS, 0)),
        repr(sorted(os.sched_getaffinity(0))),
    ]
    return ["sandgate-forkserver-1", *interp, *creds, *where, *limits]


def key(environ: dict[str, str] | os._Environ[str], launcher_dir: str) -> str:
    """A short fingerprint of parts(): the socket's name, and what a server checks a request against."""
    try:  # CPython's own SHA-256: hashlib would load OpenSSL first (~4 ms on every run)
        from _sha2 import sha256  # private: no stub (see pyproject)
    except ImportError:
        from hashlib import sha256
    return str(sha256("\0".join(parts(environ, launcher_dir)).encode()).hexdigest())[:20]


def socket_name(key_: str) -> str:
    """The server's socket in the runtime directory (hidden from every sandbox): one per key, named for its
    network namespace too, like the daemon's (`sandgate daemon stop` stops this namespace's only)."""
    return f"{socket_prefix()}{key_}.sock"


def socket_prefix() -> str:
    return f"fork-{os.stat('/proc/self/ns/net').st_ino}-"
