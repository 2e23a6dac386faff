"""Process-level hygiene for the sandbox's processes: parent-death signal, signal dispositions, no_new_privs.

Each call defends one thing; `prctl` is the one binding of prctl(2) that every fsguard module calls. The other confinements of the command have modules of their own:
capabilities and the keyring (fsguard.caps), the syscall filter (fsguard.seccomp), Landlock
(fsguard.landlock); fd hygiene is done where each descriptor is opened (O_CLOEXEC).
"""

from __future__ import annotations

import ctypes
import os
import signal

_libc = ctypes.CDLL(None, use_errno=True)
# prctl is variadic; fixing the argument types makes the unused arguments real zero unsigned longs
# (PR_SET_NO_NEW_PRIVS rejects non-zero arg3..arg5, and a c_int would leave the upper halves undefined).
_prctl = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, use_errno=True
)(("prctl", _libc))
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    """prctl(2) with arg4 and arg5 zero, for every fsguard module: its result, -1 with errno set on failure
    (each caller raises its own error, naming what it could not enforce)."""
    return int(_prctl(option, arg2, arg3, 0, 0))


def die_with_parent(expected_parent: int | None) -> None:
    """SIGKILL this process when its parent dies, so a SIGKILLed sandgate leaves no sandbox behind.

    Checked against the parent we expect: if it already died before the prctl took effect,
    we were re-parented and must exit now instead of running unsupervised. The first process
    of a new pid namespace sees its parent as pid 0 and passes None (it checks its pipe instead).
    """
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_PDEATHSIG): {os.strerror(e)}")
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(125)


def reset_signals() -> None:
    """Default dispositions and an empty mask before exec: ignored signals survive exec otherwise,
    and a command that cannot be interrupted by Ctrl-C is not 'as if it ran bare'."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def no_new_privs() -> None:
    """setuid/setgid binaries and file capabilities no longer raise privileges (sudo, su, ping...)."""
    if prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(e)}")
