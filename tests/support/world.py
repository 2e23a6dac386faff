"""The e2e tests' fake internet: it lives in selftest/ (shared with `sandgate verify`).

Re-exported here so tests keep `from .world import World, ...`; the defaults (netns prefixes
sandgate-w / sandgate-c) are the tests' own.
"""

from __future__ import annotations

from launcher.run.staleworlds import KNOWN_PREFIXES, NETNS_ETC, TEST_PREFIXES, VERIFY_PREFIXES, cleanup_stale
from selftest.clients import LINK_NET, Client
from selftest.nsexec import NetnsRunner as _NetnsRunner
from selftest.servers import SERVER_KINDS, UNIX_KINDS, Server
from selftest.world import DNS_IP, DUMMY_IF, TEST_NET, World


def new_world() -> World:
    """The tests' one way to a fresh fake internet (the `world` fixture and every module's own setup).

    Fails (never skips) without root/ip/nft: a skipped boundary test is a defect.
    """
    import os
    import shutil

    import pytest

    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(
            "the sandgate e2e world needs root and the ip (iproute2) and nft (nftables) tools; "
            f"euid={os.geteuid()} missing={missing or 'none'}. Run the tests as root after .ci/setup.",
            pytrace=False,
        )
    return World()


__all__ = [
    "DNS_IP",
    "DUMMY_IF",
    "KNOWN_PREFIXES",
    "LINK_NET",
    "NETNS_ETC",
    "SERVER_KINDS",
    "TEST_NET",
    "TEST_PREFIXES",
    "UNIX_KINDS",
    "VERIFY_PREFIXES",
    "Client",
    "Server",
    "World",
    "_NetnsRunner",
    "cleanup_stale",
    "new_world",
]
