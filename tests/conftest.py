"""Shared fixtures: the isolated fake internet (launcher/world.py, via tests/world.py) for end-to-end tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from .world import World, cleanup_stale


@pytest.fixture(scope="session", autouse=True)
def _sandgate_cleanup_stale() -> None:
    """Remove namespaces left by an earlier pytest run that was killed before its teardown ran.

    Without root/ip there is nothing we could have created; the `world` fixture reports that as a failure.
    """
    if os.geteuid() == 0 and shutil.which("ip"):
        cleanup_stale()


@pytest.fixture
def world() -> Iterator[World]:
    """A fresh fake internet. Fails (never skips) without root/ip/nft: a skipped boundary test is a defect."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(
            "the sandgate e2e world needs root and the ip (iproute2) and nft (nftables) tools; "
            f"euid={os.geteuid()} missing={missing or 'none'}. Run the tests as root after .ci/setup.",
            pytrace=False,
        )
    with World() as w:
        yield w
