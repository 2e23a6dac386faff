"""The host-boundary probes: the host's privileges and state, seen from inside the sandbox.

Threat model, "found in sandgate v1": a root command kept host capabilities (setns into the
host's network namespaces, open_by_handle_at of a hidden ~/.ssh key, mknod of the root disk,
sethostname, bpf()), shared the host's SysV IPC and keyrings. verify plants the targets outside
(selftest/planted.py) and reads the host back after the run, so a blocked row is judged
by the probe AND by what the host shows (a segment attached, a device node in the workspace, a
changed hostname).
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import struct
import subprocess
from pathlib import Path

from selftest import markers
from selftest.probes.core import CONTEXTS, Ctx, Result, Unsupported, attempt, combine, describe, probe
from selftest.probes.netio import tcp_canary, udp_echo
from selftest.probes.syscalls import (
    ENOKEY,
    KEY_SPEC_USER_KEYRING,
    KEYCTL_READ,
    KEYCTL_SEARCH,
    LIBC,
    FileHandle,
    errno_error,
    in_child,
    syscall,
)
from selftest.spec import FileHandleSpec

TOOL_TIMEOUT = 5.0  # nft / ip inside the sandbox
CLONE_NEWNET = 0x40000000


# ------------------------------------------------------------------------------ network


def _enter_and_connect(c: Ctx) -> Result:
    fd = os.open(c.spec.world_netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if LIBC.setns(fd, CLONE_NEWNET) != 0:
            raise errno_error(f"setns({c.spec.world_netns}, CLONE_NEWNET)")
    finally:
        os.close(fd)
    _, detail = attempt(tcp_canary, c.spec.blocked_ip, c.spec.tcp_port, c.marker)
    return "permitted", f"entered the world's network namespace; then {detail}"


@probe("network", "setns_host_netns", "blocked")
def setns_host_netns(c: Ctx) -> Result:
    """setns into a network namespace of the host (the world's), then straight to a blocked canary."""
    if not Path(c.spec.world_netns).exists():
        return "blocked", f"{c.spec.world_netns} is not visible here"
    return in_child(lambda: _enter_and_connect(c))


def _tool(argv: list[str]) -> tuple[bool, str]:
    """(succeeded, its stdout if so, else its first complaint) for one admin command; OSError if it cannot run."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT, stdin=subprocess.DEVNULL)
    said = next((ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip()), "")  # nft: then carets
    return r.returncode == 0, r.stdout if r.returncode == 0 else said


def _tamper(link: str) -> tuple[list[tuple[str, Result]], list[list[str]]]:
    """Try each change; returns the labelled outcomes and the commands that undo what took effect."""
    saved = _output(["nft", "list", "ruleset"])  # only readable with CAP_NET_ADMIN
    route = _output(["ip", "route", "show", "default"])
    tries = (
        (
            "nft flush ruleset",
            ["nft", "flush", "ruleset"],
            ["nft", "-f", "-", "flush ruleset\n" + saved] if saved else None,
        ),
        (
            "ip link add veth",
            ["ip", "link", "add", link, "type", "veth", "peer", "name", link + "p"],
            ["ip", "link", "del", link],
        ),
        (
            "ip route replace default",
            ["ip", "route", "replace", "default", "dev", "lo"],
            ["ip", "route", "replace", *route.split()] if route.strip() else None,
        ),
    )
    parts: list[tuple[str, Result]] = []
    undo: list[list[str]] = []
    for label, argv, back in tries:
        try:
            done, said = _tool(argv)
        except (OSError, subprocess.SubprocessError) as e:
            parts.append((label, ("unsupported", describe(e))))
            continue
        parts.append((label, ("permitted", "done") if done else ("blocked", f"refused ({said})")))
        if done and back:
            undo.append(back)
    return parts, undo


def _output(argv: list[str]) -> str:
    """What a command printed, "" if it failed or could not run."""
    try:
        done, out = _tool(argv)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out if done else ""


def _undo(undo: list[list[str]]) -> str:
    """Put back what a change did (reachable only with CAP_NET_ADMIN, the self-test's weakening):
    the later probes and contexts must meet the sandbox as it was."""
    failed = []
    for argv in undo:
        script = argv.pop() if argv[:3] == ["nft", "-f", "-"] else None
        r = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=TOOL_TIMEOUT)
        if r.returncode != 0:
            failed.append(f"{' '.join(argv[:3])}: {r.stderr.strip()[:80]}")
    return f"; UNDO FAILED: {', '.join(failed)}" if failed else ("; all undone" if undo else "")


@probe("network", "netns_tamper", "blocked")
def netns_tamper(c: Ctx) -> Result:
    """Flush the sandbox's own nftables table, add a link or a route, then go straight to a blocked canary."""
    parts, undo = _tamper(f"sgvt{os.getpid() % 100000}")
    try:
        tcp = attempt(tcp_canary, c.spec.blocked_ip, c.spec.tcp_port, c.marker)
        udp = attempt(udp_echo, c.spec.blocked_ip, c.spec.udp_port, c.marker)
    finally:
        undone = _undo(undo)
    changes = "; ".join(f"{label}: {detail}" for label, (_, detail) in parts)
    if all(r[0] == "unsupported" for _, r in parts):
        return "unsupported", f"no change could even be tried: {changes}"
    observed, reached = combine([("tcp", tcp), ("udp", udp)], need="any")
    return observed, f"{changes}; then {reached}{undone}"  # the canary's verdict: a change alone reaches nothing


@probe("network", "host_loopback_service", "blocked")
def host_loopback_service(c: Ctx) -> Result:
    """A service on the host's own 127.0.0.1 (databases, admin ports): inside, 127.0.0.1 is the sandbox's."""
    port = c.spec.host_loopback_port
    return combine(
        [
            ("tcp", attempt(tcp_canary, "127.0.0.1", port, c.marker)),
            ("udp", attempt(udp_echo, "127.0.0.1", port, c.marker)),
        ],
        need="any",
    )


# --------------------------------------------------------------------------- filesystem


def read_by_handle(mount_dir: str, handle: FileHandle, secret: str) -> Result:
    mfd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = LIBC.open_by_handle_at(mfd, ctypes.byref(handle), os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            raise errno_error(f"open_by_handle_at(mount fd of {mount_dir})")
    finally:
        os.close(mfd)
    with os.fdopen(fd, "rb") as f:
        data = f.read(4096)
    return "permitted", f"opened the hidden key by handle{' and read the secret' if secret.encode() in data else ''}"


def handle_from_spec(spec: FileHandleSpec) -> FileHandle:
    fh = FileHandle()
    raw = bytes.fromhex(spec.hex)
    fh.handle_bytes, fh.handle_type = len(raw), spec.type
    ctypes.memmove(fh.f_handle, raw, len(raw))
    return fh


@probe("filesystem", "open_by_handle", "blocked")
def open_by_handle(c: Ctx) -> Result:
    """open_by_handle_at of the hidden ~/.ssh key, its handle made outside: no path, so no hidden path."""
    handle, secret = handle_from_spec(c.spec.ssh_key_handle), c.spec.secret_marker
    return combine(
        [(where, attempt(read_by_handle, where, handle, secret)) for where in ("/", c.spec.home, os.getcwd())],
        need="any",
    )


def _mknod(node: Path, major: int, minor: int) -> Result:
    os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(major, minor))
    try:  # left in place: verify finds it after the run (host-side evidence)
        with open(node, "rb") as f:
            return "permitted", f"made {node} ({major}:{minor}) and read {len(f.read(512))} bytes of the disk"
    except OSError as e:
        return "permitted", f"made {node} ({major}:{minor}); opening it: {describe(e)}"


def _open_dev(path: str) -> Result:
    if not path:
        raise Unsupported("no device path for the root disk")
    if not os.path.exists(path):
        return "blocked", f"{path} does not exist here"
    with open(path, "rb") as f:
        return "permitted", f"read {len(f.read(512))} bytes of {path}"


@probe("filesystem", "mknod_disk", "blocked")
def mknod_disk(c: Ctx) -> Result:
    """A block node of the host's root disk made in the workspace (or its /dev node opened): raw disk access."""
    major, minor = (int(x) for x in c.spec.root_dev)
    return combine(
        [
            ("mknod", attempt(_mknod, Path(markers.disk_node(c.mark)), major, minor)),
            ("open", attempt(_open_dev, c.spec.root_dev_path)),
        ],
        need="any",
    )


# ------------------------------------------------------------------------------ process


@probe("process", "sysv_shm_host", "blocked")
def sysv_shm_host(c: Ctx) -> Result:
    """Attaching the host's SysV shared memory segment (made outside, mode 0666): read and write host IPC."""
    shm_id = int(c.spec.shm_id)
    ctypes.set_errno(0)
    addr = LIBC.shmat(shm_id, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        err = ctypes.get_errno()
        if err == 22:  # EINVAL: no segment with this id in this IPC namespace
            return "blocked", f"EINVAL: no segment {shm_id} in this IPC namespace"
        raise OSError(err, f"shmat({shm_id}): {os.strerror(err)}")
    try:
        seen = ctypes.string_at(addr, 64).split(b"\0", 1)[0]
        mark = c.marker.strip()
        ctypes.memmove(addr + 1024 + 64 * CONTEXTS.index(c.context), mark, len(mark))
    finally:
        LIBC.shmdt(addr)
    return "permitted", f"attached segment {shm_id}: {seen[:40]!r}; wrote our marker into it"


def _keyctl(what: str, *args: int | bytes | ctypes.Array[ctypes.c_char]) -> Result:
    try:
        got = syscall("keyctl", *args)
    except OSError as e:
        if e.errno == ENOKEY:
            return "blocked", f"ENOKEY: {what} is not reachable here"
        raise
    return "permitted", f"{what}: keyctl answered {got}"


@probe("process", "keyring_read", "blocked")
def keyring_read(c: Ctx) -> Result:
    """Reading a key from the caller's user keyring (Kerberos, ecryptfs, NFS keys): keyrings are per uid."""
    serial, buf = int(c.spec.host_key), ctypes.create_string_buffer(4096)
    desc = c.spec.host_key_description.encode()
    return combine(
        [
            ("read by serial", attempt(_keyctl, f"key {serial}", KEYCTL_READ, serial, buf, len(buf))),
            ("search @u", attempt(_keyctl, "its name in @u", KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", desc, 0)),
        ],
        need="any",
    )


@probe("process", "sethostname", "blocked")
def sethostname(c: Ctx) -> Result:
    """Setting the host name (v1: the host's UTS name was settable): verify also checks the host's after."""
    name = f"verify-{c.mark}"
    socket.sethostname(name)
    return "permitted", f"sethostname({name!r}) succeeded; uname now says {os.uname().nodename!r}"


@probe("process", "bpf_map", "blocked")
def bpf_map(c: Ctx) -> Result:
    """bpf(BPF_MAP_CREATE): eBPF, a kernel attack surface no namespace isolates (v1: bpf() on the host)."""
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1), 128)  # BPF_MAP_TYPE_ARRAY, 4, 4, 1
    fd = syscall("bpf", 0, attr, 128)  # BPF_MAP_CREATE
    os.close(fd)
    return "permitted", f"created a BPF array map (fd {fd})"
