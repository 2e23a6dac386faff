"""git's command-scope configuration in the environment (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_<n>,
GIT_CONFIG_VALUE_<n>; git >= 2.31), kept whole. Pure.

Why: the env filter drops every GIT_CONFIG_KEY_<n> (its name matches the secret family `*_KEY_*`)
and would keep GIT_CONFIG_COUNT, and git then dies on every command: "missing config key
GIT_CONFIG_KEY_0" (r3-new, reproduced). So after the filter only whole pairs below the count stay,
renumbered from 0, and the count goes when none is left. The Windows backend adds its own entries
(fsguard/windows/gitenv.py: `safe.directory`) the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

COUNT = "GIT_CONFIG_COUNT"
#: git reads exactly GIT_CONFIG_KEY_%d (config.c): `_01` or a non-ASCII digit is no entry of its (r3-new N5)
_ENTRY = re.compile(r"GIT_CONFIG_(KEY|VALUE)_(0|[1-9][0-9]*)", re.IGNORECASE)


def is_family(name: str) -> bool:
    """GIT_CONFIG_COUNT or one of its entries (any letter case: Windows' names are case-insensitive)."""
    return name.casefold() == COUNT.casefold() or _ENTRY.fullmatch(name) is not None


def entries(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (key, value) entries `env` holds whole, in order, below a valid count."""
    count = next((v for k, v in env.items() if k.casefold() == COUNT.casefold()), "").strip()
    found: dict[tuple[str, int], str] = {}
    for name, value in env.items():
        m = _ENTRY.fullmatch(name)
        if m:
            found[(m.group(1).upper(), int(m.group(2)))] = value
    n = int(count) if count.isascii() and count.isdigit() else 0  # "²".isdigit(), but int() refuses it
    return [(found[("KEY", i)], found[("VALUE", i)]) for i in range(n) if ("KEY", i) in found and ("VALUE", i) in found]


def with_entries(env: Mapping[str, str], pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """`env` with exactly `pairs` as its command-scope configuration (one spelling per name); none: no count."""
    out = {k: v for k, v in env.items() if not is_family(k)}
    if pairs:
        out[COUNT] = str(len(pairs))
    for i, (key, value) in enumerate(pairs):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return out
