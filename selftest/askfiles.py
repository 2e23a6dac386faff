"""A probe inside asks verify outside for something only the outside can do, through files in the results dir.

Some of issue 22's probes need a second party while they run: a victim sandbox whose allowed request
must be answered while the probe hogs connections, the daemon's memory while the probe streams an
endless head. The probe cannot start a sandbox or see the daemon's /proc from inside; verify can. The
workspace's results directory is the one place both sides write: the probe puts
`ask-<what>-<mark>.json` there (renamed into place, never seen half written) and waits for
`answer-<what>-<mark>.json`, which verify's sidecar (selftest/sidecar.py) writes the same way.

Stdlib only: the probe runner imports this inside the sandbox.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

POLL = 0.05
_NAME = re.compile(r"ask-([a-z0-9-]+)--(.+)\.json")


def ask_path(results_dir: str | Path, what: str, mark: str) -> Path:
    return Path(results_dir) / f"ask-{what}--{mark}.json"


def answer_path(results_dir: str | Path, what: str, mark: str) -> Path:
    return Path(results_dir) / f"answer-{what}--{mark}.json"


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Renamed into place: the other side never reads half a file."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(body))
    part.chmod(0o644)  # the other side may be another uid (verify as root, the command as nobody)
    os.replace(part, path)


def ask(results_dir: str, what: str, mark: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """Inside: ask, then wait up to `timeout` s for the answer; None when none came (no verify outside)."""
    answer = answer_path(results_dir, what, mark)
    answer.unlink(missing_ok=True)
    write_json(ask_path(results_dir, what, mark), body)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer.exists():
            got = json.loads(answer.read_text())
            return got if isinstance(got, dict) else None
        time.sleep(POLL)
    return None


def pending(results_dir: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """Outside: every ask not answered yet, as (what, mark, body); each ask file is taken (removed)."""
    out = []
    try:
        names = sorted(os.listdir(results_dir))
    except OSError:
        return []
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None:
            continue
        path = results_dir / name
        try:
            body = json.loads(path.read_text())
            path.unlink()
        except (OSError, ValueError):
            continue
        out.append((m.group(1), m.group(2), body if isinstance(body, dict) else {}))
    return out


def answer(results_dir: Path, what: str, mark: str, body: dict[str, Any]) -> None:
    """Outside: the answer the probe waits for."""
    write_json(answer_path(results_dir, what, mark), body)
