"""The rows `sandgate verify` judges itself, outside the probe runner: their names and groups.

Its own module because both the row bodies (untrusted.py, judge.py) and `--only` (selection.py) name them,
and selection.py is what passes.py, which untrusted.py builds on, takes: one place, no circle.
"""

from __future__ import annotations

DAEMON_AFTER_RUN = "daemon_after_run"
UNTRUSTED = "untrusted_workspace_policy"
FRONT_DOOR = "inspected_front_door"
#: Row name -> its group.
HOST_ROWS = {DAEMON_AFTER_RUN: "process", UNTRUSTED: "filesystem", FRONT_DOOR: "network"}
