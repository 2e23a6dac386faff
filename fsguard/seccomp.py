"""A small seccomp-BPF filter for the sandboxed command, inherited by every descendant and across exec.

It does not try to be a syscall allowlist (the namespaces, Landlock, dropped capabilities and
nftables are the boundary); it refuses a short list of calls a build never needs and an attacker
loves, each named in RULES (the whole call) or ARG_RULES (the call with one argument's bits) with
the errno it gets and the threat it defends:

* keystroke injection: ioctl(TIOCSTI) pushes bytes into the input queue of a terminal the command
  can reach, so they are read, and run, by the user's shell after the command exits; TIOCLINUX can
  paste the console selection the same way (and dump the screen). On a terminal the command's
  stdin/stdout are a pty of the sandbox's own (fsguard/sandboxpty.py), but the user's terminal is
  still inside as a stderr that is the only terminal, and the filter costs nothing;
* io_uring: its operations are performed by kernel workers, not as syscalls, so seccomp filters
  (ours or anyone's stacked later) never see them. Refused with ENOSYS so programs fall back to
  ordinary read/write instead of failing;
* kernel attack surface and host state that no namespace isolates: bpf, perf_event_open, the
  keyring calls (keyctl, add_key, request_key), open_by_handle_at, module loading and kexec, and
  userfaultfd (the classic tool for winning kernel races). Refused with EPERM, the answer the
  kernel itself gives an unprivileged caller, so tools take their "not allowed here" path;
* setuid/setgid bits and file capabilities (issue 24: started by root, the command is uid 0 mapped
  to host root, and `chmod 6755` on a copy of `id` gave every local account euid 0). Every call that
  sets a mode refuses S_ISUID/S_ISGID with EPERM (the chmod family; open/openat/creat/mknod when
  they create); openat2 carries its mode in a struct the filter cannot read: ENOSYS, and callers
  fall back to openat. security.capability is a name behind a pointer, but the kernel takes it
  only at 20 or 24 bytes (v2/v3 headers): setxattr & co. of those sizes are refused (a user.*
  xattr of exactly that size is refused too), setxattrat (size in a struct) is ENOSYS;
* nested user namespaces (issue 24: CLONE_NEWUSER|CLONE_NEWNET gave the command CAP_NET_ADMIN over
  a network namespace of its own, and with it nf_tables, where most recent kernel privilege
  escalations live): unshare and clone with CLONE_NEWUSER get EPERM, clone3 (flags in a struct)
  ENOSYS, so glibc falls back to clone. `sandgate run --allow-nested-userns` leaves these out.

Deliberately left allowed: setns/unshare of other namespaces (the capability checks already refuse
entering the host's), name_to_handle_at (tools use it for mount ids; a handle is useless without
open_by_handle_at), ptrace and process_vm_readv/writev (debuggers inside need them; the pid
namespace and Landlock's scope keep outside processes away).

The filter first checks the audit arch and (on x86_64) the x32 bit: a syscall's number means nothing
until we know which table it indexes, and the 32-bit/x32 tables would otherwise carry every call we
refuse under a number we do not check.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import NamedTuple

from fsguard.process import PR_SET_NO_NEW_PRIVS, prctl

# --- classic BPF opcodes (linux/bpf_common.h) -------------------------------------------------
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word at seccomp_data + k
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K:  pc += (A == k) ? jt : jf
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K:  pc += (A >= k) ? jt : jf  (unsigned)
BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K: pc += (A & k) ? jt : jf
BPF_RET_K = 0x06  # BPF_RET | BPF_K:            return k

# --- seccomp (linux/seccomp.h, linux/prctl.h) -------------------------------------------------
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000  # low 16 bits: the errno the syscall fails with
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
OFF_NR = 0
OFF_ARCH = 4
OFF_ARGS = 16

X32_SYSCALL_BIT = 0x40000000

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
SETID_BITS = 0o4000 | 0o2000  # S_ISUID | S_ISGID
CREATES = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE (same on x86_64 and arm64): the mode is used only then
CAPS_XATTR_SIZES = (20, 24)  # XATTR_CAPS_SZ_2, _3: the only sizes the kernel takes for security.capability
CLONE_NEWUSER = 0x10000000


class Rule(NamedTuple):
    """One refused syscall: its name (a key of SYSCALL_NRS[arch]), the errno it fails with, and why."""

    syscall: str
    errno: int
    threat: str


class Test(NamedTuple):
    """One condition on the low 32 bits of argument `arg` (every argument we test is an int, a mode,
    flags or a size the kernel truncates or bounds there): any of `bits` set, or, with `values`,
    equal to one of them."""

    arg: int
    bits: int = 0
    values: tuple[int, ...] = ()


class ArgRule(NamedTuple):
    """A syscall refused only when every one of its tests holds."""

    syscall: str
    tests: tuple[Test, ...]
    errno: int
    threat: str


_SETUID = "setuid/setgid files that give other local accounts the command's uid (issue 24: host root)"
_FILECAP = "security.capability (only 20/24 bytes): file capabilities honoured outside the sandbox"
_NESTED = "a nested user namespace: CAP_NET_ADMIN over a netns of its own, nf_tables' attack surface"

# The filter, in the order it checks.
RULES: tuple[Rule, ...] = (
    Rule("io_uring_setup", errno.ENOSYS, "I/O done by kernel workers that no seccomp filter inspects"),
    Rule("io_uring_enter", errno.ENOSYS, "I/O done by kernel workers that no seccomp filter inspects"),
    Rule("io_uring_register", errno.ENOSYS, "I/O done by kernel workers that no seccomp filter inspects"),
    Rule("bpf", errno.EPERM, "BPF programs/maps: verifier bugs, and bpf() on the host (v1 review)"),
    Rule("perf_event_open", errno.EPERM, "kernel address and side-channel leaks, a long CVE history"),
    Rule("keyctl", errno.EPERM, "keyrings are not namespaced: root's keys readable (v1 review)"),
    Rule("add_key", errno.EPERM, "keyrings are not namespaced: plant keys for host processes"),
    Rule("request_key", errno.EPERM, "keyrings are not namespaced: search the host's keys, run upcalls"),
    Rule("open_by_handle_at", errno.EPERM, "opens inodes by handle, past hidden paths (v1: read ~/.ssh)"),
    Rule("init_module", errno.EPERM, "load code into the host kernel"),
    Rule("finit_module", errno.EPERM, "load code into the host kernel"),
    Rule("delete_module", errno.EPERM, "unload host kernel modules (netfilter, the disk driver)"),
    Rule("kexec_load", errno.EPERM, "replace the running host kernel"),
    Rule("kexec_file_load", errno.EPERM, "replace the running host kernel"),
    Rule("userfaultfd", errno.EPERM, "stall kernel page faults to win kernel races (exploit primitive)"),
    Rule("openat2", errno.ENOSYS, "its mode is in a struct the filter cannot read: " + _SETUID),
    Rule("setxattrat", errno.ENOSYS, "its size is in a struct the filter cannot read: " + _FILECAP),
)
ARG_RULES: tuple[ArgRule, ...] = (
    ArgRule("ioctl", (Test(1, values=(TIOCSTI,)),), errno.EPERM, "TIOCSTI: keystrokes run by the user's shell later"),
    ArgRule("ioctl", (Test(1, values=(TIOCLINUX,)),), errno.EPERM, "TIOCLINUX: paste the VT selection as input"),
    ArgRule("chmod", (Test(1, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("fchmod", (Test(1, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("fchmodat", (Test(2, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("fchmodat2", (Test(2, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("open", (Test(1, CREATES), Test(2, SETID_BITS)), errno.EPERM, _SETUID),
    ArgRule("openat", (Test(2, CREATES), Test(3, SETID_BITS)), errno.EPERM, _SETUID),
    ArgRule("creat", (Test(1, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("mknod", (Test(1, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("mknodat", (Test(2, SETID_BITS),), errno.EPERM, _SETUID),
    ArgRule("setxattr", (Test(3, values=CAPS_XATTR_SIZES),), errno.EPERM, _FILECAP),
    ArgRule("lsetxattr", (Test(3, values=CAPS_XATTR_SIZES),), errno.EPERM, _FILECAP),
    ArgRule("fsetxattr", (Test(3, values=CAPS_XATTR_SIZES),), errno.EPERM, _FILECAP),
)
# Left out by `--allow-nested-userns` (a command that makes namespaces of its own: `unshare -U -n`).
NESTED_RULES: tuple[Rule, ...] = (Rule("clone3", errno.ENOSYS, "its flags are in a struct: " + _NESTED),)
NESTED_ARG_RULES: tuple[ArgRule, ...] = (
    ArgRule("unshare", (Test(0, CLONE_NEWUSER),), errno.EPERM, _NESTED),
    ArgRule("clone", (Test(0, CLONE_NEWUSER),), errno.EPERM, _NESTED),  # flags: args[0] on both arches
)
#: The old-style calls the generic table (aarch64) does not have: their rules apply on x86_64 only.
LEGACY = frozenset({"open", "creat", "chmod", "mknod"})

# Native syscall numbers. x86_64: /usr/include/x86_64-linux-gnu/asm/unistd_64.h; aarch64 uses the
# generic table, /usr/include/asm-generic/unistd.h. tests/unit/test_seccomp.py re-reads both headers.
# fchmodat2 (Linux 6.6) and setxattrat (6.13) have one number on every arch (the unified table).
SYSCALL_NRS: dict[str, dict[str, int]] = {
    "x86_64": {
        "ioctl": 16,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 321,
        "perf_event_open": 298,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "open_by_handle_at": 304,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "userfaultfd": 323,
        "openat2": 437,
        "setxattrat": 463,
        "chmod": 90,
        "fchmod": 91,
        "fchmodat": 268,
        "fchmodat2": 452,
        "open": 2,
        "openat": 257,
        "creat": 85,
        "mknod": 133,
        "mknodat": 259,
        "setxattr": 188,
        "lsetxattr": 189,
        "fsetxattr": 190,
        "clone3": 435,
        "unshare": 272,
        "clone": 56,
    },
    "aarch64": {
        "ioctl": 29,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 280,
        "perf_event_open": 241,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "open_by_handle_at": 265,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "userfaultfd": 282,
        "openat2": 437,
        "setxattrat": 463,
        "fchmod": 52,
        "fchmodat": 53,
        "fchmodat2": 452,
        "openat": 56,
        "mknodat": 33,
        "setxattr": 5,
        "lsetxattr": 6,
        "fsetxattr": 7,
        "clone3": 435,
        "unshare": 97,
        "clone": 220,
    },
}

# arch name -> (AUDIT_ARCH_*, has the x32 ABI)
_ARCHES: dict[str, tuple[int, bool]] = {
    "x86_64": (0xC000003E, True),
    "aarch64": (0xC00000B7, False),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

# The maximum jump distance of a classic BPF conditional jump (u8 jt/jf).
_MAX_JUMP = 0xFF

_Asm = list[tuple[int, str | None, str | None, int] | str]


class SeccompError(OSError):
    """The filter could not be built or installed; the caller must not exec the command unfiltered."""


def _normalise_arch(arch: str | None) -> str:
    name = (arch if arch is not None else os.uname().machine).lower()  # platform.machine()'s value, without its import
    name = _ALIASES.get(name, name)
    if name not in _ARCHES:
        # Fail closed: the sandbox must not run without the filter just because we lack its numbers.
        raise SeccompError(errno.EINVAL, f"seccomp filter: unsupported architecture {name!r}")
    return name


def syscall_number(name: str, arch: str | None = None) -> int:
    """The native number of a syscall in our table (arch None -> this machine), for raw syscall() callers."""
    return SYSCALL_NRS[_normalise_arch(arch)][name]


def rules(nested_userns: bool = False) -> tuple[tuple[Rule, ...], tuple[ArgRule, ...]]:
    """The whole-call and argument rules of one filter; `nested_userns`: --allow-nested-userns."""
    if nested_userns:
        return RULES, ARG_RULES
    return (*RULES, *NESTED_RULES), (*ARG_RULES, *NESTED_ARG_RULES)


def build_filter(arch: str | None = None, nested_userns: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program as (code, jt, jf, k) tuples for arch 'x86_64' or 'aarch64'
    (None -> the kernel's machine name); `nested_userns` leaves out the CLONE_NEWUSER rules.

    Pure, so its shape and semantics can be tested on any machine for both architectures.
    Jumps name labels and are resolved here, so adding an instruction cannot leave a hand-counted
    offset pointing at the wrong place.
    """
    name = _normalise_arch(arch)
    audit_arch, has_x32 = _ARCHES[name]
    nrs = SYSCALL_NRS[name]
    whole, by_args = rules(nested_userns)
    # The legacy calls do not exist on the generic table; any other missing name is a KeyError (fail closed).
    by_args = tuple(r for r in by_args if r.syscall in nrs or not (r.syscall in LEGACY and name == "aarch64"))

    # (code, true-label, false-label, k); None = fall through to the next instruction.
    asm: _Asm = [
        # Threat: 32-bit syscalls (int 0x80 on x86_64, AArch32 compat on arm64) index another
        # table (ioctl is 54 on i386), so every number check below would be bypassed.
        (BPF_LD_W_ABS, None, None, OFF_ARCH),
        (BPF_JEQ_K, None, f"errno{errno.EPERM}", audit_arch),
        # From here on nr is a native syscall number.
        (BPF_LD_W_ABS, None, None, OFF_NR),
    ]
    if has_x32:
        # Threat: x32 syscalls carry the native arch but nr | 0x40000000 (ioctl is 0x40000010),
        # another way around the number checks.
        asm.append((BPF_JGE_K, f"errno{errno.EPERM}", None, X32_SYSCALL_BIT))
    # Each refused syscall jumps to the RET of its errno; the threat of each is in RULES.
    asm += [(BPF_JEQ_K, f"errno{rule.errno}", None, nrs[rule.syscall]) for rule in whole]
    # A syscall with argument rules jumps to its own block, which ends in a RET (A is clobbered there).
    calls = list(dict.fromkeys(r.syscall for r in by_args))
    asm += [
        (BPF_JEQ_K, f"call-{call}", None if i + 1 < len(calls) else "allow", nrs[call]) for i, call in enumerate(calls)
    ]
    for call in calls:
        asm += _call_block(call, [r for r in by_args if r.syscall == call])
    asm += ["allow", (BPF_RET_K, None, None, SECCOMP_RET_ALLOW)]  # everything else is not our business
    for err in sorted({errno.EPERM, *(r.errno for r in whole), *(r.errno for r in by_args)}):
        asm += [f"errno{err}", (BPF_RET_K, None, None, SECCOMP_RET_ERRNO | err)]
    return _assemble(asm)


