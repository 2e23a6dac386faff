"""Shared fixtures: the isolated fake internet (selftest/world.py, via tests/support/world.py) for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest

from .support import suitelock
from .support.daemonfake import Web
from .support.runner import Sandgate
from .support.world import World, cleanup_stale, new_world

# ---- two processes (pytest-xdist, `-n 2` in pyproject): the machine's tests in one of them, one by one

MACHINE = "sandgate-machine"
_MACHINE_FIXTURES = frozenset({"world", "sandgate", "unprivileged"})
# Unit modules that touch machine-wide state without those fixtures (or beside them):
_MACHINE_MODULES = frozenset(
    {
        "tests/unit/test_probes.py",  # verify's probes and canaries, its sandgate-v namespaces
        "tests/unit/test_whoasked.py",  # named network namespaces (ip netns add)
        "tests/unit/test_cli_errors.py",  # a root `sandgate run`: it sweeps killed runs' state in /run/sandgate
        "tests/unit/test_inspection_launch.py",  # the same
        "tests/unit/test_inspected_tls.py",  # worlds
        "tests/unit/test_tlsinspect.py",  # worlds
    }
)


def machine_wide(nodeid: str) -> bool:
    """Whether a test shares what is machine-wide (`ip netns list`, the users, each user's daemon and
    runs under /run/sandgate, the timing of canaries that must time out): such tests run one by one,
    beside no other of them, else two could judge each other's leftovers."""
    path = nodeid.split("::", 1)[0]
    return path.startswith("tests/e2e/") or path in _MACHINE_MODULES


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


@pytest.hookimpl(optionalhook=True)  # known only while xdist is loaded (`-p no:xdist` runs serially)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """All machine-wide tests are one work unit (one worker, in order); every other test is its own.

    xdist's `--dist loadgroup` would do this from a marker, but it renames `item._nodeid`, which
    pytest 9.2 no longer reads: the groups silently fell apart (seen: e2e tests on both workers)."""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class MachineInOne(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return MACHINE if machine_wide(nodeid) else nodeid

    return MachineInOne(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that builds worlds, users or a sandbox outside the machine-wide set is a mistake: say so."""
    for item in items:
        ours = item.nodeid.startswith("tests/")  # not an inner pytest run's own test file (test_rootless_support)
        if ours and set(getattr(item, "fixturenames", ())) & _MACHINE_FIXTURES and not machine_wide(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} uses a world, a sandbox or a throwaway user: add its module to "
                "_MACHINE_MODULES in tests/conftest.py, so it never runs beside another such test"
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
