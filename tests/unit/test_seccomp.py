"""The seccomp filter: its BPF program (pure, both arches) and its effect in a real kernel.

Every kernel test FORKS: the filter can never be removed, so the pytest process itself must stay
unfiltered (an autouse fixture checks that). Each refusal is paired with a control run in the same
child before install(), proving the attempt works here and the test could fail.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import platform
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsguard import seccomp
from fsguard.seccomp import SeccompError, build_filter, install

from ..support.kernelprobe import attempt, exec_in_child, in_child

# Written out independently of the module so a wrong constant there cannot hide here.
ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
LD_ABS_W, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
AUDIT_I386, AUDIT_ARM = 0x40000003, 0x40000028
NR_IOCTL = {"x86_64": 16, "aarch64": 29}
TIOCSTI, TIOCLINUX, TIOCGWINSZ = 0x5412, 0x541C, 0x5413
ARCHES = ["x86_64", "aarch64"]
# name: (x86_64, aarch64, errno): every syscall the filter refuses outright, whatever its arguments.
REFUSED = {
    "io_uring_setup": (425, 425, errno.ENOSYS),
    "io_uring_enter": (426, 426, errno.ENOSYS),
    "io_uring_register": (427, 427, errno.ENOSYS),
    "bpf": (321, 280, errno.EPERM),
    "perf_event_open": (298, 241, errno.EPERM),
    "keyctl": (250, 219, errno.EPERM),
    "add_key": (248, 217, errno.EPERM),
    "request_key": (249, 218, errno.EPERM),
    "open_by_handle_at": (304, 265, errno.EPERM),
    "init_module": (175, 105, errno.EPERM),
    "finit_module": (313, 273, errno.EPERM),
    "delete_module": (176, 106, errno.EPERM),
    "kexec_load": (246, 104, errno.EPERM),
    "kexec_file_load": (320, 294, errno.EPERM),
    "userfaultfd": (323, 282, errno.EPERM),
    "openat2": (437, 437, errno.ENOSYS),  # its mode is in a struct: callers fall back to openat
    "setxattrat": (463, 463, errno.ENOSYS),  # its size is in a struct: security.capability unchecked
}
#: Refused outright unless --allow-nested-userns: clone3's flags are in a struct (glibc falls back to clone).
NESTED_REFUSED = {"clone3": (435, 435, errno.ENOSYS)}
SETID, CREATES, NEWUSER = 0o6000, 0o100 | 0o20000000, 0x10000000  # S_ISUID|S_ISGID, O_CREAT|__O_TMPFILE
#: name: (x86_64, aarch64 or None, ((arg, bits or None, values), ...)): refused with EPERM when every
#: test holds on the argument's low word (bits: any set; values: equal to one).
ARG_REFUSED: dict[str, tuple[int, int | None, tuple[tuple[int, int | None, tuple[int, ...]], ...]]] = {
    "chmod": (90, None, ((1, SETID, ()),)),
    "fchmod": (91, 52, ((1, SETID, ()),)),
    "fchmodat": (268, 53, ((2, SETID, ()),)),
    "fchmodat2": (452, 452, ((2, SETID, ()),)),
    "open": (2, None, ((1, CREATES, ()), (2, SETID, ()))),
    "openat": (257, 56, ((2, CREATES, ()), (3, SETID, ()))),
    "creat": (85, None, ((1, SETID, ()),)),
    "mknod": (133, None, ((1, SETID, ()),)),
    "mknodat": (259, 33, ((2, SETID, ()),)),
    "setxattr": (188, 5, ((3, None, (20, 24)),)),
    "lsetxattr": (189, 6, ((3, None, (20, 24)),)),
    "fsetxattr": (190, 7, ((3, None, (20, 24)),)),
}
NESTED_ARG_REFUSED = {"unshare": (272, 97, ((0, NEWUSER, ()),)), "clone": (56, 220, ((0, NEWUSER, ()),))}
#: New calls the installed headers may not list yet: one number on every arch (the unified table).
UNIFIED = {"fchmodat2": 452, "setxattrat": 463}
# Deliberately allowed (nested sandboxes, debuggers, mount ids): a regression that refused them breaks builds.
KEPT = {
    "name_to_handle_at": (303, 264),
    "setns": (308, 268),
    "unshare": (272, 97),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
}
HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}
MACHINE = platform.machine()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


# --------------------------------------------------------------------------------------------
# Pure: shape of the program
# --------------------------------------------------------------------------------------------


def _successors(prog: list[tuple[int, int, int, int]], pc: int) -> list[int]:
    code, jt, jf, _ = prog[pc]
    if code == RET_K:
        return []
    if code in (JEQ_K, JGE_K, JSET_K):
        return [pc + 1 + jt, pc + 1 + jf]
    return [pc + 1]


@pytest.mark.parametrize("nested", [False, True], ids=["default", "nested-userns"])
@pytest.mark.parametrize("arch", ARCHES)
def test_program_is_well_formed(arch: str, nested: bool) -> None:
    prog = build_filter(arch, nested_userns=nested)
    assert 0 < len(prog) <= 4096  # BPF_MAXINSNS
    for pc, (code, jt, jf, k) in enumerate(prog):
        assert all(isinstance(v, int) for v in (code, jt, jf, k))
        assert 0 <= code <= 0xFFFF and 0 <= jt <= 0xFF and 0 <= jf <= 0xFF and 0 <= k <= 0xFFFFFFFF
        assert code in (LD_ABS_W, JEQ_K, JGE_K, JSET_K, RET_K), f"{pc}: unexpected opcode {code:#x}"
        if code == LD_ABS_W:
            # Aligned 32-bit loads inside struct seccomp_data (64 bytes), as the kernel demands.
            assert k % 4 == 0 and k + 4 <= 64, pc
        if code in (LD_ABS_W, RET_K):
            assert jt == jf == 0, pc
        if code == RET_K:
            assert k in (ALLOW, EPERM, ENOSYS), f"{pc}: unexpected action {k:#x}"
        for succ in _successors(prog, pc):
            assert pc < succ < len(prog), f"{pc}: jump target {succ} out of range"
    # Jumps only go forward and stay in range, so ending in RET means every path ends in a RET.
    assert prog[-1][0] == RET_K
    # Nothing unreachable: dead code in a filter is a misrouted branch.
    reached, todo = set(), [0]
    while todo:
        pc = todo.pop()
        if pc not in reached:
            reached.add(pc)
            todo += _successors(prog, pc)
    assert reached == set(range(len(prog)))


@pytest.mark.parametrize("arch", ARCHES)
def test_arch_is_checked_before_anything_else(arch: str) -> None:
    prog = build_filter(arch)
    assert prog[0] == (LD_ABS_W, 0, 0, 4)  # A = seccomp_data.arch
    code, jt, jf, k = prog[1]
    assert (code, jt, k) == (JEQ_K, 0, AUDIT[arch])
    assert prog[1 + 1 + jf] == (RET_K, 0, 0, EPERM)  # foreign arch -> EPERM
    assert prog[2] == (LD_ABS_W, 0, 0, 0)  # only then A = nr
    if arch == "x86_64":  # x32 is refused before any number is compared
        code, jt, jf, k = prog[3]
        assert (code, jf, k) == (JGE_K, 0, 0x40000000) and prog[3 + 1 + jt] == (RET_K, 0, 0, EPERM)


def test_default_arch_and_unknown_arch() -> None:
    if MACHINE in ARCHES:
        assert build_filter() == build_filter(None) == build_filter(MACHINE)
    assert build_filter("amd64") == build_filter("x86_64")
    assert build_filter("arm64") == build_filter("aarch64")
    assert build_filter("x86_64") != build_filter("aarch64")
    with pytest.raises(SeccompError) as info:
        build_filter("riscv64")
    assert isinstance(info.value, OSError) and info.value.errno == errno.EINVAL


def test_rule_table_matches_independent_numbers() -> None:
    assert {r.syscall: r.errno for r in seccomp.RULES} == {name: err for name, (*_, err) in REFUSED.items()}
    assert len(seccomp.RULES) == len(REFUSED)  # no duplicates
    assert {r.syscall: r.errno for r in seccomp.NESTED_RULES} == {n: e for n, (*_, e) in NESTED_REFUSED.items()}
    threats = [r.threat for r in (*seccomp.RULES, *seccomp.NESTED_RULES)]
    threats += [r.threat for r in (*seccomp.ARG_RULES, *seccomp.NESTED_ARG_RULES)]
    assert all(len(t) > 10 for t in threats)  # every refusal says what it defends
    arg_rules = {r.syscall: r for r in (*seccomp.ARG_RULES, *seccomp.NESTED_ARG_RULES) if r.syscall != "ioctl"}
    assert set(arg_rules) == set(ARG_REFUSED) | set(NESTED_ARG_REFUSED)
    for name, (*_, tests) in {**ARG_REFUSED, **NESTED_ARG_REFUSED}.items():
        got = tuple((t.arg, t.bits or None, t.values) for t in arg_rules[name].tests)
        assert got == tests and arg_rules[name].errno == errno.EPERM, name
    whole = {r.syscall for r in (*seccomp.RULES, *seccomp.NESTED_RULES)}
    assert not whole & {r.syscall for r in (*seccomp.ARG_RULES, *seccomp.NESTED_ARG_RULES)}  # one path per call
    for i, arch in enumerate(ARCHES):
        nrs = seccomp.SYSCALL_NRS[arch]
        assert {name: nrs[name] for name in REFUSED} == {name: v[i] for name, v in REFUSED.items()}, arch
        assert nrs["ioctl"] == NR_IOCTL[arch]
        assert seccomp.syscall_number("keyctl", arch) == REFUSED["keyctl"][i]
        assert not set(KEPT) & {r.syscall for r in seccomp.RULES}
        for name, (*by_arch, _) in {**ARG_REFUSED, **NESTED_ARG_REFUSED}.items():
            assert nrs.get(name) == by_arch[i], (arch, name)
        assert {n for n, (_, arm, _) in ARG_REFUSED.items() if arm is None} == seccomp.LEGACY


def _header_numbers(path: str) -> dict[str, int]:
    with open(path) as f:
        return {m[1]: int(m[2]) for m in re.finditer(r"^#define __NR_(\w+)\s+(\d+)\s*$", f.read(), re.MULTILINE)}


@pytest.mark.parametrize("arch", ARCHES)
def test_numbers_match_the_kernel_headers(arch: str) -> None:
    """Every number the filter compares, against the uapi table it came from (linux-libc-dev)."""
    if not os.path.exists(HEADERS[arch]):
        pytest.skip(f"{HEADERS[arch]} not installed (apt-get install linux-libc-dev)")
    table = {**UNIFIED, **_header_numbers(HEADERS[arch])}  # the header's own number wins where it has one
    assert {k: table[k] for k in seccomp.SYSCALL_NRS[arch]} == seccomp.SYSCALL_NRS[arch]
    assert {k: table[k] for k in KEPT} == {k: v[ARCHES.index(arch)] for k, v in KEPT.items()}


def test_ctypes_layout_matches_the_kernel_abi() -> None:
    assert ctypes.sizeof(seccomp._SockFilter) == 8
    assert seccomp._SockFilter.k.offset == 4
    ptr = ctypes.sizeof(ctypes.c_void_p)
    assert seccomp._SockFprog.filter.offset == ptr  # padding after the u16 len
    assert ctypes.sizeof(seccomp._SockFprog) == 2 * ptr


# --------------------------------------------------------------------------------------------
# Pure: semantics, by running the program in a small classic-BPF interpreter
# --------------------------------------------------------------------------------------------


def run_bpf(prog: list[tuple[int, int, int, int]], arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    args = tuple(args) + (0,) * (6 - len(args))
    data = struct.pack("<II Q 6Q", nr & 0xFFFFFFFF, arch, 0, *args)  # little-endian seccomp_data
    acc, pc = 0, 0
    for _ in range(len(prog)):
        code, jt, jf, k = prog[pc]
        if code == LD_ABS_W:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == JEQ_K:
            pc += 1 + (jt if acc == k else jf)
        elif code == JGE_K:
            pc += 1 + (jt if acc >= k else jf)
        elif code == JSET_K:
            pc += 1 + (jt if acc & k else jf)
        elif code == RET_K:
            return k
        else:
            raise AssertionError(f"opcode {code:#x}")
    raise AssertionError("ran off the program")


X86 = AUDIT["x86_64"]
ARM = AUDIT["aarch64"]
SEMANTICS = [
    # (arch name, audit arch, nr, args, expected, why)
    ("x86_64", X86, 0, (), ALLOW, "read"),
    ("x86_64", X86, 16, (0, TIOCSTI), EPERM, "ioctl TIOCSTI"),
    ("x86_64", X86, 16, (0, TIOCLINUX), EPERM, "ioctl TIOCLINUX"),
    ("x86_64", X86, 16, (0, 0xFFFFFFFF_00005412), EPERM, "kernel ignores cmd's high word"),
    ("x86_64", X86, 16, (0, 0x00005412_00000000), ALLOW, "cmd 0 as the kernel sees it"),
    ("x86_64", X86, 16, (0, TIOCGWINSZ), ALLOW, "ordinary ioctl"),
    ("x86_64", X86, 16, (TIOCSTI, 0, TIOCSTI), ALLOW, "only args[1] is the cmd"),
    ("x86_64", X86, 29, (0, TIOCSTI), ALLOW, "29 is shmget on x86_64"),
    ("x86_64", X86, 425, (), ENOSYS, "io_uring_setup"),
    ("x86_64", X86, 426, (), ENOSYS, "io_uring_enter"),
    ("x86_64", X86, 427, (), ENOSYS, "io_uring_register"),
    ("x86_64", X86, 424, (), ALLOW, "pidfd_send_signal"),
    ("x86_64", X86, 428, (), ALLOW, "open_tree"),
    ("x86_64", AUDIT_I386, 54, (0, TIOCSTI), EPERM, "i386 ioctl via int 0x80"),
    ("x86_64", AUDIT_I386, 20, (), EPERM, "any i386 syscall"),
    ("x86_64", X86, 0x40000000 | 16, (0, TIOCSTI), EPERM, "x32 ioctl"),
    ("x86_64", X86, 0x40000000 | 39, (), EPERM, "any x32 syscall"),
    ("x86_64", X86, 0xFFFFFFFF, (), EPERM, "nr -1 has the x32 bit set too"),
    ("aarch64", ARM, 29, (0, TIOCSTI), EPERM, "ioctl TIOCSTI"),
    ("aarch64", ARM, 29, (0, TIOCLINUX), EPERM, "ioctl TIOCLINUX"),
    ("aarch64", ARM, 29, (0, 0x1_00005412), EPERM, "kernel ignores cmd's high word"),
    ("aarch64", ARM, 29, (0, TIOCGWINSZ), ALLOW, "ordinary ioctl"),
    ("aarch64", ARM, 16, (0, TIOCSTI), ALLOW, "16 is fremovexattr on arm64"),
    ("aarch64", ARM, 425, (), ENOSYS, "io_uring_setup"),
    ("aarch64", ARM, 426, (), ENOSYS, "io_uring_enter"),
    ("aarch64", ARM, 427, (), ENOSYS, "io_uring_register"),
    ("aarch64", AUDIT_ARM, 54, (0, TIOCSTI), EPERM, "AArch32 compat ioctl"),
    ("aarch64", X86, 29, (0, TIOCSTI), EPERM, "foreign arch"),
    ("aarch64", ARM, 63, (), ALLOW, "read"),
]
SEMANTICS += [
    (arch, AUDIT[arch], nrs[i], (), 0x00050000 | err, name)
    for name, (*nrs, err) in REFUSED.items()
    for i, arch in enumerate(ARCHES)
]
SEMANTICS += [
    (arch, AUDIT[arch], nrs[i], (), ALLOW, f"{name} stays allowed")
    for name, nrs in KEPT.items()
    for i, arch in enumerate(ARCHES)
]


@pytest.mark.parametrize("name,audit,nr,args,expected,why", SEMANTICS, ids=[f"{c[0]}-{c[5]}" for c in SEMANTICS])
def test_program_semantics(name: str, audit: int, nr: int, args: tuple[int, ...], expected: int, why: str) -> None:
    assert run_bpf(build_filter(name), audit, nr, args) == expected, why


HIGH = 0xDEADBEEF_00000000  # a high word the kernel ignores (it truncates these arguments to 32 bits or less)
#: (arch, nr, args, nested allowed, expected, why): the argument rules of issue 24.
ARG_SEMANTICS = [
    ("x86_64", 90, (0, 0o4755), False, EPERM, "chmod u+s"),
    ("x86_64", 90, (0, 0o2755), False, EPERM, "chmod g+s"),
    ("x86_64", 90, (0, 0o6755), False, EPERM, "chmod 6755"),
    ("x86_64", 90, (0, 0o1777), False, ALLOW, "the sticky bit is no privilege"),
    ("x86_64", 90, (0, 0o755), False, ALLOW, "chmod 755"),
    ("x86_64", 90, (0, HIGH | 0o4755), False, EPERM, "mode's high word ignored by the kernel"),
    ("x86_64", 90, (0, HIGH | 0o755), False, ALLOW, "a high word alone sets no bit"),
    ("x86_64", 91, (3, 0o4755), False, EPERM, "fchmod"),
    ("x86_64", 268, (3, 0, 0o2755), False, EPERM, "fchmodat: mode is args[2]"),
    ("x86_64", 268, (3, 0o4755, 0o755), False, ALLOW, "fchmodat: args[1] is the path"),
    ("x86_64", 452, (3, 0, 0o4755, 0), False, EPERM, "fchmodat2"),
    ("x86_64", 2, (0, 0o100, 0o4755), False, EPERM, "open(O_CREAT, 04755)"),
    ("x86_64", 2, (0, 0o20200000, 0o2700), False, EPERM, "open(O_TMPFILE, 02700)"),
    ("x86_64", 2, (0, 0, 0o4755), False, ALLOW, "open without O_CREAT ignores the mode"),
    ("x86_64", 2, (0, 0o101, 0o644), False, ALLOW, "open(O_CREAT, 0644)"),
    ("x86_64", 257, (3, 0, 0o100, 0o4755), False, EPERM, "openat(O_CREAT, 04755)"),
    ("x86_64", 257, (3, 0, 0o100 | HIGH, 0o644 | HIGH), False, ALLOW, "openat: high words only"),
    ("x86_64", 257, (3, 0, 0o2, 0o4755), False, ALLOW, "openat(O_RDWR) ignores the mode"),
    ("x86_64", 85, (0, 0o4755), False, EPERM, "creat"),
    ("x86_64", 133, (0, 0o104755, 0), False, EPERM, "mknod(S_IFREG|04755)"),
    ("x86_64", 133, (0, 0o100644, 0), False, ALLOW, "mknod(S_IFREG|0644)"),
    ("x86_64", 259, (3, 0, 0o102755, 0), False, EPERM, "mknodat"),
    ("x86_64", 188, (0, 0, 0, 20, 0), False, EPERM, "setxattr of a v2 capability's size"),
    ("x86_64", 189, (0, 0, 0, 24, 0), False, EPERM, "lsetxattr of a v3 capability's size"),
    ("x86_64", 190, (3, 0, 0, 20, 0), False, EPERM, "fsetxattr"),
    ("x86_64", 190, (3, 0, 0, 19, 0), False, ALLOW, "fsetxattr of another size"),
    ("x86_64", 188, (0, 0, 20, 21, 0), False, ALLOW, "only args[3] is the size"),
    ("x86_64", 272, (NEWUSER,), False, EPERM, "unshare(CLONE_NEWUSER)"),
    ("x86_64", 272, (NEWUSER | 0x40000000,), False, EPERM, "unshare(CLONE_NEWUSER|CLONE_NEWNET)"),
    ("x86_64", 272, (0x40000000,), False, ALLOW, "unshare(CLONE_NEWNET)"),
    ("x86_64", 272, (NEWUSER,), True, ALLOW, "unshare(CLONE_NEWUSER), opted in"),
    ("x86_64", 56, (NEWUSER | 17,), False, EPERM, "clone(CLONE_NEWUSER|SIGCHLD)"),
    ("x86_64", 56, (0x01200011,), False, ALLOW, "clone as fork() makes it"),
    ("x86_64", 56, (NEWUSER | 17,), True, ALLOW, "clone(CLONE_NEWUSER), opted in"),
    ("x86_64", 435, (), False, ENOSYS, "clone3: flags in a struct"),
    ("x86_64", 435, (), True, ALLOW, "clone3, opted in"),
    ("x86_64", 90, (0, 0o4755), True, EPERM, "the opt-in leaves the setid rules alone"),
    ("x86_64", 16, (0, TIOCSTI), True, EPERM, "... and TIOCSTI"),
    ("aarch64", 52, (3, 0o4755), False, EPERM, "fchmod"),
    ("aarch64", 53, (3, 0, 0o2755), False, EPERM, "fchmodat"),
    ("aarch64", 53, (3, 0, 0o755), False, ALLOW, "fchmodat 755"),
    ("aarch64", 56, (3, 0, 0o100, 0o4755), False, EPERM, "openat(O_CREAT, 04755)"),
    ("aarch64", 33, (3, 0, 0o104755, 0), False, EPERM, "mknodat"),
    ("aarch64", 7, (3, 0, 0, 24, 0), False, EPERM, "fsetxattr"),
    ("aarch64", 90, (0, 0o4755), False, ALLOW, "90 is capset on arm64: no chmod there"),
    ("aarch64", 2, (0, 0o100, 0o4755), False, ALLOW, "2 is io_submit on arm64: no open there"),
    ("aarch64", 97, (NEWUSER,), False, EPERM, "unshare(CLONE_NEWUSER)"),
    ("aarch64", 220, (NEWUSER | 17,), False, EPERM, "clone(CLONE_NEWUSER)"),
    ("aarch64", 435, (), False, ENOSYS, "clone3"),
    ("aarch64", 97, (NEWUSER,), True, ALLOW, "unshare(CLONE_NEWUSER), opted in"),
]


@pytest.mark.parametrize(
    "arch,nr,args,nested,expected,why", ARG_SEMANTICS, ids=[f"{c[0]}-{c[5]}" for c in ARG_SEMANTICS]
)
def test_argument_rule_semantics(
    arch: str, nr: int, args: tuple[int, ...], nested: bool, expected: int, why: str
) -> None:
    assert run_bpf(build_filter(arch, nested_userns=nested), AUDIT[arch], nr, args) == expected, why


REFUSED_BY_NR = {arch: {nrs[i]: err for *nrs, err in REFUSED.values()} for i, arch in enumerate(ARCHES)}
NESTED_BY_NR = {arch: {nrs[i]: err for *nrs, err in NESTED_REFUSED.values()} for i, arch in enumerate(ARCHES)}


def _arg_tests(table: dict[str, Any], arch: str) -> dict[int, Any]:
    i = ARCHES.index(arch)
    return {nrs[i]: tests for *nrs, tests in table.values() if nrs[i] is not None}


_interesting_nr = st.one_of(
    st.sampled_from(
        [
            0,
            16,
            29,
            54,
            424,
            425,
            426,
            427,
            428,
            0x40000010,
            0x7FFFFFFF,
            0xFFFFFFFF,
            *(n for m in REFUSED_BY_NR.values() for n in m),
            *(n for m in NESTED_BY_NR.values() for n in m),
            *(n for nrs in KEPT.values() for n in nrs),
            *(n for *nrs, _ in (*ARG_REFUSED.values(), *NESTED_ARG_REFUSED.values()) for n in nrs if n is not None),
        ]
    ),
    st.integers(0, 0xFFFFFFFF),
)
_interesting_word = st.one_of(
    st.sampled_from([TIOCSTI, TIOCLINUX, TIOCGWINSZ, 0o4755, 0o2755, 0o755, 0o100, 0o102, NEWUSER, 20, 24, 0]).flatmap(
        lambda c: st.integers(0, 0xFFFFFFFF).map(lambda hi: (hi << 32) | c)
    ),
    st.integers(0, 2**64 - 1),
)


def _reference(arch: str, audit: int, nr: int, args: tuple[int, ...], nested: bool) -> int:
    """What the filter must answer, written from the tables above, not from the module's."""
    if audit != AUDIT[arch] or (arch == "x86_64" and nr >= 0x40000000):  # foreign table, or x32
        return EPERM
    if nr in REFUSED_BY_NR[arch]:
        return 0x00050000 | REFUSED_BY_NR[arch][nr]
    if not nested and nr in NESTED_BY_NR[arch]:
        return 0x00050000 | NESTED_BY_NR[arch][nr]
    if nr == NR_IOCTL[arch] and args[1] & 0xFFFFFFFF in (TIOCSTI, TIOCLINUX):
        return EPERM
    tests = {**_arg_tests(ARG_REFUSED, arch), **({} if nested else _arg_tests(NESTED_ARG_REFUSED, arch))}.get(nr)
    if tests is not None and all(
        (args[a] & 0xFFFFFFFF & bits) if bits else (args[a] & 0xFFFFFFFF) in values for a, bits, values in tests
    ):
        return EPERM
    return ALLOW