def _call_block(call: str, arg_rules: list[ArgRule]) -> _Asm:
    """`call-<name>`: its rules in turn; the first whose tests all hold returns its errno, none: allow.

    Only the low word of an argument is loaded: the kernel takes modes (umode_t), flags (int),
    ioctl's cmd (unsigned int) and clone's flags (lower_32_bits) from there, and a high word it
    ignores must not let a caller dodge a test. A size with a high word set is E2BIG anyway."""
    asm: _Asm = [f"call-{call}"]
    for i, rule in enumerate(arg_rules):
        miss = f"call-{call}-{i + 1}" if i + 1 < len(arg_rules) else "allow"
        for j, test in enumerate(rule.tests):
            hit = f"call-{call}-{i}-{j + 1}" if j + 1 < len(rule.tests) else f"errno{rule.errno}"
            if j:
                asm.append(f"call-{call}-{i}-{j}")
            elif i:
                asm.append(f"call-{call}-{i}")
            asm.append((BPF_LD_W_ABS, None, None, OFF_ARGS + 8 * test.arg))  # little-endian: low word first
            if not test.values:
                asm.append((BPF_JSET_K, hit, miss, test.bits))
                continue
            for v in test.values[:-1]:
                asm.append((BPF_JEQ_K, hit, None, v))
            asm.append((BPF_JEQ_K, hit, miss, test.values[-1]))
    return asm


