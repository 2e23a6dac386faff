"""Shared fixtures: the isolated fake internet (launcher/selftest/world.py, via tests/support/world.py) for end-to-end tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from .support.runner import Sandgate
from .support.world import World, cleanup_stale, new_world

# ---- two processes (pytest-xdist, `-n 2` in pyproject): the machine's tests in one of them, one by one

MACHINE = "sandgate-machine"
_MACHINE_FIXTURES = frozenset({"world", "sandgate", "unprivileged"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that builds worlds, users or a sandbox runs in one xdist worker, in order: the e2e
    tests, those using the fixtures below, and the unit modules marked `machine` (named namespaces,
    probes, a root `sandgate run`).

    They share what is machine-wide (`ip netns list`, the users, each user's daemon under
    /run/sandgate, the timing of canaries that must time out), so two at once could judge each
    other's leftovers; the pure and in-process unit tests fill the second core meanwhile (issue 15's
    suite-time rule: well under 10 minutes on 2 cores).
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "e2e" in item.path.parts or fixtures & _MACHINE_FIXTURES or item.get_closest_marker("machine"):
            item.add_marker(pytest.mark.xdist_group(MACHINE))


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