@settings(max_examples=600, deadline=None)
@given(
    arch=st.sampled_from(ARCHES),
    audit=st.sampled_from([X86, ARM, AUDIT_I386, AUDIT_ARM, 0]),
    nr=_interesting_nr,
    args=st.tuples(_interesting_word, _interesting_word, _interesting_word, _interesting_word),
    nested=st.booleans(),
)
def test_program_matches_reference_model(
    arch: str, audit: int, nr: int, args: tuple[int, int, int, int], nested: bool
) -> None:
    expected = _reference(arch, audit, nr, args, nested)
    assert run_bpf(build_filter(arch, nested_userns=nested), audit, nr, args) == expected


# --------------------------------------------------------------------------------------------
# Real kernel: forked children
# --------------------------------------------------------------------------------------------


def _filter_count() -> str:
    with open("/proc/self/status") as f:
        lines = [line for line in f if line.startswith(("Seccomp:", "Seccomp_filters:", "NoNewPrivs:"))]
    return "".join(lines)


@pytest.fixture(autouse=True)
def _pytest_process_stays_unfiltered() -> Iterator[None]:
    """A filter installed in the pytest process itself could never be removed: fail loudly if one is."""
    before = _filter_count()
    yield
    assert _filter_count() == before, "install() ran in the pytest process, not in a forked child"


