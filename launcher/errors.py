"""The user's mistakes and sandgate's own failures: one line, `sandgate: error: ...`, exit 125.

A traceback is for sandgate's bugs only. A user mistake (a bad address, a missing privilege, a
sandbox that could not be set up) is one line the user can act on, and an exit code that a
wrapper tool cannot confuse with CMD's own (like env(1) and timeout(1)).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

EXIT_ERROR = 125  # like env(1)/timeout(1): the tool failed, not the command
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports it
EXIT_INTERRUPTED = 130  # 128 + SIGINT


class UsageError(Exception):
    """A user mistake outside policy files (bad address, missing privilege...)."""


class RunError(UsageError):
    """Setup failed before CMD started; one line for the user, exit 125."""


def render(message: str) -> str:
    """The one line every user-facing error is printed as."""
    return f"sandgate: error: {message}"


def fail(message: str) -> NoReturn:
    print(render(message), file=sys.stderr)
    sys.exit(EXIT_ERROR)


def broken_pipe() -> int:
    """`sandgate audit summary LOG | head -1`: the reader left; no traceback, and no second error
    when the interpreter flushes stdout at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE
