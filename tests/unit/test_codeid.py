"""The daemon's socket names its code: an edit of netguard or of sgbase (which it stands on) is another daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE_ID = (
    "import sys; sys.path.insert(0, sys.argv[1]); from netguard.daemon import daemonpath; print(daemonpath.code_id())"
)


def _code_id(root: Path) -> str:
    return subprocess.run(
        [sys.executable, "-I", "-c", CODE_ID, str(root)], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_an_edit_of_netguard_or_sgbase_changes_the_daemons_code_id(tmp_path: Path) -> None:
    for package in ("netguard", "sgbase"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    first = _code_id(tmp_path)
    assert first == _code_id(tmp_path)  # stable while nothing changes
    seen = {first}
    for edited in ("sgbase/origin.py", "netguard/rules.py"):
        path = tmp_path / edited
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        seen.add(_code_id(tmp_path))
    assert len(seen) == 3