def _pty_ctty() -> tuple[int, int]:
    """In the child: a new session whose controlling terminal is a fresh pty (the user's terminal stand-in).

    Non-canonical with VMIN=VTIME=0 so the slave's input queue can be read without waiting for a
    newline; ECHO stays on, so whatever lands in the input queue also shows up on the master.
    """
    master, slave = os.openpty()
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ICANON
    attrs[6][termios.VMIN] = 0
    attrs[6][termios.VTIME] = 0
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def _read_until(fd: int, marker: bytes, timeout: float = 3.0) -> bytes:
    data, deadline = b"", time.monotonic() + timeout
    while marker not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"marker {marker!r} not seen, got {data!r}")
        data += os.read(fd, 1024)
    return data


def _what_arrived(master: int, slave: int) -> dict[str, str]:
    """Everything injected so far, in order: type a marker on the master (as the user would) and read
    both the slave's input queue and the master's echo up to it. Injected bytes come before the marker."""
    os.write(master, b"M")
    return {"input": _read_until(slave, b"M").decode(), "echo": _read_until(master, b"M").decode()}


def _tiocsti(slave: int, byte: bytes = b"x") -> str:
    return attempt(lambda: fcntl.ioctl(slave, termios.TIOCSTI, byte))


def test_tiocsti_injects_before_install_and_is_refused_after() -> None:
    def body() -> dict[str, Any]:
        master, slave = _pty_ctty()
        out: dict[str, Any] = {"before": _tiocsti(slave), "arrived_before": _what_arrived(master, slave)}
        install()
        out["after"] = _tiocsti(slave)
        out["arrived_after"] = _what_arrived(master, slave)
        # The controlling terminal is not special: /dev/tty is the same tty through another path.
        tty = os.open("/dev/tty", os.O_RDWR)
        out["dev_tty"] = _tiocsti(tty)
        out["arrived_dev_tty"] = _what_arrived(master, slave)
        return out

    out = in_child(body)
    # Control: this kernel does let the session inject, and the test sees it on both ends.
    assert out["before"] == "ok"
    assert out["arrived_before"] == {"input": "xM", "echo": "xM"}
    assert out["after"] == "EPERM"
    assert out["arrived_after"] == {"input": "M", "echo": "M"}
    assert out["dev_tty"] == "EPERM"
    assert out["arrived_dev_tty"] == {"input": "M", "echo": "M"}


