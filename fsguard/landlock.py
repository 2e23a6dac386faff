"""Restrict where the sandboxed command and every descendant may WRITE, using Landlock.

Landlock is an allowlist enforced by the kernel: a right we *handle* is denied everywhere except beneath
the paths we add rules for. We handle every write-side right the running ABI knows, and none of the
read-side ones (READ_FILE, READ_DIR, EXECUTE): what the command may see is decided by the mount
namespace (fsguard.mounts), not here. Two handled rights are granted nowhere, not even in the writable
roots: MAKE_CHAR and MAKE_BLOCK, so no device node (the root disk, /dev/mem, /dev/kmsg...) can be
made in the workspace and opened from there; FIFOs, sockets, symlinks and the rest stay granted.

The domain is inherited across fork() and execve() and can never be removed or widened, so `apply`
runs in the forked child right before exec, never in sandgate itself. It restricts the calling thread
only: call it in a single-threaded child (a freshly forked one is).

plan() and handled_rights() are pure so the policy can be tested at every ABI on any kernel;
apply() turns a Plan into syscalls and fails closed (raises) whenever it cannot enforce it exactly.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from fsguard.process import PR_SET_NO_NEW_PRIVS, prctl

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# Syscall numbers from the unified table (include/uapi/asm-generic/unistd.h): x86_64 and aarch64 alike.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446

LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1

# include/uapi/linux/landlock.h, "Filesystem flags". ABI in which each appeared on the right.
ACCESS_FS_EXECUTE = 1 << 0  # ABI 1 (not handled: reads/exec are governed by mounts)
ACCESS_FS_WRITE_FILE = 1 << 1  # ABI 1
ACCESS_FS_READ_FILE = 1 << 2  # ABI 1 (not handled)
ACCESS_FS_READ_DIR = 1 << 3  # ABI 1 (not handled)
ACCESS_FS_REMOVE_DIR = 1 << 4  # ABI 1
ACCESS_FS_REMOVE_FILE = 1 << 5  # ABI 1
ACCESS_FS_MAKE_CHAR = 1 << 6  # ABI 1
ACCESS_FS_MAKE_DIR = 1 << 7  # ABI 1
ACCESS_FS_MAKE_REG = 1 << 8  # ABI 1
ACCESS_FS_MAKE_SOCK = 1 << 9  # ABI 1
ACCESS_FS_MAKE_FIFO = 1 << 10  # ABI 1
ACCESS_FS_MAKE_BLOCK = 1 << 11  # ABI 1
ACCESS_FS_MAKE_SYM = 1 << 12  # ABI 1
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5

# "Scope flags", ABI 6.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_WRITE_V1 = (
    ACCESS_FS_WRITE_FILE  # overwriting/appending to any existing file: the core of "where may it write"
    | ACCESS_FS_REMOVE_DIR  # deleting someone else's directories
    | ACCESS_FS_REMOVE_FILE  # deleting (or renaming away) files outside the writable roots
    | ACCESS_FS_MAKE_CHAR  # mknod of a char device (root could re-create /dev/mem-like nodes): never granted
    | ACCESS_FS_MAKE_DIR  # planting directories, e.g. ~/.config/autostart
    | ACCESS_FS_MAKE_REG  # planting files, e.g. ~/.bashrc.d/evil, .git/hooks/post-checkout
    | ACCESS_FS_MAKE_SOCK  # binding pathname sockets that impersonate a host service
    | ACCESS_FS_MAKE_FIFO  # planting FIFOs that hang or feed a host reader
    | ACCESS_FS_MAKE_BLOCK  # mknod of a block device (raw disk access as root): never granted
    | ACCESS_FS_MAKE_SYM  # planting symlinks that redirect a host writer
)

# Handled (so denied everywhere) but granted by no rule: a build needs no device node of its own, and
# one made in the workspace would bypass the mount namespace (mknod the root disk, read ~/.ssh off it).
_NEVER_GRANTED = ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK

# Rights the kernel accepts on a rule for a non-directory (anything else: EINVAL).
_FILE_VALID = ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV
# What a device node like /dev/null or /dev/tty needs: write it, O_TRUNC it, and (terminals) ioctl it.
_DEVICE_FILE_RIGHTS = ACCESS_FS_WRITE_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV

DEFAULT_DEVICES: tuple[str, ...] = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
)


class LandlockError(OSError):
    """Landlock could not be enforced as planned, so the command must not run; the message is one line for the user."""

    def __str__(self) -> str:
        # OSError's "[Errno N] ..." prefix is noise for a user; the text already names the cause.
        return self.strerror if isinstance(self.strerror, str) else super().__str__()


class _RulesetAttr(ctypes.Structure):
    """struct landlock_ruleset_attr as of ABI 6; we pass only the prefix the plan's ABI knows."""

    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    ]


