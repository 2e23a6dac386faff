"""`sandgate audit [summary|suggest] [LOG...]`: the recent runs' logs, one row per destination, a policy."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from launcher.config import load as lpolicy
from launcher.errors import UsageError


def main(args: argparse.Namespace) -> int:
    from launcher.audit import logs as auditlogs
    from launcher.audit import suggest, summary
    from netguard import audit

    if args.audit_command is None:  # `sandgate audit`: the recent runs' logs
        logs = auditlogs.recent()
        if not logs:
            print(f"sandgate: no audit logs in {auditlogs.log_dir()}", file=sys.stderr)
        for mtime, size, path in logs:
            stamp = datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {size / 1024:8.1f} KiB  {path}")
        return 0
    paths = [Path(p) for p in args.logs]
    if not paths:
        last = auditlogs.latest()
        if last is None:
            raise UsageError(
                f"no audit logs in {auditlogs.log_dir()}; name one: sandgate audit {args.audit_command} LOG"
            )
        paths = [last]
    try:
        records = auditlogs.read_logs(paths)
    except audit.LogError as e:
        raise UsageError(str(e)) from None
    bundled = lpolicy.bundled_rulesets()
    if args.audit_command == "summary":
        rows = summary.summarize(records)
        if args.json:
            print(json.dumps(summary.as_json(rows, bundled), indent=1))
        else:
            print(summary.format_table(rows, bundled))
        return 0
    sys.stdout.write(suggest.suggest(records, name=args.name, bundled=bundled))
    return 0
