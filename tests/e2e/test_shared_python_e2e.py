"""The interpreter `.ci/setup` shares with other users works for their own environments (issue 26).

Root's setup copies a pyenv Python that other users cannot reach (under a 0700 /root) into
`.venv/python`. The copy's sysconfig still named the original prefix, and virtualenv (so poetry and
pdm) stats `LIBDIR/libpython3.X.so.1.0` there: `Permission denied` for every other user. Here a
throwaway user, with no help (nothing bound into its view), makes a venv and a virtualenv with the
interpreter the checkout's `.venv` is based on, and runs the Python of each. Inside a disposable World
(no network: virtualenv seeds from the wheels it carries).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.rootless import UnprivilegedUser, UserRunner
from ..support.world import World

REPO = Path(__file__).resolve().parent.parent.parent
VENV = REPO / ".venv"

#: What virtualenv's CPython3Posix asks of the interpreter before it makes anything.
LIBPYTHON = """\
import os, sysconfig
v = sysconfig.get_config_vars()
lib = os.path.join(v["LIBDIR"], v["INSTSONAME"]) if v.get("Py_ENABLE_SHARED") else None
print("shared" if lib is None or os.path.exists(lib) else "missing", lib)
"""


def _base_python() -> Path:
    """The interpreter `.venv` was made with (pyvenv.cfg's `executable`): the one other users get."""
    for line in (VENV / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "executable":
            return Path(value.strip())
    raise AssertionError(f"no executable in {VENV / 'pyvenv.cfg'}: run .ci/setup")


def _closed_to_others(path: Path) -> bool:
    return any(not os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


@pytest.fixture
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser(base_dir="/var/tmp") as u:
        yield u


def _as(runner: UserRunner, user: UnprivilegedUser, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**user.env(), "VIRTUALENV_OVERRIDE_APP_DATA": str(user.home / ".virtualenv-data")}
    return runner.run(list(cmd), env=env, cwd=user.home, capture_output=True, text=True, timeout=120)


def test_another_user_makes_a_venv_and_a_virtualenv_with_the_shared_python(
    world: World, user: UnprivilegedUser
) -> None:
    python = _base_python()
    runner = user.runner(world, paths=[REPO] if _closed_to_others(REPO) else [])
    r = _as(runner, user, str(python), "-c", LIBPYTHON)
    assert r.returncode == 0 and r.stdout.startswith("shared"), f"{r.stdout}{r.stderr}\n(run .ci/setup again)"

    r = _as(runner, user, str(python), "-m", "venv", "v1")
    assert r.returncode == 0, r.stderr
    r = _as(runner, user, str(user.home / "v1/bin/python"), "-c", "import sys, ssl; print(sys.prefix)")
    assert (r.returncode, r.stdout.strip()) == (0, str(user.home / "v1")), r.stderr

    # virtualenv as poetry and pdm call it (its default and its --copies, which copies libpython).
    for mode in ([], ["--copies"]):
        dest = user.home / f"v2{''.join(mode)}"
        r = _as(runner, user, str(VENV / "bin/python"), "-m", "virtualenv", "-q", "--no-periodic-update", *mode,
                "-p", str(python), str(dest))  # fmt: skip
        assert r.returncode == 0, f"virtualenv {mode}: {r.stderr}"
        r = _as(runner, user, str(dest / "bin/python"), "-c", "import sys, sqlite3; print(sys.prefix)")
        assert (r.returncode, r.stdout.strip()) == (0, str(dest)), r.stderr
        r = _as(runner, user, str(dest / "bin/python"), "-m", "pip", "--version")
        assert r.returncode == 0 and str(dest) in r.stdout, r.stderr
