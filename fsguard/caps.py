"""Capabilities of the sandboxed command: what a root-inside build keeps, and nothing else.

In v2 the command always runs in its own user namespace, so whatever it holds counts only inside
that namespace, never over the host (v1's review: a root command kept host capabilities and used
nsenter, open_by_handle_at, mknod of the root disk, sethostname, bpf()). Inside, it still must not
hold more than a build needs: capabilities over namespaces this user namespace owns (its network
namespace, its mounts) would let it undo the sandbox from within.

Call in the forked child, in this order, before exec:

1. join_session_keyring()  - a fresh session keyring (needs keyctl: before seccomp.install());
2. clear_ambient()         - no capability survives exec of a non-root program;
3. drop_bounding()         - the ceiling exec can grant, even to uid 0 (needs CAP_SETPCAP: before
                             switching to an ordinary uid);
4. setgroups/setgid/setuid - for an ordinary uid the kernel then clears the permitted set itself;
5. limit_current()         - effective/permitted/inheritable of a root-inside command cut to KEEP;
6. no_new_privs, landlock.apply(), seccomp.install(), exec.

Everything is plain prctl/capget/capset/keyctl through ctypes: no new dependency, and every
failure raises CapsError, so the command never starts with more than planned.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable

from fsguard import seccomp
from fsguard.process import prctl

# include/uapi/linux/capability.h
CAP_CHOWN = 0
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2
CAP_FOWNER = 3
CAP_FSETID = 4
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
CAP_LINUX_IMMUTABLE = 9
CAP_NET_BIND_SERVICE = 10
CAP_NET_BROADCAST = 11
CAP_NET_ADMIN = 12
CAP_NET_RAW = 13
CAP_IPC_LOCK = 14
CAP_IPC_OWNER = 15
CAP_SYS_MODULE = 16
CAP_SYS_RAWIO = 17
CAP_SYS_CHROOT = 18
CAP_SYS_PTRACE = 19
CAP_SYS_PACCT = 20
CAP_SYS_ADMIN = 21
CAP_SYS_BOOT = 22
CAP_SYS_NICE = 23
CAP_SYS_RESOURCE = 24
CAP_SYS_TIME = 25
CAP_SYS_TTY_CONFIG = 26
CAP_MKNOD = 27
CAP_LEASE = 28
CAP_AUDIT_WRITE = 29
CAP_AUDIT_CONTROL = 30
CAP_SETFCAP = 31
CAP_MAC_OVERRIDE = 32
CAP_MAC_ADMIN = 33
CAP_SYSLOG = 34
CAP_WAKE_ALARM = 35
CAP_BLOCK_SUSPEND = 36
CAP_AUDIT_READ = 37
CAP_PERFMON = 38
CAP_BPF = 39
CAP_CHECKPOINT_RESTORE = 40

NAMES: dict[int, str] = {v: k for k, v in dict(globals()).items() if k.startswith("CAP_") and isinstance(v, int)}

# What a root-inside command keeps: enough for apt/dpkg, chown, pip and test servers. Each acts only
# on what the user namespace maps and owns; Landlock and the mount namespace still decide where.
KEEP: frozenset[int] = frozenset(
    {
        CAP_CHOWN,  # dpkg/tar/pip chown unpacked files to their owners (root:root, _apt, ...)
        CAP_DAC_OVERRIDE,  # root ignores file modes, as package scripts expect (0600 files, others' dirs)
        CAP_FOWNER,  # chmod/utime/setxattr on files it does not own (dpkg restores modes and times)
        CAP_FSETID,  # keep an existing setgid bit on chown/write; seccomp refuses setting new setid bits
        CAP_KILL,  # signal its own processes of other uids (apt's _apt helpers); the pid ns holds only ours
        CAP_SETGID,  # apt/su-like tools drop to another gid; only gids the namespace maps exist
        CAP_SETUID,  # apt drops to _apt, test suites switch users; only mapped uids exist
        CAP_SETPCAP,  # a nested sandbox (bwrap, a test harness) drops its own bounding set; cannot raise it
        CAP_NET_BIND_SERVICE,  # test servers on ports < 1024, inside the sandbox's own network namespace
        CAP_SYS_CHROOT,  # debootstrap, dpkg --root, build chroots: inside our mount namespace, under Landlock
    }
)

# Dropped on purpose (everything not in KEEP is dropped; these are the ones an attacker wants most).
WHY_DROPPED: dict[int, str] = {
    CAP_NET_ADMIN: "flush the sandbox's own nftables table, add routes/links/addresses around the proxy",
    CAP_SYS_ADMIN: "mount/umount over the sandbox's view, sethostname, setns into owned namespaces, swapon",
    CAP_SYS_PTRACE: "ptrace and /proc/<pid>/mem of any process of the sandbox, its init included",
    CAP_MKNOD: "device nodes (the root disk, /dev/mem) made in the workspace and opened there",
    CAP_NET_RAW: "raw/packet sockets: spoofed sources, ARP/DHCP games on the veth, probing past the proxy",
    CAP_DAC_READ_SEARCH: "open_by_handle_at: open any inode by handle, past hidden paths (v1: ~/.ssh)",
    CAP_BPF: "BPF programs and maps (v1: bpf() on the host)",
    CAP_PERFMON: "perf events: kernel addresses and side channels",
    CAP_SYS_MODULE: "load/unload kernel modules",
    CAP_SYS_BOOT: "reboot/kexec",
    CAP_SYS_TIME: "set the clock the host's TLS checks and logs rely on",
    CAP_SYS_RAWIO: "iopl/ioperm, raw block and memory devices",
    CAP_SETFCAP: "file capabilities on workspace binaries that grant root's powers when anyone runs them outside",
    CAP_AUDIT_WRITE: "forged records in the host's audit trail",
    CAP_LINUX_IMMUTABLE: "chattr +i on workspace files the user then cannot delete",
    CAP_IPC_LOCK: "mlock without limit: pin the host's memory",
    CAP_SYS_RESOURCE: "exceed rlimits and quotas set for the sandbox",
    CAP_SYSLOG: "dmesg: kernel addresses and other users' messages",
    CAP_CHECKPOINT_RESTORE: "choose pids (set_tid, ns_last_pid), /proc/<pid>/map_files",
}

# include/uapi/linux/prctl.h, capability.h, keyctl.h
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_LINUX_CAPABILITY_U32S_3 = 2
KEYCTL_JOIN_SESSION_KEYRING = 1

_STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class CapsError(OSError):
    """A capability or keyring step failed; the command must not start with more than planned."""


class _CapHeader(ctypes.Structure):
    # struct __user_cap_header_struct { __u32 version; int pid; }
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    # struct __user_cap_data_struct { __u32 effective, permitted, inheritable; }, two of them in v3
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)
_CapDataV3 = _CapData * _LINUX_CAPABILITY_U32S_3
_capget = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData), use_errno=True)(
    ("capget", _libc)
)
_capset = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData), use_errno=True)(
    ("capset", _libc)
)
_libc.syscall.restype = ctypes.c_long


def _fail(what: str) -> CapsError:
    e = ctypes.get_errno()
    return CapsError(e, f"{what}: {os.strerror(e)}")


def mask(caps: Iterable[int]) -> int:
    """The bit mask of a set of capability numbers (the format of /proc/<pid>/status)."""
    out = 0
    for cap in caps:
        if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap < 64:
            raise ValueError(f"not a capability number: {cap!r}")  # a typo must not widen or narrow silently
        out |= 1 << cap
    return out


def names(mask: int) -> list[str]:
    """'CAP_CHOWN', ... for each bit set, lowest first; bits newer than this table as 'CAP_<n>'."""
    return [NAMES.get(i, f"CAP_{i}") for i in range(mask.bit_length()) if mask >> i & 1]


def last_cap() -> int:
    """The highest capability the running kernel knows; probed if /proc is not there to ask."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        # Fail closed: a newer kernel's extra capabilities must be dropped too, so find the real end.
        cap = 0
        while prctl(PR_CAPBSET_READ, cap + 1) >= 0:
            cap += 1
        return cap


