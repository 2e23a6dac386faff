"""The v2 probes of `sandgate verify`: the host's privileges and state, seen from inside the sandbox.

Threat model, "found in sandgate v1": a root command kept host capabilities (setns into the
host's network namespaces, open_by_handle_at of a hidden ~/.ssh key, mknod of the root disk,
sethostname, bpf()), shared the host's SysV IPC and keyrings, and /proc/1/environ held dropped
secrets. Registered into launcher.probes.REGISTRY (probes.py imports this module at its end),
run like every probe (command, grandchild, setsid daemon). Stdlib only, like probes.py.

The last part is run OUTSIDE by verify: it plants the targets (a SysV segment, a key, a file
handle) and reads the host back after the run, so a blocked row is judged by the probe AND by
what the host shows (a segment attached, a device node in the workspace, a changed hostname).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.probes import Ctx, Result, Unsupported, attempt, combine, describe, probe, tcp_canary, udp_echo

CHILD_TIMEOUT = 10.0  # a forked probe part (setns) that has not answered by then is killed
TOOL_TIMEOUT = 5.0  # nft / ip inside the sandbox
MAX_HANDLE_SZ = 128
CLONE_NEWNET = 0x40000000
#: Syscalls glibc does not wrap (bpf, keyctl, add_key), per machine.
SYSCALLS = {
    "x86_64": {"bpf": 321, "add_key": 248, "keyctl": 250},
    "aarch64": {"bpf": 280, "add_key": 217, "keyctl": 219},
}
KEYCTL_SETPERM, KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_SET_TIMEOUT, KEYCTL_INVALIDATE = 5, 10, 11, 15, 21
KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING = -4, -3
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_LINK = 1, 8
#: Possessor: everything; user and others: view, read, search. Only sandgate may keep the command
#: out, never the key's permissions (so the unprivileged pass tests the boundary, not DAC).
KEY_PERM = 0x3F000000 | 0x000B0000 | 0x0000000B
ENOKEY = 126
IPC_PRIVATE, IPC_CREAT, IPC_RMID = 0, 0o1000, 0
SHM_SIZE = 4096

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
_libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
_libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


class FileHandle(ctypes.Structure):
    """struct file_handle with room for the largest handle (MAX_HANDLE_SZ)."""

    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ),
    ]


def _errno_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def syscall(name: str, *args: int | ctypes.Array[ctypes.c_char] | bytes | None) -> int:
    """A raw syscall by name; OSError on failure, Unsupported on a machine not in SYSCALLS."""
    nr = SYSCALLS.get(os.uname().machine, {}).get(name)
    if nr is None:
        raise Unsupported(f"no syscall number for {name} on {os.uname().machine}")
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    rc = int(_libc.syscall(ctypes.c_long(nr), *conv))
    if rc < 0:
        raise _errno_error(name)
    return rc


def in_child(fn: Callable[[], Result], timeout: float = CHILD_TIMEOUT) -> Result:
    """Run `fn` in a forked child and return its Result: a namespace it entered dies with it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the runner
        try:
            os.close(r)
            os.write(w, json.dumps(attempt(fn)).encode()[:60000])
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    try:
        while select.select([r], [], [], timeout)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        if not data:
            os.kill(pid, signal.SIGKILL)  # our own unreaped child: its pid cannot have been reused
        os.waitpid(pid, 0)
    if not data:
        raise Unsupported(f"the forked probe part said nothing within {timeout:g} s")
    observed, detail = json.loads(data)
    return str(observed), str(detail)


# ------------------------------------------------------------------------------ network probes