def _raw_ioctl(fd: int, cmd: int, arg: bytes) -> str:
    buf = ctypes.create_string_buffer(arg)
    ret = _libc.syscall(ctypes.c_long(NR_IOCTL[MACHINE]), ctypes.c_long(fd), ctypes.c_ulong(cmd), buf)
    return "ok" if ret == 0 else errno.errorcode.get(ctypes.get_errno(), "?")


def test_tioclinux_and_high_word_cmd_are_refused() -> None:
    def body() -> dict[str, Any]:
        master, slave = _pty_ctty()
        high = 0xDEADBEEF_00000000 | TIOCSTI  # the kernel truncates cmd to unsigned int
        out: dict[str, Any] = {
            "linux_before": attempt(lambda: fcntl.ioctl(slave, termios.TIOCLINUX, b"\x0b")),
            "high_before": _raw_ioctl(slave, high, b"h"),
            "arrived_before": _what_arrived(master, slave),
        }
        install()
        out["linux_after"] = attempt(lambda: fcntl.ioctl(slave, termios.TIOCLINUX, b"\x0b"))
        out["high_after"] = _raw_ioctl(slave, high, b"h")
        out["arrived_after"] = _what_arrived(master, slave)
        return out

    out = in_child(body)
    assert out["linux_before"] in ("ENOTTY", "EINVAL")  # a pty is no VT: refused, but not by us
    assert out["linux_after"] == "EPERM"
    assert out["high_before"] == "ok" and out["arrived_before"]["input"] == "hM"  # control
    assert out["high_after"] == "EPERM" and out["arrived_after"] == {"input": "M", "echo": "M"}


