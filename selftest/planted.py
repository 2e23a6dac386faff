"""The host's state verify plants before a run and reads back after it: the host probes' outside half.

Run OUTSIDE by verify, never inside: a SysV segment and a key in the user keyring for the probes
to reach for, the file handle of the fake ~/.ssh key, the root disk's device numbers. After each
pass the host is read back (a segment attached, a device node in the workspace, a changed
hostname), so a blocked row is judged by the probe AND by what the host shows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from selftest import markers
from selftest.probes import privileges
from selftest.probes.core import CONTEXTS
from selftest.probes.syscalls import (
    IPC_CREAT,
    IPC_PRIVATE,
    IPC_RMID,
    KEY_PERM,
    KEY_SPEC_SESSION_KEYRING,
    KEY_SPEC_USER_KEYRING,
    KEYCTL_INVALIDATE,
    KEYCTL_JOIN_SESSION_KEYRING,
    KEYCTL_LINK,
    KEYCTL_READ,
    KEYCTL_SET_TIMEOUT,
    KEYCTL_SETPERM,
    LIBC,
    MAX_HANDLE_SZ,
    SHM_SIZE,
    FileHandle,
    errno_error,
    syscall,
)
from selftest.spec import FileHandleSpec


def file_handle(path: Path) -> FileHandleSpec:
    """name_to_handle_at(path) as spec data: what open_by_handle tries inside (needs no privilege)."""
    fh, mount_id = FileHandle(), ctypes.c_int()
    fh.handle_bytes = MAX_HANDLE_SZ
    if LIBC.name_to_handle_at(-100, os.fsencode(path), ctypes.byref(fh), ctypes.byref(mount_id), 0) != 0:  # AT_FDCWD
        raise errno_error(f"name_to_handle_at({path})")
    return FileHandleSpec(type=fh.handle_type, hex=bytes(fh.f_handle[: fh.handle_bytes]).hex())


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
        shm_id = LIBC.shmget(IPC_PRIVATE, SHM_SIZE, IPC_CREAT | 0o666)
        if shm_id < 0:
            raise errno_error("shmget")
        addr = LIBC.shmat(shm_id, None, 0)
        LIBC.shmctl(shm_id, IPC_RMID, None)  # Linux still lets others attach it by id until the last detach
        if addr in (None, ctypes.c_void_p(-1).value):
            raise errno_error("shmat")
        # Not inherited by our forks: each fork would attach it again (and change its lpid/atime).
        if LIBC.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(SHM_SIZE), 10) != 0:  # MADV_DONTFORK
            raise errno_error("madvise(MADV_DONTFORK)")
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

    def controls(self) -> None:
        """Outside, the targets answer: so a refusal inside is the sandbox's doing."""
        buf = ctypes.create_string_buffer(256)
        syscall("keyctl", KEYCTL_READ, self.key, buf, len(buf))
        if not buf.value.startswith(b"KEY-"):
            raise OSError(f"key {self.key} does not read back outside")

    def evidence(self, ws: Path, tag: str) -> dict[tuple[str, str], str]:
        """{(probe, context or "*"): what the host shows} after one pass; empty if the host is untouched."""
        found: dict[tuple[str, str], str] = {}

        def node(ctx: str) -> str:  # what mknod_disk names its node in this context
            return markers.disk_node(markers.mark(ctx, tag))

        def payload(ctx: str) -> str:  # what every payload of this context starts with
            return markers.payload(markers.mark(ctx, tag), "")

        for dirpath, dirnames, filenames in os.walk(ws):
            for n in (*dirnames, *filenames):
                if stat.S_ISBLK(mode := os.lstat(os.path.join(dirpath, n)).st_mode) or stat.S_ISCHR(mode):
                    found["mknod_disk", _ctx_in(n, node)] = f"device node left in the workspace: {n}"
                for probe, seen in privileges.left_behind(os.path.join(dirpath, n), mode).items():  # issue 24
                    found[probe, _ctx_in(n, lambda ctx: privileges.planted_name(markers.mark(ctx, tag)))] = seen
        if socket.gethostname() != self.hostname:
            found["sethostname", "*"] = f"the host's hostname is now {socket.gethostname()!r}"
            socket.sethostname(self.hostname)
        if (now := _shm_state(self.shm_id)) != self.shm_seen:
            found["sysv_shm_host", "*"] = f"segment {self.shm_id} was attached meanwhile: {now}"
        text = ctypes.string_at(self.shm_addr, SHM_SIZE).decode(errors="replace")
        if (ctx := _ctx_in(text, payload)) != "*" or markers.tag_trace(tag) in text:
            found["sysv_shm_host", ctx] = f"segment {self.shm_id} holds a probe's marker: {text[1024:1100]!r}"
        self.shm_seen = now  # what one pass did is no evidence against the next
        return found

    def remove(self) -> None:
        LIBC.shmdt(self.shm_addr)  # the last attach: the kernel destroys the segment
        try:
            syscall("keyctl", KEYCTL_INVALIDATE, self.key)
        except OSError:
            pass  # already expired


def _ctx_in(text: str, marked: Callable[[str], str]) -> str:
    """The context whose `marked(context)` occurs in `text`, else "*" (all of them).

    grandchild is tried before child: "child" is part of its name."""
    return next((x for x in sorted(CONTEXTS, key=len, reverse=True) if marked(x) in text), "*")


def _shm_state(shm_id: int) -> str:
    """lpid, nattch and atime of a segment from /proc/sysvipc/shm (reading it attaches nothing)."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    head = lines[0].split()
    for line in lines[1:]:
        row = dict(zip(head, line.split(), strict=False))
        if row.get("shmid") == str(shm_id):
            return f"lpid {row.get('lpid')} nattch {row.get('nattch')} atime {row.get('atime')}"
    return "gone"
