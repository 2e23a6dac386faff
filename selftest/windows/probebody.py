"""The Windows probe bodies `sandgate verify` runs, and where each part of issue 28 adds its own.

A body is a command run inside a real sandbox (the same backend as `sandgate run`) that writes
what it saw to RESULT in its working directory, and a judge that reads it. Each body must check
the blocked action failed for the right reason AND the matching permitted action worked in the
same run (an own window, a write to the workspace...), so a probe that cannot run never passes.

Where to add bodies: one module per mechanism, each with a BODIES tuple, listed in allbodies.py:
probedesktop.py (private desktop/SendInput: win-run); the `.git` rename, alternate data streams,
`.GiT` case variants and 8.3 names go in probeacl.py (win-acl); SMB/WebDAV and WMI/scheduled
task escapes in probenet.py (win-net).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.run.windows.winapi import WinApi

RESULT = "sandgate-probe.json"  # written by the probe in its working directory
#: The body's script, written to the scratch workspace by verify and run from there: never `python -c
#: SCRIPT`, because CreateProcessWithLogonW takes at most 1024 characters of command line ("The maximum
#: length of this string is 1024 characters", lpCommandLine) and every body's script is longer.
SCRIPT_FILE = "sandgate-probe.py"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str
    #: not ok, and a documented gap sandgate cannot close on this machine (docs/windows.md "Known gaps"):
    #: reported as GAP on every run, never as passed, and not counted among the failures of the exit code
    gap: bool = False


@dataclass(frozen=True)
class ProbeBody:
    name: str  # a key of probes.PROBES or a probes.WINDOWS_ONLY name
    group: str  # network, filesystem, process (verify --only)
    script: str  # Python run as `python -I SCRIPT_FILE NAME` inside the sandbox; writes RESULT
    judge: Callable[[int, dict[str, Any] | None], Verdict]  # (exit code, RESULT or None)
    #: made before the run (what the plan must find there, e.g. the repository probeacl attacks);
    #: returns what takes it away after the run
    prepare: Callable[[WinApi, str], Callable[[], None]] | None = None

    def argv(self, python: str, script_file: str) -> tuple[str, ...]:
        """-I: neither the workspace (the script's folder) nor PYTHON* variables shape its imports."""
        return (python, "-I", script_file, self.name)  # the name last: fakes and logs tell bodies apart


def parse(data: bytes | None) -> dict[str, Any] | None:
    """RESULT as written; None when missing or torn (the judge then fails the row)."""
    if data is None:
        return None
    try:
        got = json.loads(data)
    except ValueError:
        return None
    return got if isinstance(got, dict) else None
