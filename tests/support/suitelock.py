"""One test suite at a time on a machine: an exclusive flock on a fixed machine-wide path.

Two suites at once judge each other's namespaces, users, daemons and canary timings (issue 29).
The test command (tests/__main__.py) takes the lock once for both of its pytest runs; a pytest
started alone takes it in its controller (tests/conftest.py) at session start. Either holds it to
the end; the kernel drops it when the process dies, so a killed run never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

#: Tried in order: /run/lock is the machine's lock directory; /var/tmp where it is missing.
LOCK_PATHS = ("/run/lock/sandgate-tests.lock", "/var/tmp/sandgate-tests.lock")
#: Set in the environment of everything the holding suite starts (the runner's two pytest runs, xdist
#: workers, the inner pytest runs of test_rootless_support): they are that suite, and waiting for it
#: would deadlock.
HELD = "SANDGATE_TESTS_LOCK_HELD"


def _open(paths: tuple[str, ...]) -> tuple[int, str]:
    last: OSError | None = None
    for path in paths:
        try:
            # Read-only is enough for flock: a suite of another user can take the same lock.
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            last = e
            continue
        return fd, path
    raise RuntimeError(f"sandgate tests: cannot open a suite lock at any of {', '.join(paths)}: {last}")


def hold(say: Callable[[str], None], paths: tuple[str, ...] = LOCK_PATHS) -> int:
    """Take the suite lock, waiting (and saying so once, via `say`) while another suite holds it.

    Returns the descriptor that holds it; closing it (or the process ending) releases the lock."""
    fd, path = _open(paths)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say(f"sandgate tests: another test suite on this machine holds {path}; waiting for it to finish")
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.environ[HELD] = str(os.getpid())
    return fd


def release(fd: int) -> None:
    """Let the next suite run."""
    os.environ.pop(HELD, None)
    os.close(fd)