def test_ordinary_terminal_ioctls_still_work() -> None:
    def body() -> dict[str, Any]:
        master, slave = _pty_ctty()
        install()
        attrs = termios.tcgetattr(slave)  # TCGETS
        attrs[3] |= termios.ISIG
        termios.tcsetattr(slave, termios.TCSANOW, attrs)  # TCSETS
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(slave, termios.TIOCGWINSZ, b"\0" * 8))
        os.write(master, b"abc")
        _read_until(slave, b"c")
        return {
            "winsz": [rows, cols],
            "size": list(os.get_terminal_size(slave)),
            "isatty": os.isatty(slave),
            "pgrp_is_us": os.tcgetpgrp(slave) == os.getpgrp(),
            "isig": bool(termios.tcgetattr(slave)[3] & termios.ISIG),
        }

    assert in_child(body) == {"winsz": [33, 101], "size": [101, 33], "isatty": True, "pgrp_is_us": True, "isig": True}


def _io_uring() -> dict[str, str]:
    def call(nr: int, *args: int | ctypes.Array[ctypes.c_char]) -> str:
        c_args = [a if isinstance(a, ctypes.Array) else ctypes.c_long(a) for a in args]
        ret = _libc.syscall(ctypes.c_long(nr), *c_args)
        if ret >= 0:
            if nr == 425:
                os.close(ret)
            return "ok"
        return errno.errorcode.get(ctypes.get_errno(), "?")

    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    return {"setup": call(425, 1, params), "enter": call(426, -1, 0, 0, 0, 0, 0), "register": call(427, -1, 0, 0, 0)}


def test_io_uring_is_enosys_after_install() -> None:
    def body() -> dict[str, Any]:
        before = _io_uring()
        install()
        return {"before": before, "after": _io_uring()}

    out = in_child(body)
    # Control: the syscalls exist here and reach the kernel (a ring, or an error about our arguments).
    assert "ENOSYS" not in out["before"].values(), out["before"]
    assert out["after"] == {"setup": "ENOSYS", "enter": "ENOSYS", "register": "ENOSYS"}


def _i386_stub() -> Callable[[int, int, int, int], int]:
    """int 0x80 from 64-bit code: the i386 syscall table, args truncated to 32 bits (so MAP_32BIT)."""
    code = bytes.fromhex(
        "53"  # push rbx
        "89f8"  # mov eax, edi   (nr)
        "89f3"  # mov ebx, esi   (arg1)
        "87ca"  # xchg ecx, edx  (arg2 <- rdx, arg3 <- rcx)
        "cd80"  # int 0x80
        "5b"  # pop rbx
        "c3"
    )  # ret
    page = mmap.mmap(
        -1,
        4096,
        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,  # MAP_32BIT
        prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC,
    )
    page[: len(code)] = code
    page[256:257] = b"i"
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    assert base < 2**32
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint)(base)
    fn.page, fn.byte_addr = page, base + 256  # type: ignore[attr-defined]  # keep the mapping alive
    return fn


@pytest.mark.skipif(MACHINE != "x86_64", reason="int 0x80 and x32 are x86_64 ABIs")
def test_32bit_and_x32_syscalls_are_refused() -> None:
    def probe() -> None:  # in a grandchild: without IA32 emulation int 0x80 is a SIGSEGV
        _i386_stub()(20, 0, 0, 0)

    def body() -> dict[str, Any]:
        pid = os.fork()
        if pid == 0:
            try:
                probe()
            finally:
                os._exit(0)
        if os.waitpid(pid, 0)[1] != 0:
            return {"ia32": False}
        master, slave = _pty_ctty()
        stub = _i386_stub()

        def x32_getpid() -> int:
            ret = _libc.syscall(ctypes.c_long(0x40000000 | 39))
            return ret if ret >= 0 else -ctypes.get_errno()

        out: dict[str, Any] = {"ia32": True, "pid": os.getpid()}
        out["getpid_before"] = stub(20, 0, 0, 0)
        out["ioctl_before"] = stub(54, slave, TIOCSTI, stub.byte_addr)  # type: ignore[attr-defined]
        out["arrived_before"] = _what_arrived(master, slave)
        out["x32_before"] = x32_getpid()
        install()
        out["getpid_after"] = stub(20, 0, 0, 0)
        out["ioctl_after"] = stub(54, slave, TIOCSTI, stub.byte_addr)  # type: ignore[attr-defined]
        out["arrived_after"] = _what_arrived(master, slave)
        out["x32_after"] = x32_getpid()
        return out

    out = in_child(body)
    if not out["ia32"]:
        pytest.skip("kernel without IA32 emulation: int 0x80 is not a syscall path here")
    # Control: the i386 table is live here, and its ioctl (54) injects into the terminal.
    assert out["getpid_before"] == out["pid"]
    assert out["ioctl_before"] == 0 and out["arrived_before"]["input"] == "iM"
    assert out["getpid_after"] == -errno.EPERM
    assert out["ioctl_after"] == -errno.EPERM and out["arrived_after"] == {"input": "M", "echo": "M"}
    # x32 may be compiled out (then ENOSYS before); either way the filter answers EPERM first.
    assert out["x32_before"] in (out["pid"], -errno.ENOSYS)
    assert out["x32_after"] == -errno.EPERM


