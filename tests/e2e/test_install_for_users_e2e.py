"""The `.venv` that `.ci/setup` builds works for every user, not only for root (issue 11).

On these machines the only Python 3.12 is pyenv's under /root (mode 0700); a venv's python is a
link to it, so before the fix `.venv/bin/sandgate` could not even start for anyone else. Here a
throwaway user runs `.venv/bin/sandgate` with NO help: unlike the other rootless tests, the
runner binds no interpreter into its view (only the checkout itself when its own location is
closed to others, as a CI clone under /root may be). Runs inside a disposable World.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.rootless import UnprivilegedUser
from ..support.world import World

REPO = Path(__file__).resolve().parent.parent.parent


def _closed_to_others(path: Path) -> bool:
    return any(not os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


@pytest.fixture
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser(base_dir="/var/tmp") as u:
        yield u


def test_another_user_runs_the_setup_venv_as_it_is(world: World, user: UnprivilegedUser) -> None:
    proj = user.home / "proj"
    proj.mkdir()
    os.chown(proj, user.uid, user.gid)
    runner = user.runner(world, paths=[REPO] if _closed_to_others(REPO) else [])
    sandgate = str(REPO / ".venv/bin/sandgate")
    r = runner.run([sandgate, "--version"], env=user.env(), cwd=proj, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{r.stderr}\n(.venv was made before .ci/setup shared its Python: run .ci/setup again)"
    assert r.stdout.startswith("sandgate ")
    r = runner.run(
        [sandgate, "run", "-q", "--", "sh", "-c", "id -u; echo made > here"],
        env=user.env(),
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(user.uid)]
    assert (proj / "here").read_text() == "made\n"
    assert (proj / "here").stat().st_uid == user.uid