def drop_bounding(keep: frozenset[int] = KEEP) -> None:
    """Remove every capability but `keep` from the bounding set: the ceiling of what any later exec,
    even of a root-owned binary by uid 0, can grant. Irreversible, inherited by every descendant."""
    mask(keep)  # validate before the first irreversible step
    for cap in range(last_cap() + 1):
        if cap in keep:
            continue
        present = prctl(PR_CAPBSET_READ, cap)
        if present < 0:
            raise _fail(f"prctl(PR_CAPBSET_READ, {names(1 << cap)[0]})")
        if present and prctl(PR_CAPBSET_DROP, cap) != 0:  # already gone: nothing to drop
            raise _fail(f"prctl(PR_CAPBSET_DROP, {names(1 << cap)[0]})")


def clear_ambient() -> None:
    """Empty the ambient set: otherwise its capabilities pass through exec to any (non-root) program."""
    if prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) != 0:
        raise _fail("prctl(PR_CAP_AMBIENT_CLEAR_ALL)")


def limit_current(keep: frozenset[int] = KEEP) -> None:
    """Cut this process's effective, permitted and inheritable sets to `keep` (only ever lowers them).

    The bounding set alone does not lower what the process already holds until the next exec.
    """
    keep_mask = mask(keep)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = _CapDataV3()
    if _capget(ctypes.byref(header), data) != 0:
        raise _fail("capget")
    if header.version != _LINUX_CAPABILITY_VERSION_3:  # the kernel names the version it wants instead
        raise CapsError(errno.EINVAL, f"capget: kernel wants capability version {header.version:#x}")
    for i, word in enumerate(data):
        bits = (keep_mask >> (32 * i)) & 0xFFFFFFFF
        word.effective &= bits
        word.permitted &= bits
        word.inheritable &= bits
    if _capset(ctypes.byref(header), data) != 0:
        raise _fail("capset")


def parse_status(text: str) -> dict[str, int]:
    """CapInh/CapPrm/CapEff/CapBnd/CapAmb of a /proc/<pid>/status text, as ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in _STATUS_FIELDS:
            out[key] = int(value.strip(), 16)
    missing = [k for k in _STATUS_FIELDS if k not in out]
    if missing:
        raise ValueError(f"no {', '.join(missing)} in the status text")
    return out


def current() -> dict[str, int]:
    """This process's capability sets as the kernel reports them (for tests and `sandgate verify`)."""
    with open("/proc/self/status") as f:
        return parse_status(f.read())


def join_session_keyring() -> None:
    """Start a new anonymous session keyring, so the sandbox never shares the caller's.

    Threat: keys in root's (or the user's) session keyring - Kerberos tickets, ecryptfs/dm-crypt and
    NFS keys - readable from inside. Call before seccomp.install(), which then refuses keyctl.
    """
    nr = seccomp.syscall_number("keyctl")
    ctypes.set_errno(0)
    serial = _libc.syscall(
        ctypes.c_long(nr),
        ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
        ctypes.c_void_p(None),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if serial < 0:
        raise _fail("keyctl(KEYCTL_JOIN_SESSION_KEYRING)")
