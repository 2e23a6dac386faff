"""The e2e tests' fake internet: it lives in launcher/world.py (shared with `sandgate verify`).

Re-exported here so tests keep `from .world import World, ...`; the defaults (netns prefixes
sandgate-w / sandgate-c) are the tests' own.
"""

from __future__ import annotations

from launcher.world import (
    DNS_IP,
    DUMMY_IF,
    KNOWN_PREFIXES,
    LINK_NET,
    NETNS_ETC,
    SERVER_KINDS,
    TEST_NET,
    TEST_PREFIXES,
    UNIX_KINDS,
    VERIFY_PREFIXES,
    Client,
    Server,
    World,
    _NetnsRunner,
    cleanup_stale,
)

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
]
