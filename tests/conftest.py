"""Shared fixtures: the isolated fake internet (selftest/world.py, via tests/support/world.py) for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import suitelock
from .support.daemonfake import Web
from .support.runner import Sandgate
from .support.world import World, cleanup_stale, new_world

# ---- machine-wide tests: the directory tests/e2e/, run one by one after the rest (tests/__main__.py)

#: Tests that share what is machine-wide (`ip netns list`, the users, each user's daemon and runs under
#: /run/sandgate, the timing of canaries that must time out): two at once would judge each other's leftovers.
MACHINE_DIR = Path(__file__).resolve().parent / "e2e"
_TESTS_DIR = MACHINE_DIR.parent
_MACHINE_FIXTURES = frozenset({"world", "sandgate", "unprivileged"})
RIGHT_COMMAND = ".venv/bin/python -m tests"


def machine_wide(path: Path) -> bool:
    """Whether a test file is one of the machine-wide tests."""
    return path == MACHINE_DIR or MACHINE_DIR in path.parents


def _covers_machine_dir(config: pytest.Config) -> bool:
    """Whether this run's paths reach into tests/e2e/ (not counting an `--ignore` of it)."""
    here = config.invocation_params.dir
    ignored = [(here / p).resolve() for p in config.getoption("ignore") or ()]
    if any(i == MACHINE_DIR or i in MACHINE_DIR.parents for i in ignored):
        return False
    for arg in config.args:
        path = (here / arg.split("::", 1)[0]).resolve()
        if machine_wide(path) or path in MACHINE_DIR.parents:
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Refuse machine-wide tests in parallel (xdist `-n`): two workers would run them beside each other."""
    parallel = getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
    if (
        parallel
        and not config.option.collectonly
        and not hasattr(config, "workerinput")
        and _covers_machine_dir(config)
    ):
        raise pytest.UsageError(
            "sandgate tests: the machine-wide tests (tests/e2e/) run one at a time, never with -n: "
            f"run the suite with `{RIGHT_COMMAND}`, or these tests with -n0"
        )


# ---- one suite at a time on this machine (tests/support/suitelock.py)

_SUITE_LOCK = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)  # before xdist's own sessionstart starts the workers
def pytest_sessionstart(session: pytest.Session) -> None:
    """The controller waits for any other suite on the machine, then holds the lock to the end.

    Not xdist workers or a pytest this suite starts (test_rootless_support): they are this suite."""
    config = session.config
    if hasattr(config, "workerinput") or os.environ.get(suitelock.HELD):
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")  # stderr is captured here; the terminal is not
    say = tr.write_line if tr is not None else (lambda line: print(line, file=sys.__stderr__, flush=True))
    config.stash[_SUITE_LOCK] = suitelock.hold(say)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Release after everything, workers included, is done (a killed run: the kernel releases it)."""
    fd = config.stash.get(_SUITE_LOCK, None)
    if fd is not None:
        del config.stash[_SUITE_LOCK]
        suitelock.release(fd)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that builds worlds, users or a sandbox outside tests/e2e/ is a mistake: say so."""
    for item in items:
        ours = _TESTS_DIR in item.path.parents  # not an inner pytest run's own test file (test_rootless_support)
        if ours and set(getattr(item, "fixturenames", ())) & _MACHINE_FIXTURES and not machine_wide(item.path):
            raise pytest.UsageError(
                f"{item.nodeid} uses a world, a sandbox or a throwaway user: move its module to tests/e2e/, "
                "the machine-wide tests, so it never runs beside another such test"
            )


@pytest.fixture(scope="session", autouse=True)
def _sandgate_cleanup_stale() -> None:
    """Remove namespaces left by an earlier pytest run that was killed before its teardown ran.

    Without root/ip there is nothing we could have created; the `world` fixture reports that as a failure.
    """
    if os.geteuid() == 0 and shutil.which("ip"):
        cleanup_stale()


@pytest.fixture
def world() -> Iterator[World]:
    """A fresh fake internet (support/world.py's new_world: fails, never skips, without root/ip/nft)."""
    with new_world() as w:
        yield w


@pytest.fixture
def sandgate(world: World) -> Sandgate:
    """`sandgate run` as root inside `world`, in its tmp directory, with the tests' plain environment.

    A module that overrides `world` gets its runner in that world. For the throwaway user, build
    `Sandgate(unprivileged.runner(world), ...)` or `dataclasses.replace(sandgate, where=...)`.
    """
    return Sandgate(world, cwd=world.tmp)


# ---- the throwaway unprivileged user (tests/support/rootless.py): sandgate must work without sudo

from .support.rootless import UnprivilegedUser, cleanup_stale_users  # noqa: E402


@pytest.fixture(scope="session")
def _sandgate_cleanup_stale_users(_sandgate_cleanup_stale: None) -> None:
    """Remove test users left by a killed earlier run; after the namespace sweep, which ends their processes."""
    if os.geteuid() == 0 and shutil.which("userdel", path="/usr/sbin:/usr/bin:/sbin:/bin"):
        cleanup_stale_users()


@pytest.fixture
def unprivileged(_sandgate_cleanup_stale_users: None) -> Iterator[UnprivilegedUser]:
    """A fresh ordinary user (no sudo, no capabilities), removed after the test even if it fails.

    `unprivileged.runner(world)` runs commands as it inside the world. Fails (never skips) without
    root or useradd/userdel, like `world`.
    """
    missing = [t for t in ("useradd", "userdel") if shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(
            "the sandgate rootless tests create a throwaway user: they need root and useradd/userdel (passwd); "
            f"euid={os.geteuid()} missing={missing or 'none'}. Run the tests as root after .ci/setup.",
            pytrace=False,
        )
    with UnprivilegedUser() as user:
        yield user


@pytest.fixture
def web() -> Iterator[Web]:
    """A fake upstream HTTP server on 127.0.0.1 that counts requests (tests/support/daemonfake.py)."""
    w = Web()
    try:
        yield w
    finally:
        w.close()
