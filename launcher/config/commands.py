"""`sandgate trust` and `sandgate allowlists`: the policy files' own subcommands."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from launcher.config import bundled as allowlists
from launcher.config import load as lpolicy
from launcher.config import yamlfile
from launcher.errors import UsageError


def trust(file: str | None, revoke: bool = False, list_all: bool = False) -> int:
    """`sandgate trust [FILE]`: let a workspace policy widen the defaults, until its content changes."""
    from launcher.config import hostilefile
    from launcher.config import trust as trusted

    store = trusted.Store.default()
    path = Path(file or ".sandgate.yaml")
    try:
        if list_all:
            for key, rec in sorted(store.records().items()):
                try:
                    now: str = trusted.status_of({key: rec}, key, hostilefile.read_file(Path(key), yamlfile.MAX_BYTES))
                except hostilefile.Unreadable:
                    now = "unreadable" if os.path.lexists(key) else "missing"
                print(f"{now:<8} {key}  sha256 {rec.sha256[:12]}  since {rec.trusted_at}")
            return 0
        if revoke:
            done = store.revoke(path)
            print(
                f"sandgate: {'no longer trusted' if done else 'was not trusted'}: {trusted.key(path)}", file=sys.stderr
            )
            return 0
        if (problem := store.problem((Path.cwd(), path.absolute().parent))) is not None:
            raise UsageError(problem)
        for key, digest in store.add(lpolicy.trust_chain(path)):
            print(f"sandgate: trusted {key} (sha256 {digest[:12]}); any change to it revokes this", file=sys.stderr)
    except trusted.TrustError as e:
        raise UsageError(str(e)) from None
    return 0


def list_bundled() -> int:
    rows = allowlists.describe_bundled()
    width = max(len(n) for n, _, _ in rows)
    for name, desc, count in rows:
        print(f"{name:<{width}}  {count:>2} hosts  {desc}")
    return 0
