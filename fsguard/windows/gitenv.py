"""git's `safe.directory` for the workspace, through the environment (session 38, r2-user U1), pure.

Why: CMD runs as the sandbox user, and the workspace's repository is the real user's. Since git
2.35.2 (CVE-2022-24765) git refuses a repository owned by another user ("fatal: detected dubious
ownership in repository"); Git for Windows checks the NTFS owner. So without this every git
command in the sandbox fails (Linux does not see it: there the command maps to the owner's uid).
`safe.directory` "is only respected in protected configuration" (git-config), which is the system,
global and command scopes; the command scope includes GIT_CONFIG_COUNT / GIT_CONFIG_KEY_<n> /
GIT_CONFIG_VALUE_<n> (git >= 2.31), and the sandbox user's global config is its own, empty one.

Only the named folders, never `*`: a repository another account planted higher up (`C:\\.git`)
must not become trusted by the sandbox user's git (the caller passes an ancestor only when the
real user owns its `.git`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

COUNT = "GIT_CONFIG_COUNT"
_ENTRY = re.compile(r"GIT_CONFIG_(KEY|VALUE)_(\d+)", re.IGNORECASE)


def git_path(path: str) -> str:
    """A Windows path as git writes and compares it: forward slashes (`C:/Users/me/src/proj`), no
    trailing one except a drive's root (`D:/`: `D:` alone would mean that drive's current folder)."""
    out = path.replace("\\", "/")
    return out if len(out) <= 3 else out.rstrip("/")


def _given(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (key, value) entries `env` still holds whole, in order. The env filter may have dropped a
    GIT_CONFIG_KEY_<n> (its name looks like a secret's) and kept the count: git would then die on the
    missing key, so only whole pairs below a valid count are kept."""
    count = next((v for k, v in env.items() if k.casefold() == COUNT.casefold()), "").strip()
    found: dict[tuple[str, int], str] = {}
    for name, value in env.items():
        m = _ENTRY.fullmatch(name)
        if m:
            found[(m.group(1).upper(), int(m.group(2)))] = value
    n = int(count) if count.isdigit() else 0
    return [(found[("KEY", i)], found[("VALUE", i)]) for i in range(n) if ("KEY", i) in found and ("VALUE", i) in found]


def with_safe_directories(env: Mapping[str, str], dirs: tuple[str, ...]) -> dict[str, str]:
    """`env` with `safe.directory` for each of `dirs` after the entries it already had (renumbered
    from 0, one spelling per name: Windows compares names case-insensitively)."""
    entries = [*_given(env), *(("safe.directory", d) for d in dict.fromkeys(git_path(d) for d in dirs))]
    out = {k: v for k, v in env.items() if k.casefold() != COUNT.casefold() and not _ENTRY.fullmatch(k)}
    out[COUNT] = str(len(entries))
    for i, (key, value) in enumerate(entries):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return out
