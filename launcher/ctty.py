"""sandgate's controlling terminal, opened for its own prompts and notices (never for the sandbox), and
the signals a user (or that terminal) sends sandgate for CMD.

A run served by the fork server (launcher/forkserver/) has no controlling terminal: its worker is in a
session of its own. Its caller passes the terminal it has, opened; the worker hands it in here, and
every opener of /dev/tty in the launcher asks this module instead.
"""

from __future__ import annotations

import _signal  # the C half of signal: the console script of a served run imports no enum
import errno
import os

# Signals a user sends to sandgate that CMD should get: the launcher forwards them to the sandbox
# (launcher/run/supervise.py), a served run's console script to its worker (launcher/forkserver/client.py).
# Terminal-generated ones (Ctrl-C, Ctrl-\) already reach CMD when it is in the terminal's foreground group.
FORWARDED = (
    _signal.SIGTERM,
    _signal.SIGHUP,
    _signal.SIGUSR1,
    _signal.SIGUSR2,
    _signal.SIGINT,
    _signal.SIGQUIT,
    _signal.SIGCONT,
)

_served: list[int | None] = []  # [the caller's terminal, or None] once a worker took a run over


def hand_in(fd: int | None) -> None:
    """In a fork server's worker: the caller's terminal (close-on-exec), or None if it had none."""
    _served[:] = [fd]


def open_tty(flags: int = os.O_RDWR) -> int:
    """A new descriptor of the terminal (close-on-exec); OSError when there is none."""
    if _served:
        fd = _served[0]
        if fd is None:
            raise OSError(errno.ENXIO, "no controlling terminal")
        return os.dup(fd)  # dup: close-on-exec, and the caller's copy stays for the next prompt
    return os.open("/dev/tty", flags | os.O_NOCTTY | os.O_CLOEXEC)