def _assemble(asm: list[tuple[int, str | None, str | None, int] | str]) -> list[tuple[int, int, int, int]]:
    labels: dict[str, int] = {}
    body: list[tuple[int, str | None, str | None, int]] = []
    for item in asm:
        if isinstance(item, str):
            labels[item] = len(body)
        else:
            body.append(item)

    def offset(pc: int, label: str | None) -> int:
        if label is None:
            return 0
        off = labels[label] - pc - 1
        if not 0 <= off <= _MAX_JUMP:
            raise AssertionError(f"BPF jump from {pc} to {label!r} out of range: {off}")
        return off

    return [(code, offset(pc, jt), offset(pc, jf), k) for pc, (code, jt, jf, k) in enumerate(body)]


class _SockFilter(ctypes.Structure):
    # struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; }
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }: ctypes inserts the
    # padding before the pointer that the C compiler does (pointer at offset 8 on 64-bit).
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _call_prctl(option: int, arg2: int, arg3: int, what: str) -> None:
    if prctl(option, arg2, arg3) != 0:
        e = ctypes.get_errno()
        raise SeccompError(e, f"prctl({what}): {os.strerror(e)}")


def install(nested_userns: bool = False) -> None:
    """Install the filter on the calling thread; call in the child before exec, after PR_SET_NO_NEW_PRIVS.
    `nested_userns` (--allow-nested-userns) leaves out the CLONE_NEWUSER rules.

    Sets no_new_privs itself too (idempotent): the kernel refuses an unprivileged filter without it,
    and with it a setuid binary exec'd later cannot shed the filter's intent. The filter is
    inherited by fork/clone and kept across execve, so it covers every descendant of the command.
    Only the calling thread is filtered: call it where the process is single-threaded (after fork).
    Raises SeccompError instead of running the command unfiltered.
    """
    program = build_filter(nested_userns=nested_userns)
    insns = (_SockFilter * len(program))(*(_SockFilter(c, jt, jf, k) for c, jt, jf, k in program))
    fprog = _SockFprog(len(program), ctypes.cast(insns, ctypes.POINTER(_SockFilter)))
    _call_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, "PR_SET_NO_NEW_PRIVS")
    _call_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), "PR_SET_SECCOMP")
