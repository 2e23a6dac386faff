"""The test command (`.venv/bin/python -m tests`): the suite as two pytest invocations under one lock.

The machine-wide tests (tests/e2e/: namespaces, users, daemons, canary timings) must never run
beside each other, the rest may: first the rest in two processes (`-n 2`), then tests/e2e/ in
one, each its own pytest, with public options only. The suite lock (suitelock.py) is held once
across both, so a second suite on the machine waits for the whole of this one. Extra arguments
go to both invocations; paths go to the one whose tests they name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from . import suitelock

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
MACHINE = TESTS / "e2e"

#: pytest options whose value is the next argument (not a path): enough for `-k expr`, `-m mark`...
_VALUED = frozenset(
    (  # noqa: SIM905 (one string reads better than 29 lines of one option each)
        "-k -m -p -o -c -n -W -r --deselect --ignore --ignore-glob --durations --durations-min --maxfail --tb "
        "--rootdir --basetemp --junitxml --junit-xml --confcutdir --log-level --log-cli-level --log-file "
        "--override-ini --capture --import-mode --dist --color --timeout"
    ).split()
)
_STOP_EARLY = frozenset({"-x", "--exitfirst", "--sw", "--stepwise"})
_MEANING = {0: "passed", 1: "tests failed", 2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests"}


@dataclass(frozen=True)
class Part:
    """One pytest invocation of the suite."""

    title: str
    argv: tuple[str, ...]  # after `python -m pytest`


def _split(args: Sequence[str], cwd: Path) -> tuple[list[str], list[Path]]:
    """The options (with their values) and the paths (absolute) among the extra arguments."""
    options: list[str] = []
    paths: list[Path] = []
    valued = False
    for arg in args:
        if valued or arg.startswith("-"):
            options.append(arg)
            valued = not valued and arg in _VALUED
        else:
            paths.append(cwd / arg)
    return options, paths


def _where(path: Path) -> tuple[bool, bool]:
    """(names tests of the rest, names machine-wide tests) for one path argument."""
    plain = Path(str(path).split("::", 1)[0]).resolve()
    if plain == MACHINE or MACHINE in plain.parents:
        return False, True
    return True, plain in MACHINE.parents


def plan(args: Sequence[str], cwd: Path) -> list[Part]:
    """The invocations for these extra arguments: the rest, then tests/e2e/; one a path excludes is left out."""
    options, paths = _split(args, cwd)
    if not paths:
        rest, machine = [str(TESTS)], [str(MACHINE)]
    else:
        rest = [str(p) for p in paths if _where(p)[0]]
        machine = list(dict.fromkeys(str(MACHINE) if _where(p)[0] else str(p) for p in paths if _where(p)[1]))
    parts = []
    if rest:
        parts.append(Part("the rest, in 2 processes", ("-n", "2", f"--ignore={MACHINE}", *options, *rest)))
    if machine:
        parts.append(Part("the machine-wide tests/e2e/, one at a time", (*options, "-n0", *machine)))
    return parts


def stops_early(args: Sequence[str]) -> bool:
    """Whether the caller asked to stop at the first failure (then a failed first part ends the suite)."""
    return any(a in _STOP_EARLY or a.startswith("--maxfail") for a in args)


def overall(codes: Sequence[int]) -> int:
    """The suite's exit code: the first part's failure, else 0 if any part ran tests, else 5 (none)."""
    failed = [c for c in codes if c not in (0, 5)]
    if failed:
        return failed[0]
    return 0 if 0 in codes else 5


def summary(parts: Sequence[Part], codes: Sequence[int]) -> str:
    """One line per part, including one that did not run."""
    lines = []
    for i, part in enumerate(parts):
        if i < len(codes):
            meaning = f"ended by signal {codes[i] - 128}" if codes[i] > 128 else _MEANING.get(codes[i], "failed")
            lines.append(f"sandgate tests: {part.title}: exit {codes[i]} ({meaning})")
        else:
            lines.append(f"sandgate tests: {part.title}: not run (stopped after a failure or an interrupt)")
    return "\n".join(lines)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(argv: Sequence[str]) -> int:
    """One pytest, waited for to its end: Ctrl-C reaches it too and it must tear its worlds down.

    Its exit code; 143 (128 + SIGTERM, as a shell says it) when the runner was told to stop."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *argv], cwd=ROOT)
    told: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        # As a Ctrl-C: pytest then tears its fixtures (worlds, users) down, and xdist its workers;
        # a SIGTERM would end xdist's controller alone and leave a busy worker behind.
        told.append(signum)
        proc.send_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                code = proc.wait()
                return 128 + told[0] if told else code if code >= 0 else 128 - code
            except KeyboardInterrupt:
                continue  # the child got the same SIGINT; killing it would leave its worlds behind
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(args: Sequence[str]) -> int:
    """Run both parts under the suite lock; say how each ended; exit non-zero if either failed."""
    parts = plan(args, Path.cwd())
    held = None if os.environ.get(suitelock.HELD) else suitelock.hold(_say)
    codes: list[int] = []
    try:
        for part in parts:
            _say(f"sandgate tests: {part.title}")
            codes.append(_run(part.argv))
            if codes[-1] == 2 or codes[-1] > 128 or (stops_early(args) and codes[-1] not in (0, 5)):
                break
    finally:
        if held is not None:
            suitelock.release(held)
    _say(summary(parts, codes))
    return overall(codes)