def _enter_and_connect(c: Ctx) -> Result:
    fd = os.open(c.s("world_netns"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise _errno_error(f"setns({c.s('world_netns')}, CLONE_NEWNET)")
    finally:
        os.close(fd)
    _, detail = attempt(tcp_canary, c.s("blocked_ip"), c.port("tcp_port"), c.marker)
    return "permitted", f"entered the world's network namespace; then {detail}"


@probe("network", "setns_host_netns", "blocked")
def setns_host_netns(c: Ctx) -> Result:
    """setns into a network namespace of the host (the world's), then straight to a blocked canary."""
    if not Path(c.s("world_netns")).exists():
        return "blocked", f"{c.s('world_netns')} is not visible here"
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
        tcp = attempt(tcp_canary, c.s("blocked_ip"), c.port("tcp_port"), c.marker)
        udp = attempt(udp_echo, c.s("blocked_ip"), c.port("udp_port"), c.marker)
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
    port = c.port("host_loopback_port")
    return combine(
        [
            ("tcp", attempt(tcp_canary, "127.0.0.1", port, c.marker)),
            ("udp", attempt(udp_echo, "127.0.0.1", port, c.marker)),
        ],
        need="any",
    )


# --------------------------------------------------------------------------- filesystem probes


def read_by_handle(mount_dir: str, handle: FileHandle, secret: str) -> Result:
    mfd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _libc.open_by_handle_at(mfd, ctypes.byref(handle), os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            raise _errno_error(f"open_by_handle_at(mount fd of {mount_dir})")
    finally:
        os.close(mfd)
    with os.fdopen(fd, "rb") as f:
        data = f.read(4096)
    return "permitted", f"opened the hidden key by handle{' and read the secret' if secret.encode() in data else ''}"


def handle_from_spec(spec: dict[str, Any] | Any) -> FileHandle:
    fh = FileHandle()
    raw = bytes.fromhex(str(spec["hex"]))
    fh.handle_bytes, fh.handle_type = len(raw), int(spec["type"])
    ctypes.memmove(fh.f_handle, raw, len(raw))
    return fh


@probe("filesystem", "open_by_handle", "blocked")
def open_by_handle(c: Ctx) -> Result:
    """open_by_handle_at of the hidden ~/.ssh key, its handle made outside: no path, so no hidden path."""
    handle, secret = handle_from_spec(c.spec["ssh_key_handle"]), c.s("secret_marker")
    return combine(
        [(where, attempt(read_by_handle, where, handle, secret)) for where in ("/", c.s("home"), os.getcwd())],
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
    major, minor = (int(x) for x in c.spec["root_dev"])
    return combine(
        [
            ("mknod", attempt(_mknod, Path(f"sandgate-disk-{c.mark}"), major, minor)),
            ("open", attempt(_open_dev, c.s("root_dev_path"))),
        ],
        need="any",
    )


# ------------------------------------------------------------------------------ process probes


@probe("process", "proc_environ", "blocked")
def proc_environ(c: Ctx) -> Result:
    """A dropped secret still in some process's environment block (/proc/1/environ of init, v1 review)."""
    secret, control = c.s("secret_marker").encode(), c.s("visible_env").encode()
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


@probe("process", "sysv_shm_host", "blocked")
def sysv_shm_host(c: Ctx) -> Result:
    """Attaching the host's SysV shared memory segment (made outside, mode 0666): read and write host IPC."""
    shm_id = int(c.spec["shm_id"])
    ctypes.set_errno(0)
    addr = _libc.shmat(shm_id, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        err = ctypes.get_errno()
        if err == 22:  # EINVAL: no segment with this id in this IPC namespace
            return "blocked", f"EINVAL: no segment {shm_id} in this IPC namespace"
        raise OSError(err, f"shmat({shm_id}): {os.strerror(err)}")
    try:
        seen = ctypes.string_at(addr, 64).split(b"\0", 1)[0]
        mark = c.marker.strip()
        ctypes.memmove(addr + 1024 + 64 * ("child", "grandchild", "daemon").index(c.context), mark, len(mark))
    finally:
        _libc.shmdt(addr)
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
    serial, buf = int(c.spec["host_key"]), ctypes.create_string_buffer(4096)
    desc = c.s("host_key_description").encode()
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


# ------------------------------------------------ the outside halves: run by verify, never inside


def file_handle(path: Path) -> dict[str, Any]:
    """name_to_handle_at(path) as spec data: what open_by_handle tries inside (needs no privilege)."""
    fh, mount_id = FileHandle(), ctypes.c_int()
    fh.handle_bytes = MAX_HANDLE_SZ
    if _libc.name_to_handle_at(-100, os.fsencode(path), ctypes.byref(fh), ctypes.byref(mount_id), 0) != 0:  # AT_FDCWD
        raise _errno_error(f"name_to_handle_at({path})")
    return {"type": fh.handle_type, "hex": bytes(fh.f_handle[: fh.handle_bytes]).hex()}


def root_device() -> tuple[tuple[int, int], str]:
    """((major, minor), /dev path or "") of the disk holding "/": what mknod_disk would reach."""
    dev = os.stat("/").st_dev
    for name in sorted(os.listdir("/dev")):
        with contextlib.suppress(OSError):
            st = os.stat(f"/dev/{name}")
            if stat.S_ISBLK(st.st_mode) and st.st_rdev == dev:
                return (os.major(dev), os.minor(dev)), f"/dev/{name}"
    return (os.major(dev), os.minor(dev)), ""


@dataclass
class Planted:
    """The host's state verify plants before a run and reads back after it: the host-side evidence."""

    hostname: str
    shm_id: int
    shm_addr: int  # we stay attached: the segment, already marked for removal, dies with us (even SIGKILLed)
    shm_seen: str  # lpid/atime/nattch of the segment after our own attach: any other attach changes them
    key: int
    key_description: str

    @classmethod
    def plant(cls, token: str) -> Planted:
        shm_id = _libc.shmget(IPC_PRIVATE, SHM_SIZE, IPC_CREAT | 0o666)
        if shm_id < 0:
            raise _errno_error("shmget")
        addr = _libc.shmat(shm_id, None, 0)
        _libc.shmctl(shm_id, IPC_RMID, None)  # Linux still lets others attach it by id until the last detach
        if addr in (None, ctypes.c_void_p(-1).value):
            raise _errno_error("shmat")
        # Not inherited by our forks: each fork would attach it again (and change its lpid/atime).
        if _libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(SHM_SIZE), 10) != 0:  # MADV_DONTFORK
            raise _errno_error("madvise(MADV_DONTFORK)")
        ctypes.memmove(addr, f"sandgate-verify-shm-{token}".encode(), 20 + len(token))
        desc, payload = f"sandgate-verify:{token}", f"KEY-{token}".encode()
        # A session keyring of our own that links the user keyring: the key we add is then ours to
        # set permissions on (possessed) whatever session we were started from (a setpriv'd user
        # inherits root's), and the sandgate run below inherits exactly this, as a user's shell would.
        syscall("keyctl", KEYCTL_JOIN_SESSION_KEYRING, None)
        syscall("keyctl", KEYCTL_LINK, KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING)
        key = syscall("add_key", b"user", desc.encode(), payload, len(payload), KEY_SPEC_USER_KEYRING)
        syscall("keyctl", KEYCTL_SETPERM, key, KEY_PERM)
        syscall("keyctl", KEYCTL_SET_TIMEOUT, key, 900)  # gone by itself even if verify is SIGKILLed
        return cls(socket.gethostname(), shm_id, addr, _shm_state(shm_id), key, desc)

    def spec(self) -> dict[str, Any]:
        return {"shm_id": self.shm_id, "host_key": self.key, "host_key_description": self.key_description}

    def controls(self) -> None:
        """Outside, the targets answer: so a refusal inside is the sandbox's doing."""
        buf = ctypes.create_string_buffer(256)
        syscall("keyctl", KEYCTL_READ, self.key, buf, len(buf))
        if not buf.value.startswith(b"KEY-"):
            raise OSError(f"key {self.key} does not read back outside")

    def evidence(self, ws: Path, tag: str) -> dict[tuple[str, str], str]:
        """{(probe, context or "*"): what the host shows} after one pass; empty if the host is untouched."""
        found: dict[tuple[str, str], str] = {}
        for dirpath, dirnames, filenames in os.walk(ws):
            for n in (*dirnames, *filenames):
                if stat.S_ISBLK(mode := os.lstat(os.path.join(dirpath, n)).st_mode) or stat.S_ISCHR(mode):
                    found["mknod_disk", _ctx_in(n, f"-{{}}-{tag}")] = f"device node left in the workspace: {n}"
        if socket.gethostname() != self.hostname:
            found["sethostname", "*"] = f"the host's hostname is now {socket.gethostname()!r}"
            socket.sethostname(self.hostname)
        if (now := _shm_state(self.shm_id)) != self.shm_seen:
            found["sysv_shm_host", "*"] = f"segment {self.shm_id} was attached meanwhile: {now}"
        text = ctypes.string_at(self.shm_addr, SHM_SIZE).decode(errors="replace")
        if (ctx := _ctx_in(text, f"verify:{{}}-{tag}:")) != "*" or f"-{tag}:" in text:
            found["sysv_shm_host", ctx] = f"segment {self.shm_id} holds a probe's marker: {text[1024:1100]!r}"
        self.shm_seen = now  # what one pass did is no evidence against the next
        return found

    def remove(self) -> None:
        _libc.shmdt(self.shm_addr)  # the last attach: the kernel destroys the segment
        try:
            syscall("keyctl", KEYCTL_INVALIDATE, self.key)
        except OSError:
            pass  # already expired


def _ctx_in(text: str, pattern: str) -> str:
    """The context whose `pattern.format(context)` occurs in `text`, else "*" (all of them)."""
    return next((x for x in ("grandchild", "child", "daemon") if pattern.format(x) in text), "*")


def _shm_state(shm_id: int) -> str:
    """lpid, nattch and atime of a segment from /proc/sysvipc/shm (reading it attaches nothing)."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    head = lines[0].split()
    for line in lines[1:]:
        row = dict(zip(head, line.split(), strict=False))
        if row.get("shmid") == str(shm_id):
            return f"lpid {row.get('lpid')} nattch {row.get('nattch')} atime {row.get('atime')}"
    return "gone"
