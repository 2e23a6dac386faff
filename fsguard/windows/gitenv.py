"""git's `safe.directory` for the workspace, through the environment (session 38, r2-user U1), pure.

Why: CMD runs as the sandbox user, and the workspace's repository is the real user's. Since git
2.35.2 (CVE-2022-24765) git refuses a repository owned by another user ("fatal: detected dubious
ownership in repository"); Git for Windows checks the NTFS owner. So without this every git
command in the sandbox fails (Linux does not see it: there the command maps to the owner's uid).
`safe.directory` "is only respected in protected configuration" (git-config), which is the system,
global and command scopes; the command scope includes GIT_CONFIG_COUNT / GIT_CONFIG_KEY_<n> /
GIT_CONFIG_VALUE_<n> (git >= 2.31), and the sandbox user's global config is its own, empty one. The
command scope counts only since git 2.38 (2.35.2-2.37: "only respected when specified in a system or
global config"): there the sandbox's git still says "dubious ownership" (r3-new N4).

Only the named folders, never `*`: a repository another account planted higher up (`C:\\.git`)
must not become trusted by the sandbox user's git (the caller passes an ancestor only when the
real user owns its `.git`).
"""

from __future__ import annotations

from collections.abc import Mapping

from fsguard import gitcmdenv


def git_path(path: str) -> str:
    """A Windows path as git writes and compares it: forward slashes (`C:/Users/me/src/proj`), no
    trailing one except a drive's root (`D:/`: `D:` alone would mean that drive's current folder)."""
    out = path.replace("\\", "/")
    return out if len(out) <= 3 else out.rstrip("/")


def with_safe_directories(env: Mapping[str, str], dirs: tuple[str, ...]) -> dict[str, str]:
    """`env` with `safe.directory` for each of `dirs` after the entries it already had (renumbered
    from 0, one spelling per name: Windows compares names case-insensitively)."""
    entries = [*gitcmdenv.entries(env), *(("safe.directory", d) for d in dict.fromkeys(git_path(d) for d in dirs))]
    return gitcmdenv.with_entries(env, entries)
