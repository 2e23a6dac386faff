"""`sandgate audit [summary|suggest] [LOG...]`: the recent runs' logs, one row per destination, a policy."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

from launcher.config import load as lpolicy
from launcher.errors import UsageError


def main(
    action: str | None,
    named: tuple[str, ...] = (),
    as_json: bool = False,
    as_markdown: bool = False,
    name: str | None = None,
) -> int:
    """`sandgate audit` (action None), `audit summary` or `audit suggest`, over LOGs or the last run."""
    from launcher.audit import logs as auditlogs
    from launcher.audit import suggest, summary
    from netguard import audit

    if action is None:  # `sandgate audit`: the recent runs' logs
        logs = auditlogs.recent()
        if not logs:
            print(f"sandgate: no audit logs in {auditlogs.log_dir()}", file=sys.stderr)
        for mtime, size, path in logs:
            stamp = datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {size / 1024:8.1f} KiB  {path}")
        return 0
    paths = [Path(p) for p in named] or [_last_run(action)]
    try:
        records = auditlogs.read_logs(paths)
    except audit.LogError as e:
        raise UsageError(str(e)) from None
    if named:
        print(f"sandgate: reading {_named(paths)}", file=sys.stderr)
    bundled = lpolicy.bundled_rulesets()
    if action == "summary":
        rows = summary.summarize(records)
        if as_json:
            print(json.dumps(summary.as_json(rows, bundled), indent=1))
        elif as_markdown:  # for a CI job's summary page (action.yml)
            from launcher.audit import markdown

            print(markdown.format_markdown(rows, bundled), end="")
        else:
            print(summary.format_table(rows, bundled))
        if summary.fetched_nothing(records):  # stderr under --json: stdout stays the rows
            print(f"sandgate: note: {summary.NOTHING_FETCHED}", file=sys.stderr if as_json else sys.stdout)
        return 0
    sys.stdout.write(suggest.suggest(records, name=name, bundled=bundled))
    return 0


def _last_run(command: str) -> Path:
    """The last run of the workspace here (launcher.audit.logs), said on stderr; never another's."""
    from launcher.audit import logs as auditlogs
    from launcher.audit.text import escape

    here = os.getcwd()
    run = auditlogs.last_of_workspace(here)
    if run is None:
        raise UsageError(
            f"no run of this workspace ({here}) in {auditlogs.log_dir()}; run sandgate from the workspace, "
            f"or name a log: sandgate audit {command} LOG (`sandgate audit` lists them)"
        )
    learn = ", --learn" if run.learn else ""
    print(
        f"sandgate: reading the last run of {escape(run.cwd)} (task {escape(run.task)}{learn}, "
        f"started {escape(run.started)}): {run.path}",
        file=sys.stderr,
    )
    return run.path


def _named(paths: list[Path]) -> str:
    """The logs read, in one line."""
    if len(paths) == 1:
        return str(paths[0])
    shown = ", ".join(str(p) for p in paths[:3])
    return f"{len(paths)} logs: {shown}" + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
