"""Attacks a sandboxed command tries on the host (run inside the sandbox, and outside as the control).

`python attacks.py NAME ARGS...` prints one JSON object: {"attack", "ok" (the attack worked),
"errno" (the refusal's name, when refused), "detail"}. Stdlib + ctypes only: it runs under the
sandbox's Python, as root inside or as an ordinary user.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Callable

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NEWNET = 0x40000000
NR = {
    "x86_64": {"bpf": 321, "keyctl": 250, "open_by_handle_at": 304},
    "aarch64": {"bpf": 280, "keyctl": 219, "open_by_handle_at": 265},
}[os.uname().machine]


def _err(e: int) -> str:
    return errno.errorcode.get(e, str(e))


def _result(ok: bool, err: int = 0, detail: str = "") -> dict[str, object]:
    return {"ok": ok, "errno": _err(err) if err else None, "detail": detail}


def connect_canary(target: str) -> str:
    host, port = target.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=3)
        s.sendall(b"escape\n")
        s.settimeout(3)
        return s.recv(100).decode("latin-1")
    except OSError as e:
        return f"error: {e}"


def attack_setns(path: str, target: str) -> dict[str, object]:
    """Enter a named network namespace of the host, then connect out from it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return _result(False, e.errno or 0, "open")
    if libc.setns(fd, CLONE_NEWNET) != 0:
        return _result(False, ctypes.get_errno(), "setns")
    reply = connect_canary(target)
    return _result("tcp-canary" in reply, 0, reply)


def attack_handle(handle_type: str, handle_hex: str) -> dict[str, object]:
    """open_by_handle_at a file the mounts hide, by its handle (learned outside)."""
    raw = bytes.fromhex(handle_hex)
    fh = ctypes.create_string_buffer(struct.pack("Ii", len(raw), int(handle_type)) + raw)
    mount_fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    fd = libc.syscall(NR["open_by_handle_at"], mount_fd, fh, os.O_RDONLY)
    if fd < 0:
        return _result(False, ctypes.get_errno(), "open_by_handle_at")
    return _result(True, 0, os.read(fd, 200).decode("latin-1"))


def attack_environ(needle: str) -> dict[str, object]:
    """Look for a dropped variable's value in every readable /proc/*/environ (init's included)."""
    found, denied = [], []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle.encode() in f.read():
                    found.append(pid)
        except OSError as e:
            denied.append(f"{pid}:{_err(e.errno or 0)}")
    return _result(bool(found), 0, f"found in {found}; unreadable {denied}")


def attack_shm(shmid: str) -> dict[str, object]:
    """Attach the host's SysV shared memory segment by id."""
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(int(shmid), None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return _result(False, ctypes.get_errno(), "shmat")
    return _result(True, 0, ctypes.string_at(addr, 16).decode("latin-1"))


def attack_keyring(key_id: str) -> dict[str, object]:
    """Read a key the caller put in its user keyring (KEYCTL_READ = 11)."""
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(NR["keyctl"], 11, int(key_id), buf, 256)
    if n < 0:
        return _result(False, ctypes.get_errno(), "keyctl read")
    return _result(True, 0, buf.raw[:n].decode("latin-1"))


def attack_mknod(path: str, major: str, minor: str) -> dict[str, object]:
    """A block device node of the host's disk in the workspace (raw disk access as root)."""
    import stat

    try:
        os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(int(major), int(minor)))
    except OSError as e:
        return _result(False, e.errno or 0, "mknod")
    return _result(True, 0, "created")


def attack_hostname(name: str) -> dict[str, object]:
    try:
        socket.sethostname(name)
    except OSError as e:
        return _result(False, e.errno or 0, "sethostname")
    return _result(True, 0, f"now {socket.gethostname()}")


def attack_bpf() -> dict[str, object]:
    """BPF_MAP_CREATE (cmd 0) of a small array map."""
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1) + bytes(112))
    fd = libc.syscall(NR["bpf"], 0, attr, len(attr))
    if fd < 0:
        return _result(False, ctypes.get_errno(), "bpf")
    return _result(True, 0, "map created")


def attack_nft(target: str) -> dict[str, object]:
    """Flush the sandbox's own table, add a link/route/address if possible, then connect out."""
    steps = []
    for cmd in (
        ["nft", "flush", "ruleset"],
        ["ip", "link", "add", "sgx0", "type", "veth", "peer", "sgx1"],
        ["ip", "addr", "add", "198.51.100.99/24", "dev", "lo"],
        ["ip", "route", "replace", "default", "dev", "lo"],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True)
        steps.append(f"{cmd[0]} {cmd[1]}: rc={r.returncode} {r.stderr.strip()[:80]}")
    reply = connect_canary(target)
    return _result("tcp-canary" in reply, 0, "; ".join(steps) + f"; connect: {reply}")


def attack_control(path: str) -> dict[str, object]:
    """Reach the proxy daemon's control socket (and bind itself a wider policy)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    except OSError as e:
        return _result(False, e.errno or 0, "connect")
    s.send(b'{"op":"status"}')
    return _result(True, 0, s.recv(4096).decode("latin-1"))


ATTACKS: dict[str, Callable[..., dict[str, object]]] = {
    "control": attack_control,
    "setns": attack_setns,
    "handle": attack_handle,
    "environ": attack_environ,
    "shm": attack_shm,
    "keyring": attack_keyring,
    "mknod": attack_mknod,
    "hostname": attack_hostname,
    "bpf": attack_bpf,
    "nft": attack_nft,
}

if __name__ == "__main__":
    name, args = sys.argv[1], sys.argv[2:]
    out = {"attack": name, **ATTACKS[name](*args)}
    print(json.dumps(out), flush=True)
