"""launcher/gcpause.py: the collector paused only in the console script, and resumed (with a freeze) only there."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import gc, sys
from launcher import gcpause
sys.argv[0] = sys.argv[1]
gc.enable()
gcpause.pause_in_console_script()
paused = not gc.isenabled()
before = gc.get_freeze_count()
gcpause.resume()
print(paused, gc.isenabled(), gc.get_freeze_count() > before)
"""


def _run(argv0: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", CODE, argv0], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_console_script_pauses_then_resumes_with_what_it_made_frozen() -> None:
    assert _run("/usr/bin/sandgate") == "True True True"


def test_elsewhere_nothing_is_paused_and_nothing_frozen() -> None:
    """A library user or a test calling launch.main: resume() must not freeze their whole heap."""
    assert _run("/usr/bin/python-app") == "False True False"