def test_grandchild_forked_after_install_is_filtered() -> None:
    def body() -> dict[str, Any]:
        master, slave = _pty_ctty()
        install()
        report: dict[str, Any] = in_child(lambda: {"tiocsti": _tiocsti(slave), "uring": _io_uring()}, 3.0)
        report["arrived"] = _what_arrived(master, slave)
        return report

    out = in_child(body)
    assert out["tiocsti"] == "EPERM"
    assert out["uring"] == {"setup": "ENOSYS", "enter": "ENOSYS", "register": "ENOSYS"}
    assert out["arrived"] == {"input": "M", "echo": "M"}


# Runs as the exec'd program (through /bin/sh): no sandgate imports, only what a command could do.
_EXECED = r"""
import errno, fcntl, json, select, sys, termios
master, slave = int(sys.argv[1]), int(sys.argv[2])
try:
    fcntl.ioctl(slave, termios.TIOCSTI, b"e")
    res = "ok"
except OSError as e:
    res = errno.errorcode[e.errno]
status = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status"))}
print(json.dumps({"tiocsti": res, "seccomp": status["Seccomp"], "nnp": status["NoNewPrivs"]}))
"""


@pytest.mark.parametrize("filtered", [False, True], ids=["control", "installed"])
def test_filter_survives_exec_through_a_shell(filtered: bool) -> None:
    def prepare() -> list[str]:
        master, slave = _pty_ctty()
        os.set_inheritable(master, True)
        os.set_inheritable(slave, True)
        if filtered:
            install()
        return ["/bin/sh", "-c", 'exec "$0" -S -c "$1" "$2" "$3"', sys.executable, _EXECED, str(master), str(slave)]

    status, raw = exec_in_child(prepare, 5.0)
    assert status == 0, raw.decode(errors="replace")
    out = json.loads(raw)
    if filtered:
        assert out == {"tiocsti": "EPERM", "seccomp": "2", "nnp": "1"}
    else:
        assert out["tiocsti"] == "ok" and out["seccomp"] == _filter_count().split("Seccomp:")[1].split()[0]


def test_install_is_idempotent_and_sets_no_new_privs() -> None:
    def body() -> dict[str, Any]:
        install()
        install()
        with open("/proc/self/status") as f:
            status = {k: v.strip() for k, v in (line.split(":", 1) for line in f)}
        return {"nnp": status["NoNewPrivs"], "mode": status["Seccomp"], "tiocsti_on_pipe": _tiocsti(os.pipe()[0])}

    out = in_child(body)
    assert out["nnp"] == "1" and out["mode"] == "2"
    assert out["tiocsti_on_pipe"] == "EPERM"  # refused before the kernel even looks at the fd


# --------------------------------------------------------------------------------------------
# Real kernel: the calls refused with EPERM, each against a control child without the filter
# --------------------------------------------------------------------------------------------


def _raw(name: str, *args: object) -> str:
    """syscall(2) by name, every argument full width; 'ok' (any fd returned is closed) or the errno name."""
    ctypes.set_errno(0)
    c_args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    i = ARCHES.index(MACHINE)  # the test's own numbers, not the module's: a wrong one there must show
    ret = _libc.syscall(ctypes.c_long(REFUSED[name][i] if name in REFUSED else KEPT[name][i]), *c_args)
    if ret < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    if name in ("bpf", "perf_event_open", "userfaultfd", "open_by_handle_at"):
        os.close(ret)
    return "ok"


def _bpf_array_map() -> str:
    attr = ctypes.create_string_buffer(struct.pack("<4I", 2, 4, 4, 1), 128)  # BPF_MAP_TYPE_ARRAY, 4/4 bytes, 1
    return _raw("bpf", 0, attr, 128)  # BPF_MAP_CREATE


def _perf_sw_clock() -> str:
    attr = ctypes.create_string_buffer(struct.pack("<II", 1, 128), 128)  # PERF_TYPE_SOFTWARE, CPU_CLOCK
    return _raw("perf_event_open", attr, 0, -1, -1, 0)  # this process, any cpu


def _open_by_handle(path: str) -> dict[str, str]:
    """name_to_handle_at (stays allowed) then open_by_handle_at, the 'shocker' read of v1's review."""
    handle = ctypes.create_string_buffer(struct.pack("<Ii", 128, 0), 8 + 128)  # MAX_HANDLE_SZ
    mount_id = ctypes.c_int()
    at_fdcwd = -100
    name = _raw("name_to_handle_at", at_fdcwd, ctypes.c_char_p(path.encode()), handle, ctypes.byref(mount_id), 0)
    mount_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return {
            "name_to_handle_at": name,
            "open_by_handle_at": _raw("open_by_handle_at", mount_fd, handle, os.O_RDONLY),
        }
    finally:
        os.close(mount_fd)


def _refused_attempts(path: str) -> dict[str, str]:
    """Each call chosen to succeed, or fail harmlessly for its arguments, without the filter."""
    user, process_keyring, session_keyring = ctypes.c_char_p(b"user"), -2, -3
    out = {
        "bpf": _bpf_array_map(),
        "perf_event_open": _perf_sw_clock(),
        "keyctl": _raw("keyctl", 0, session_keyring, 0),  # KEYCTL_GET_KEYRING_ID
        # Into this child's own process keyring: it dies with the child.
        "add_key": _raw("add_key", user, ctypes.c_char_p(b"sandgate-test"), ctypes.c_char_p(b"x"), 1, process_keyring),
        "request_key": _raw("request_key", user, ctypes.c_char_p(b"sandgate-test-absent"), None, 0),
        **_open_by_handle(path),
        "init_module": _raw("init_module", None, 0, ctypes.c_char_p(b"")),  # empty image: ENOEXEC at most
        "finit_module": _raw("finit_module", -1, ctypes.c_char_p(b""), 0),  # EBADF at most
        "delete_module": _raw("delete_module", ctypes.c_char_p(b"sandgate_absent_module"), 0),  # ENOENT
        # 17 > KEXEC_SEGMENT_MAX and unknown flags: EINVAL before anything is loaded (or ENOSYS: no kexec).
        "kexec_load": _raw("kexec_load", 0, 17, None, 0),
        "kexec_file_load": _raw("kexec_file_load", -1, -1, 0, ctypes.c_char_p(b""), 0xFF),
        "userfaultfd": _raw("userfaultfd", os.O_CLOEXEC),
    }
    return out


