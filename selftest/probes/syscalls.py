"""The kernel interfaces glibc does not wrap, or Python does not expose: libc through ctypes, raw syscalls,
file handles, and a forked child for a probe part that changes the process itself (setns).

Used by the probes inside and by verify's outside halves (planted.py). Stdlib only.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
from collections.abc import Callable

from selftest.probes.core import Result, Unsupported, attempt

CHILD_TIMEOUT = 10.0  # a forked probe part (setns) that has not answered by then is killed
MAX_HANDLE_SZ = 128
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
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
LIBC.shmat.restype = ctypes.c_void_p
LIBC.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
LIBC.shmdt.argtypes = [ctypes.c_void_p]
LIBC.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
LIBC.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
LIBC.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def fresh_libc() -> ctypes.CDLL:
    """libc through the running program's symbols (find_library would spawn ldconfig)."""
    return ctypes.CDLL(None, use_errno=True)


class FileHandle(ctypes.Structure):
    """struct file_handle with room for the largest handle (MAX_HANDLE_SZ)."""

    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ),
    ]


def errno_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def syscall(name: str, *args: int | ctypes.Array[ctypes.c_char] | bytes | None) -> int:
    """A raw syscall by name; OSError on failure, Unsupported on a machine not in SYSCALLS."""
    nr = SYSCALLS.get(os.uname().machine, {}).get(name)
    if nr is None:
        raise Unsupported(f"no syscall number for {name} on {os.uname().machine}")
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    rc = int(LIBC.syscall(ctypes.c_long(nr), *conv))
    if rc < 0:
        raise errno_error(name)
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
