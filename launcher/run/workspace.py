"""The workspace checks of a run: what may become writable, refused before anything is set up."""

from __future__ import annotations

import os

from fsguard import policy as fspolicy
from launcher.config import checks as policychecks
from launcher.errors import UsageError
from launcher.run.options import RunOptions
from sgbase.policyerror import PolicyError


def check(opts: RunOptions, user_spec: str | None) -> None:
    """--write/--read-deny are plain paths, and no writable root is `/`, a home or holds one."""
    for p in (*opts.write, *opts.read_deny):
        try:
            fspolicy.check_path(p, None, must_not_be_root=True)
        except PolicyError as e:
            raise UsageError(f"--write/--read-deny {e}") from None
    _check_write_roots(opts, user_spec)


def _check_write_roots(opts: RunOptions, user_spec: str | None) -> None:
    """Never `/`, a home or a directory holding one as a writable root, by default or by --write.

    The threat: from `cd / && sandgate run` or `cd ~`, the default writable workspace would let a
    command plant ~/.bashrc, ~/.ssh/authorized_keys or /etc files that run outside the sandbox.
    """
    checks = policychecks.Checks.current(user=user_spec)
    if opts.policy.filesystem.write is None and (problem := policychecks.write_root_problem(".", checks)) is not None:
        raise UsageError(
            f"the current directory {os.getcwd()} would be writable, and it is "
            f"{problem.split(' is ', 1)[1].split(':', 1)[0]}; run sandgate from a project directory, "
            "or name what the command may write in a policy's filesystem.write (--write only adds to the current directory)"
        )
    for w in opts.write:
        if (problem := policychecks.write_root_problem(w, checks)) is not None:
            raise UsageError(f"--write {problem.split('entry ', 1)[1]}")
