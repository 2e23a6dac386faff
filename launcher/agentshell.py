"""`sandgate-shell`: sandgate as the shell of a program that runs commands through one (a coding agent).

The agent stays outside; every command it hands to this "shell" runs in a fresh `sandgate run` in
the current directory, with the options of $SANDGATE_SHELL_OPTS (e.g. `--allow pypi`). It takes
the two ways agents pass a command:

    sandgate-shell -c 'CMD' [NAME ARGS...]   # a program honouring $SHELL (Aider: `$SHELL -c CMD`)
    sandgate-shell -lc 'CMD'                 # any leading shell flags go to the inner shell as given
    sandgate-shell 'CMD'                     # one command string (Claude Code's CLAUDE_CODE_SHELL_PREFIX)
    sandgate-shell                           # an interactive shell inside

The inner shell is $SANDGATE_SHELL_INNER (default /bin/bash). Inside, SHELL names the inner shell,
so a tool that starts $SHELL inside does not start sandgate again.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OPTS_VAR = "SANDGATE_SHELL_OPTS"
INNER_VAR = "SANDGATE_SHELL_INNER"
DEFAULT_INNER = "/bin/bash"


class UsageError(Exception):
    """A mistake in how the wrapper was configured: one line for the user."""


@dataclass(frozen=True)
class Plan:
    """What to exec: the sandgate command line and the environment it gets."""

    argv: list[str]
    env: dict[str, str]


def sandgate_argv(executable: str = sys.executable) -> list[str]:
    """How to start sandgate: the console script beside this interpreter, else `python -P -m launcher.cli`.

    `-P`: never `python -m` with the current directory first on sys.path. The directory is the
    agent's workspace, an untrusted checkout: its own `launcher/` would run outside the sandbox.
    """
    beside = os.path.join(os.path.dirname(executable), "sandgate")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return [beside]
    return [executable, "-P", "-m", "launcher.cli"]


def shell_args(args: Sequence[str]) -> list[str]:
    """The inner shell's arguments for what the agent passed: flags as given, a bare string as `-c`."""
    if not args:
        return []  # interactive
    if args[0].startswith("-"):
        return list(args)  # `-c CMD`, `-lc CMD`, `-l -c CMD ...`: the shell reads them as it always does
    return ["-c", args[0], *args[1:]]  # CLAUDE_CODE_SHELL_PREFIX: the command string is $1


def plan(args: Sequence[str], environ: Mapping[str, str], sandgate: Sequence[str]) -> Plan:
    """`sandgate run OPTS -- INNER ARGS` and the environment for it. Pure."""
    try:
        opts = shlex.split(environ.get(OPTS_VAR, ""))
    except ValueError as e:
        raise UsageError(f"${OPTS_VAR} is not a valid option list ({e}); quote it as for a shell") from None
    if "--" in opts:
        raise UsageError(f"${OPTS_VAR} holds sandgate options only; the command comes from the agent")
    inner = environ.get(INNER_VAR) or DEFAULT_INNER
    if not os.path.isabs(inner):
        raise UsageError(f"${INNER_VAR} must be an absolute path to a shell (e.g. /bin/bash), not {inner!r}")
    # SHELL inside is the real shell: a tool inside that starts $SHELL must not start sandgate again.
    env = {**environ, "SHELL": inner}
    return Plan([*sandgate, "run", *opts, "--", inner, *shell_args(args)], env)


def main(argv: Sequence[str] | None = None) -> int:
    """Replace this process with sandgate (signals, the terminal and the exit status pass straight through)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        p = plan(args, os.environ, sandgate_argv())
    except UsageError as e:
        print(f"sandgate: error: {e}", file=sys.stderr)
        return 125
    try:
        os.execve(p.argv[0], p.argv, p.env)
    except OSError as e:
        print(f"sandgate: error: cannot start sandgate ({p.argv[0]}: {e.strerror}); is it installed?", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