@pytest.mark.skipif(MACHINE not in ARCHES, reason="filter numbers exist for x86_64 and aarch64 only")
def test_dangerous_calls_are_refused_with_eperm(tmp_path: Any) -> None:
    assert os.geteuid() == 0, "the control needs root: bpf, perf, open_by_handle_at must succeed without the filter"
    target = tmp_path / "secret"
    target.write_text("hidden")

    def attempts(filtered: bool) -> Callable[[], dict[str, str]]:
        def body() -> dict[str, str]:
            if filtered:
                install()
            return _refused_attempts(str(target))

        return body

    control = in_child(attempts(False))
    refused = in_child(attempts(True))
    # Control: root gets these for real here (ENOSYS/ENOENT... where the kernel lacks or refuses the feature).
    for name in (
        "bpf",
        "perf_event_open",
        "keyctl",
        "add_key",
        "name_to_handle_at",
        "open_by_handle_at",
        "userfaultfd",
    ):
        assert control[name] == "ok", (name, control)
    assert control["request_key"] == "ENOKEY"
    for name, result in control.items():
        assert result != "EPERM", f"{name}: EPERM without the filter, the test could not see the filter work"
    assert refused == {**dict.fromkeys(control, "EPERM"), "name_to_handle_at": "ok"}


def test_kept_namespace_calls_still_work() -> None:
    """setns/unshare stay allowed (nested bwrap/podman), and ptrace of one's own child too."""

    def body() -> dict[str, str]:
        install()
        out = {"unshare_uts": attempt(lambda: os.unshare(os.CLONE_NEWUTS))}
        fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
        out["setns_own_uts"] = attempt(lambda: os.setns(fd, os.CLONE_NEWUTS))
        os.close(fd)
        return out

    assert in_child(body) == {"unshare_uts": "ok", "setns_own_uts": "ok"}


# --------------------------------------------------------------------------------------------
# Real kernel: setuid/setgid bits, file capabilities, nested user namespaces (issue 24)
# --------------------------------------------------------------------------------------------

CAP_V2 = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)  # VFS_CAP_REVISION_2 | effective, cap_net_raw
CAP_V3 = struct.pack("<6I", 0x03000001, 1 << 13, 0, 0, 0, 0)  # ... v3, rootid 0
CLONE_ARGS = 88  # sizeof(struct clone_args), CLONE_ARGS_SIZE_VER2


def _nr(name: str) -> int:
    """The test's own number for a call of issue 24's rules (never the module's table)."""
    i = ARCHES.index(MACHINE)
    table = {**ARG_REFUSED, **NESTED_ARG_REFUSED, **REFUSED, **NESTED_REFUSED}
    nr = table[name][i]
    assert isinstance(nr, int), f"no {name} on {MACHINE}"
    return nr


def _sys(name: str, *args: object) -> str:
    """syscall(2) of one of those calls: 'ok' (an fd returned is closed) or the errno name."""
    ctypes.set_errno(0)
    c_args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ret = _libc.syscall(ctypes.c_long(_nr(name)), *c_args)
    if ret < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    if name in ("open", "openat", "creat", "openat2"):
        os.close(ret)
    return "ok"


def _mode(path: str) -> str:
    try:
        return oct(os.stat(path).st_mode & 0o7777)
    except FileNotFoundError:
        return "absent"


def _setid_attempts(d: str) -> dict[str, str]:
    """Every way of giving a file S_ISUID/S_ISGID, each on a fresh file, with the mode left behind."""
    at_fdcwd, path = -100, ctypes.c_char_p
    out: dict[str, str] = {}

    def fresh(name: str) -> str:
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(b"#!/bin/sh\n")
        os.chmod(p, 0o700)
        return p

    def record(label: str, result: str, p: str) -> None:
        out[label] = f"{result} {_mode(p)}"

    p = fresh("chmod4755")
    record("chmod 4755", attempt(lambda: os.chmod(p, 0o4755)), p)
    p = fresh("chmod2755")
    record("chmod 2755", attempt(lambda: os.chmod(p, 0o2755)), p)
    p = fresh("chmod755")
    record("chmod 755", attempt(lambda: os.chmod(p, 0o755)), p)
    p = fresh("chmod-high")
    record("chmod high word", _sys("chmod", path(p.encode()), (1 << 40) | 0o4755) if MACHINE == "x86_64" else "-", p)
    p = fresh("fchmod")
    fd = os.open(p, os.O_RDONLY)
    record("fchmod 6755", attempt(lambda: os.fchmod(fd, 0o6755)), p)
    os.close(fd)
    p = fresh("fchmodat")
    record("fchmodat 4755", _sys("fchmodat", at_fdcwd, path(p.encode()), 0o4755), p)
    p = fresh("fchmodat2")
    record("fchmodat2 4755", _sys("fchmodat2", at_fdcwd, path(p.encode()), 0o4755, 0), p)
    p = os.path.join(d, "open-creat")
    record("open O_CREAT 4755", attempt(lambda: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o4755))), p)
    p = os.path.join(d, "open-creat-644")
    record("open O_CREAT 644", attempt(lambda: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))), p)
    p = fresh("open-plain")
    record("open no O_CREAT, mode 4755", _sys("openat", at_fdcwd, path(p.encode()), os.O_RDONLY, 0o4755), p)
    out["O_TMPFILE 2700"] = attempt(lambda: os.close(os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o2700)))  # unnamed
    p = os.path.join(d, "mknod")
    record("mknod S_IFREG|4755", attempt(lambda: os.mknod(p, stat_ifreg | 0o4755)), p)
    p = os.path.join(d, "mknod-644")
    record("mknod S_IFREG|644", attempt(lambda: os.mknod(p, stat_ifreg | 0o644)), p)
    if MACHINE == "x86_64":
        p = os.path.join(d, "creat")
        record("creat 4755", _sys("creat", path(p.encode()), 0o4755), p)
    how = ctypes.create_string_buffer(struct.pack("<QQQ", os.O_CREAT | os.O_WRONLY, 0o4755, 0), 24)
    p = os.path.join(d, "openat2")
    record("openat2", _sys("openat2", at_fdcwd, path(p.encode()), how, 24), p)
    return out


stat_ifreg = 0o100000


