"""The cyclic garbage collector paused while the console script imports, resumed before it serves.

Imports create objects that live as long as the process: the collector's passes over them (~100
modules' worth) are ~5 ms of every `sandgate run` start and find nothing. Paused only in the
console script (a library user, a test run or the daemon keeps it as it is); resumed by
launcher.cli once the command's imports are done (`sandgate run`: once its policy is compiled), so a
run's supervision, `sandgate proxy` and every other long-lived part collect as usual.
"""

from __future__ import annotations

import gc
import sys


def pause_in_console_script() -> None:
    if sys.argv[0].endswith("/sandgate"):
        gc.disable()


def resume() -> None:
    """The collector back on; what was imported (and, for a run, its compiled policy: 10^5 rules of a hosts
    file) is frozen first: it lives as long as the process, and no collection (nor a forked holder's
    copy-on-write) need walk it again. Nothing to do where it was never paused."""
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()
