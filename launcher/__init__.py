"""sandgate's launcher: the run, which puts netguard and fsguard together (selftest, the proof, stands apart)."""

from launcher import timings as _timings

_timings.mark("interpreter")  # the first sandgate code a run executes: Python and `site` are up

import sys as _sys  # noqa: E402

from launcher import prestart as _prestart  # noqa: E402

_args = _prestart.command_args(_sys.argv, _sys.orig_argv)
if _prestart.wanted(_args):
    from launcher.forkserver import client as _forkclient

    _forkclient.serve(_args or [])  # a warm run served by this context's fork server: it exits there
    if _prestart.start():  # `sandgate run`, first: a cold daemon starts while everything below is imported
        _forkclient.spawn_missed()  # a warm run without a fork server: the next ones get one

from launcher import gcpause as _gcpause  # noqa: E402
from sgbase import dataclasscache as _dataclasscache  # noqa: E402  (after the mark: it is sandgate's own cost)

_gcpause.pause_in_console_script()  # until launcher.cli has imported the command's modules
_dataclasscache.install(
    _dataclasscache.table_path("launcher")
)  # before any record class is made: every run imports ~40 of them