def test_setuid_and_setgid_bits_are_refused_and_plain_modes_work(tmp_path: Any) -> None:
    """Started by root the command is host root: a setuid file it leaves is root for every local account."""
    assert os.geteuid() == 0, "the control needs root (the sandbox's uid 0 is host root)"

    def attempts(filtered: bool) -> Callable[[], dict[str, str]]:
        def body() -> dict[str, str]:
            d = tmp_path / ("filtered" if filtered else "control")
            d.mkdir()
            os.umask(0o022)
            if filtered:
                install()
            return _setid_attempts(str(d))

        return body

    control = in_child(attempts(False))
    refused = in_child(attempts(True))
    # Control: without the filter each of them leaves the bit (the kernel lets root, or any owner, do it).
    assert control["chmod 4755"] == "ok 0o4755" and control["chmod 2755"] == "ok 0o2755", control
    assert control["fchmod 6755"] == "ok 0o6755" and control["fchmodat 4755"] == "ok 0o4755", control
    assert control["fchmodat2 4755"] in ("ok 0o4755", "ENOSYS 0o700"), control  # 6.6+
    assert control["open O_CREAT 4755"] == "ok 0o4755" and control["mknod S_IFREG|4755"] == "ok 0o4755", control
    assert control["openat2"] in ("ok 0o4755", "ENOSYS absent") and control["O_TMPFILE 2700"] == "ok", control
    if MACHINE == "x86_64":
        assert control["chmod high word"] == "ok 0o4755" and control["creat 4755"] == "ok 0o4755", control
    assert refused == {
        "chmod 4755": "EPERM 0o700",
        "chmod 2755": "EPERM 0o700",
        "chmod 755": "ok 0o755",
        "chmod high word": "EPERM 0o700" if MACHINE == "x86_64" else "- 0o700",
        "fchmod 6755": "EPERM 0o700",
        "fchmodat 4755": "EPERM 0o700",
        "fchmodat2 4755": "EPERM 0o700",
        "open O_CREAT 4755": "EPERM absent",
        "open O_CREAT 644": "ok 0o644",
        "open no O_CREAT, mode 4755": "ok 0o700",
        "O_TMPFILE 2700": "EPERM",
        "mknod S_IFREG|4755": "EPERM absent",
        "mknod S_IFREG|644": "ok 0o644",
        **({"creat 4755": "EPERM absent"} if MACHINE == "x86_64" else {}),
        "openat2": "ENOSYS absent",
    }


def _xattr_attempts(d: str) -> dict[str, str]:
    p = os.path.join(d, "f")
    open(p, "wb").close()
    fd = os.open(p, os.O_RDONLY)
    args = ctypes.create_string_buffer(16)  # struct xattr_args { u64 value; u32 size; u32 flags; }
    value = ctypes.create_string_buffer(CAP_V2, len(CAP_V2))
    struct.pack_into("<QII", args, 0, ctypes.addressof(value), len(CAP_V2), 0)
    out = {
        "setxattr v2": attempt(lambda: os.setxattr(p, "security.capability", CAP_V2)),
        "lsetxattr v3": attempt(lambda: os.setxattr(p, "security.capability", CAP_V3, follow_symlinks=False)),
        "fsetxattr v2": attempt(lambda: os.setxattr(fd, "security.capability", CAP_V2)),
        "setxattrat v2": _sys("setxattrat", -100, ctypes.c_char_p(p.encode()), 0, b"security.capability", args, 16),
        "user 19 bytes": attempt(lambda: os.setxattr(p, "user.sandgate", b"x" * 19)),
        "user 20 bytes": attempt(lambda: os.setxattr(p, "user.sandgate", b"x" * 20)),
    }
    try:
        out["left"] = os.getxattr(p, "security.capability").hex()
    except OSError as e:
        out["left"] = errno.errorcode.get(e.errno or 0, "?")
    os.close(fd)
    return out


def test_file_capabilities_are_refused_and_other_xattrs_work(tmp_path: Any) -> None:
    assert os.geteuid() == 0, "the control needs CAP_SETFCAP"

    def attempts(filtered: bool) -> Callable[[], dict[str, str]]:
        def body() -> dict[str, str]:
            d = tmp_path / ("filtered" if filtered else "control")
            d.mkdir()
            if filtered:
                install()
            return _xattr_attempts(str(d))

        return body

    control = in_child(attempts(False))
    refused = in_child(attempts(True))
    # Control: root writes file capabilities here (v3 with rootid 0 is stored as v2), by every call.
    assert control["setxattr v2"] == control["lsetxattr v3"] == control["fsetxattr v2"] == "ok", control
    assert control["setxattrat v2"] in ("ok", "ENOSYS"), control  # 6.13+
    assert control["left"] == CAP_V2.hex() and control["user 20 bytes"] == "ok", control
    assert refused == {
        "setxattr v2": "EPERM",
        "lsetxattr v3": "EPERM",
        "fsetxattr v2": "EPERM",
        "setxattrat v2": "ENOSYS",
        "user 19 bytes": "ok",
        "user 20 bytes": "EPERM",  # the price: a user.* xattr of exactly a capability's size
        "left": "ENODATA",
    }


def _clone_newuser(name: str) -> str:
    """clone/clone3 with CLONE_NEWUSER: 'ok' once the child ran and exited 0, else the errno name."""
    if name == "clone3":
        cargs = ctypes.create_string_buffer(struct.pack("<11Q", NEWUSER, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0), CLONE_ARGS)
        args: tuple[object, ...] = (cargs, CLONE_ARGS)
    else:
        args = (NEWUSER | 17, 0, 0, 0, 0)  # SIGCHLD, no new stack: a fork in a new user namespace
    ctypes.set_errno(0)
    c_args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    pid = _libc.syscall(ctypes.c_long(_nr(name)), *c_args)
    if pid == 0:  # the child: leave at once, never back into pytest
        os._exit(0)
    if pid < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    return "ok" if os.waitpid(pid, 0)[1] == 0 else "child failed"


def _userns_attempts() -> dict[str, str]:
    out = {  # unshare in a grandchild each: the namespace dies with it
        "unshare": in_child(lambda: attempt(lambda: os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)), 3.0),
        "clone": _clone_newuser("clone"),
        "clone3": _clone_newuser("clone3"),
        "unshare uts": in_child(lambda: attempt(lambda: os.unshare(os.CLONE_NEWUTS)), 3.0),
        "fork": in_child(lambda: "ok", 3.0),
    }
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(1))  # pthread_create tries clone3 first: must fall back
    t.start()
    t.join(3.0)
    out["thread"] = "ok" if done else "failed"
    r = subprocess.run(["/bin/sh", "-c", "exit 7"], timeout=5)  # posix_spawn/vfork: clone3 then clone
    out["spawn"] = f"exit {r.returncode}"
    return out


@pytest.mark.parametrize("nested", [False, True], ids=["default", "opted-in"])
def test_nested_user_namespaces_are_refused_unless_opted_in(nested: bool) -> None:
    def body(filtered: bool) -> Callable[[], dict[str, str]]:
        def run() -> dict[str, str]:
            if filtered:
                install(nested_userns=nested)
            return _userns_attempts()

        return run

    control = in_child(body(False))
    got = in_child(body(True))
    everyday = {"unshare uts": "ok", "fork": "ok", "thread": "ok", "spawn": "exit 7"}
    # Control: this kernel lets the same process make user namespaces by every call.
    assert control == {"unshare": "ok", "clone": "ok", "clone3": "ok", **everyday}, control
    if nested:
        assert got == control
    else:
        assert got == {"unshare": "EPERM", "clone": "EPERM", "clone3": "ENOSYS", **everyday}