class _PathBeneathAttr(ctypes.Structure):
    """struct landlock_path_beneath_attr, __attribute__((packed)): 12 bytes, not 16."""

    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Plan:
    """Which write rights go where, decided once (pure) so apply() in the child has nothing left to decide."""

    abi: int
    write_roots: tuple[str, ...]  # write rights but mknod of devices beneath each (file-valid ones for a file)
    write_files: tuple[str, ...]  # device/files: WRITE_FILE, TRUNCATE, IOCTL_DEV; a directory: as a write root
    scope_ipc: bool  # ABI >= 6: no signals / abstract-unix connects to processes outside the sandbox


def _check_abi(abi: int) -> None:
    if isinstance(abi, bool) or not isinstance(abi, int) or abi < 0:  # a typo'd ABI must not silently weaken the rules
        raise LandlockError(errno.EINVAL, f"invalid Landlock ABI {abi!r}")


def handled_rights(abi: int) -> int:
    """Every write-side right the ABI knows: any right left unhandled is silently allowed everywhere."""
    _check_abi(abi)
    if abi < 1:
        return 0
    rights = _WRITE_V1
    if abi >= 2:
        rights |= ACCESS_FS_REFER  # link(2)/rename(2) of an outside file into a writable root (then writing it)
    if abi >= 3:
        rights |= ACCESS_FS_TRUNCATE  # truncate(2)/O_TRUNC of outside files, which WRITE_FILE alone does not cover
    if abi >= 5:
        rights |= ACCESS_FS_IOCTL_DEV  # ioctls on device nodes it opens outside the granted ones (e.g. disk ioctls)
    return rights


def _rule_rights(handled: int, is_dir: bool, device: bool) -> int:
    """Rights for one rule: a directory gets all handled rights but device creation, a file only what the
    kernel accepts on a file."""
    if is_dir:
        return handled & ~_NEVER_GRANTED  # everything write-side beneath this directory except mknod of devices
    if device:
        return handled & _DEVICE_FILE_RIGHTS  # a device file: write/truncate/ioctl it, nothing else
    return handled & _FILE_VALID  # a single-file root: the rest would make the kernel return EINVAL


def _ruleset_attr_size(abi: int) -> int:
    """Exact struct prefix for the ABI: older kernels reject a larger struct (E2BIG) or unknown fields."""
    if abi >= 6:
        return 24  # handled_access_fs, handled_access_net, scoped
    if abi >= 4:
        return 16  # handled_access_fs, handled_access_net
    return 8  # handled_access_fs


def _clean_paths(paths: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(paths, (str, bytes)):  # plan("/tmp") would otherwise grant "/" (the first character) and "t", "m"...
        raise TypeError(f"{what} must be a sequence of paths, not a single {type(paths).__name__}")
    out: list[str] = []
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"{what} entries must be str, got {type(path).__name__}")
        if not os.path.isabs(path):  # a relative root would follow whatever cwd the child happens to have
            raise LandlockError(errno.EINVAL, f"Landlock {what} entry {path!r} is not an absolute path")
        if "\0" in path:  # C would see a different, shorter path than the one the user approved
            raise LandlockError(errno.EINVAL, f"Landlock {what} entry {path!r} contains a NUL byte")
        if path not in out:
            out.append(path)
    return tuple(out)


def plan(write_roots: Sequence[str], write_files: Sequence[str] = DEFAULT_DEVICES, abi: int | None = None) -> Plan:
    """Pure: which rights go where for a given ABI (abi=None -> abi_version()).

    Missing paths are skipped by apply, not here: they may appear between planning and exec.
    """
    if abi is None:
        abi = abi_version()
    _check_abi(abi)
    return Plan(
        abi=abi,
        write_roots=_clean_paths(write_roots, "write_roots"),
        write_files=_clean_paths(write_files, "write_files"),
        scope_ipc=abi >= 6,  # signals/abstract sockets are how a sandboxed process would drive an outside one
    )


def _syscall(nr: int, *args: object) -> int:
    """Raw syscall; every argument is passed full-width so no stale upper register bits reach the kernel."""
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(nr), *args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def abi_version() -> int:
    """Landlock ABI of the running kernel; 0 if unsupported/disabled (ENOSYS/EOPNOTSUPP).

    Any other error (e.g. a seccomp filter answering EPERM) raises LandlockError: "unknown" is not "none".
    """
    try:
        return _syscall(
            _SYS_LANDLOCK_CREATE_RULESET,
            ctypes.c_void_p(None),
            ctypes.c_size_t(0),
            ctypes.c_ulong(LANDLOCK_CREATE_RULESET_VERSION),
        )
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EOPNOTSUPP):  # kernel without Landlock / LSM not enabled at boot
            return 0
        raise LandlockError(e.errno, f"cannot query the Landlock ABI: {os.strerror(e.errno or 0)}") from None


