"""`sandgate verify`'s command: its options checked, then the self-test (imported only when it runs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launcher.config import load as lpolicy
from launcher.errors import UsageError
from selftest import selection, verify


def main(policy: tuple[str, ...], as_json: bool, only_spec: str | None) -> int:
    try:
        only = selection.parse_only(only_spec)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for p in policy:
        lpolicy.build_policy([Path(p)], [], [])  # a policy error is reported before any namespace exists
    # An ordinary user's PATH often lacks the sbin directories, where nft (and on some systems ip) live.
    path = os.environ.get("PATH", "").split(":")
    os.environ["PATH"] = ":".join([*path, *(d for d in ("/usr/sbin", "/sbin") if d not in path)])
    if shutil.which("nft") is None:
        raise UsageError("nft not found; install nftables (apt-get install nftables)")
    try:
        return verify.main([Path(p) for p in policy], as_json, only)
    except verify.VerifyError as e:
        raise UsageError(str(e)) from None
