"""The process probes: the user's terminal, other processes (ptrace, memory, signals, /proc, their
environment blocks) and privilege gain through setuid binaries.

They act on pid 1, which inside sandgate is the sandbox's init. Outside a sandbox (as root) they
would touch the host's init: only run them inside `sandgate run`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import termios
import time
from pathlib import Path

from selftest.probes.core import Ctx, Result, Unsupported, describe, probe
from selftest.probes.syscalls import fresh_libc

PROC_PIDS_LIMIT = 20  # more pids than this in /proc: we see processes that are not the sandbox's


@probe("process", "tiocsti", "blocked", contexts=("child",))
def tiocsti(c: Ctx) -> Result:
    """Typing commands into the user's terminal (TIOCSTI) that run after the sandbox exits."""
    if not os.isatty(0):
        raise Unsupported("no terminal")
    try:
        fcntl.ioctl(0, termios.TIOCSTI, b"#")
    except OSError as e:
        if e.errno == errno.EIO:
            return "blocked", "EIO (dev.tty.legacy_tiocsti=0)"
        raise
    return "permitted", "injected '#' into the terminal"


PTRACE_ATTACH, PTRACE_DETACH = 16, 17
WALL = 0x40000000  # __WALL


@probe("process", "ptrace_outside", "blocked")
def ptrace_outside(c: Ctx) -> Result:
    """ptrace of a process outside the command's Landlock domain (the sandbox's init, pid 1)."""
    libc = fresh_libc()
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_ATTACH, 1, None, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    # Attached: wait for the stop (bounded), then let it go again.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(1, os.WNOHANG | WALL)[0] == 1:
                break
        except ChildProcessError:
            break
        time.sleep(0.01)
    libc.ptrace(PTRACE_DETACH, 1, None, None)
    return "permitted", "PTRACE_ATTACH to pid 1 succeeded (detached again)"


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _some_address(pid: int) -> int:
    """Start of a mapping of `pid` if its maps are readable, else a typical non-PIE text address."""
    try:
        first = Path(f"/proc/{pid}/maps").read_text().split("-", 1)[0]
        return int(first, 16)
    except (OSError, ValueError):
        return 0x400000


@probe("process", "process_vm_readv", "blocked")
def process_vm_readv(c: Ctx) -> Result:
    """Reading another process's memory (secrets in the sandbox init or a host process)."""
    libc = fresh_libc()
    fn = libc.process_vm_readv
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    buf = ctypes.create_string_buffer(8)
    addr = _some_address(1)
    local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = _IoVec(addr, 8)
    n = fn(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n >= 0:
        return "permitted", f"read {n} bytes of pid 1 at {addr:#x}"
    err = ctypes.get_errno()
    if err == errno.EFAULT:
        return "permitted", f"EFAULT at {addr:#x}: the kernel let us try to read pid 1"
    if err == errno.ESRCH:
        return "blocked", "ESRCH: pid 1 not visible"
    raise OSError(err, os.strerror(err))


@probe("process", "signal_outside", "blocked")
def signal_outside(c: Ctx) -> Result:
    """Signalling a process outside the command's domain (killing or disturbing the supervisor)."""
    os.kill(1, 0)
    return "permitted", "kill(1, 0) succeeded"


@probe("process", "proc_root", "blocked")
def proc_root(c: Ctx) -> Result:
    """Seeing host processes in /proc, or reaching a foreign root through /proc/<pid>/root."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    try:
        root = sorted(os.listdir("/proc/1/root"))
        same = root == sorted(os.listdir("/"))
        root_text = "/proc/1/root lists the same root" if same else f"/proc/1/root lists a different root: {root[:8]}"
    except OSError as e:
        same, root_text = True, f"/proc/1/root: {describe(e)}"
    observed = "permitted" if len(pids) > PROC_PIDS_LIMIT or not same else "blocked"
    return observed, f"{len(pids)} pids visible; {root_text}"


SETUID_CANDIDATES = ("/usr/bin/passwd", "/usr/bin/su", "/bin/su", "/usr/bin/sudo", "/usr/bin/mount", "/bin/mount")


@probe("process", "setuid_gain", "blocked")
def setuid_gain(c: Ctx) -> Result:
    """Gaining privileges through a setuid-root binary (no_new_privs must be set)."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    flag = status.get("NoNewPrivs", "").strip()
    if flag not in ("0", "1"):
        raise Unsupported("no NoNewPrivs line in /proc/self/status")
    suid = next((p for p in SETUID_CANDIDATES if _is_setuid_root(p)), None)
    detail = f"NoNewPrivs: {flag}; setuid-root binary: {suid or 'none found'}"
    return ("blocked" if flag == "1" else "permitted"), detail


def _is_setuid_root(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(st.st_mode & stat.S_ISUID) and st.st_uid == 0


@probe("process", "proc_environ", "blocked")
def proc_environ(c: Ctx) -> Result:
    """A dropped secret still in some process's environment block (/proc/1/environ of init, v1 review)."""
    secret, control = c.spec.secret_marker.encode(), c.spec.visible_env.encode()
    if control not in Path("/proc/self/environ").read_bytes():
        raise Unsupported("the control variable is missing from /proc/self/environ: cannot tell")
    readable, holders = [], []
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        readable.append(pid)
        if secret in data:
            holders.append(pid)
    pid1 = "readable" if "1" in readable else "not readable"
    if holders:
        return "permitted", f"the secret is in the environment of pid(s) {', '.join(holders)}"
    return "blocked", f"{len(readable)} environ files readable (pid 1 {pid1}), none holds the secret"