def _open_path(path: str, what: str, warnings: list[str]) -> int | None:
    try:
        # O_PATH: a handle to the inode without opening the device (no tty/ptmx side effects, no read access needed);
        # O_CLOEXEC: this fd must never reach the sandboxed command. Symlinks are followed on purpose:
        # the rule lands on the real inode (/dev/ptmx -> pts/ptmx), which is what the kernel checks.
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # skipping only removes rights, so it fails closed
        warnings.append(f"landlock: {what} {path!r} does not exist; no write access granted there")
        return None
    except OSError as e:
        raise LandlockError(e.errno, f"Landlock cannot open {what} {path!r}: {os.strerror(e.errno or 0)}") from None


def apply(p: Plan) -> list[str]:
    """Call in the child right before exec: afterwards it and all its descendants write only where `p` says.

    Sets PR_SET_NO_NEW_PRIVS, creates the ruleset, adds one path_beneath rule per existing path, restricts self
    and closes every fd it opened. Returns human-readable warnings (e.g. skipped missing paths). Raises
    LandlockError if abi == 0 or any step fails: a half-applied policy must never exec the command.
    """
    roots, files = _checked(p)
    handled = handled_rights(p.abi)
    warnings: list[str] = []
    _no_new_privs()
    ruleset_fd = _create_ruleset(p, handled)
    try:
        for what, paths, device in (("write root", roots, False), ("write file", files, True)):
            for path in paths:
                _add_rule(ruleset_fd, handled, path, what, device, warnings)
        try:
            _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_long(ruleset_fd), ctypes.c_ulong(0))
        except OSError as e:
            raise LandlockError(e.errno, f"landlock_restrict_self failed: {os.strerror(e.errno or 0)}") from None
    finally:
        os.close(ruleset_fd)  # fd hygiene: nothing of ours stays open into the command (it is O_CLOEXEC as well)
    return warnings


def _checked(p: Plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The plan's roots and files, once the plan is known to be enforceable exactly on this kernel."""
    _check_abi(p.abi)
    if p.abi == 0:  # no Landlock: running anyway would give the command the whole writable filesystem
        raise LandlockError(
            errno.EOPNOTSUPP, "Landlock is unavailable (ABI 0): refusing to run without write restrictions"
        )
    if p.scope_ipc and p.abi < 6:  # an 8/16-byte attr would silently drop the scope field
        raise LandlockError(errno.EINVAL, f"IPC scoping needs Landlock ABI 6, the plan is for ABI {p.abi}")
    kernel = abi_version()
    if kernel < p.abi:  # the kernel would reject unknown rights (EINVAL); say why instead
        raise LandlockError(
            errno.EOPNOTSUPP, f"the plan needs Landlock ABI {p.abi} but this kernel offers ABI {kernel}"
        )
    # Plan can be built by hand: re-check what plan() checks.
    return _clean_paths(p.write_roots, "write_roots"), _clean_paths(p.write_files, "write_files")


def _no_new_privs() -> None:
    """setuid/file-caps binaries could otherwise regain what we drop (and Landlock requires it unprivileged)."""
    if prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")


def _create_ruleset(p: Plan, handled: int) -> int:
    attr = _RulesetAttr(
        handled_access_fs=handled,  # every write-side right: denied unless a rule below grants it
        handled_access_net=0,  # network is confined by the network namespace, not here
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if p.scope_ipc else 0,  # driving outside processes
    )
    try:
        return _syscall(
            _SYS_LANDLOCK_CREATE_RULESET,
            ctypes.byref(attr),
            ctypes.c_size_t(_ruleset_attr_size(p.abi)),
            ctypes.c_ulong(0),
        )
    except OSError as e:
        raise LandlockError(e.errno, f"landlock_create_ruleset failed: {os.strerror(e.errno or 0)}") from None


def _add_rule(ruleset_fd: int, handled: int, path: str, what: str, device: bool, warnings: list[str]) -> None:
    """One path_beneath rule; a missing path is skipped with a warning (that only removes rights)."""
    fd = _open_path(path, what, warnings)
    if fd is None:
        return
    try:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)  # fstat the fd we add: no swap between check and use
        rule = _PathBeneathAttr(allowed_access=_rule_rights(handled, is_dir, device), parent_fd=fd)
        _syscall(
            _SYS_LANDLOCK_ADD_RULE,
            ctypes.c_long(ruleset_fd),
            ctypes.c_ulong(LANDLOCK_RULE_PATH_BENEATH),
            ctypes.byref(rule),
            ctypes.c_ulong(0),
        )
    except OSError as e:
        reason = os.strerror(e.errno or 0)
        raise LandlockError(e.errno, f"Landlock cannot grant writes to {what} {path!r}: {reason}") from None
    finally:
        os.close(fd)  # one fewer handle to a writable directory left around
