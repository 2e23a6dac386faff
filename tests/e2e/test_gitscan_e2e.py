"""The remembered walk for git directories (fsguard/gitscan.py, issue 25), end to end: a repository
that appears in a directory the last run's walk remembered is still found and protected, even with
the directory's mtime set back to hide the change. Real `sandgate run`, real git, in a World."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsguard import gitscan

from ..support.runner import Sandgate, env
from ..support.world import World, new_world

TRY = 't() { name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "$name=WRITTEN"; else echo "$name=refused"; fi; }\n'


@pytest.fixture
def w() -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    with new_world() as world:
        yield world


def remembered(ws: Path) -> set[str]:
    """The directories below ws the runs' walks remember (root's runtime directory, as the runner runs)."""
    out: set[str] = set()
    for cache in Path("/run/sandgate/gitscan").glob("*.walk"):
        out |= set(gitscan.load(str(cache), str(ws)))
    return out


def test_a_repository_made_in_a_remembered_directory_is_protected(w: World) -> None:
    base = Path(tempfile.mkdtemp(prefix="sandgate-gitscan-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    try:
        ws = base / "ws"
        deep = ws / "vendor" / "lib"
        deep.mkdir(parents=True)
        time.sleep(gitscan.CTIME_SLACK_NS / 1e9 + 0.3)  # settled: the next walk may remember them
        sg = Sandgate(w, quiet=True, cwd=ws, timeout=60)
        first = sg.run(audit=base / "a1.jsonl", cmd=["true"])
        assert first.returncode == 0, first.stderr
        assert str(deep) in remembered(ws)  # the next run lists it again only if it changed
        st = os.stat(deep)
        subprocess.run(["git", "init", "-q", str(deep)], check=True, env=env(), capture_output=True)
        os.utime(deep, ns=(st.st_atime_ns, st.st_mtime_ns))  # the change hidden from an mtime check
        script = TRY + (
            "t hook sh -c 'printf \"#!/bin/sh\\ntouch /x\\n\" > vendor/lib/.git/hooks/pre-commit'\n"
            "t config sh -c 'echo \"[core] fsmonitor = touch /x\" >> vendor/lib/.git/config'\n"
            "t file sh -c 'echo ok > vendor/lib/file.txt'\n"
        )
        r = sg.run(audit=base / "a2.jsonl", cmd=["sh", "-c", script])
        assert r.stdout.split() == ["hook=refused", "config=refused", "file=WRITTEN"], r.stderr
        assert not (deep / ".git/hooks/pre-commit").exists()
        assert "fsmonitor" not in (deep / ".git/config").read_text()
        assert (deep / "file.txt").read_text() == "ok\n"  # the permitted write in the same run
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)
