"""The mount plan: the typed record of every mount one run makes, planned by the launcher.

fsguard/mounts.py makes it (`plan`) and mounts it (`build`); fsguard/placeholders.py creates and
shares the placeholders it names, fsguard/exposed.py binds back the sockets it exposes. It lives
below all three so each reads the same record without importing another's mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsguard.homeoverlay import HomeOverlay


@dataclass(frozen=True)
class MountPlan:
    """Every mount init makes for one run, planned by the launcher before the fork."""

    private_tmp: bool
    tmp_rebinds: tuple[str, ...]  # writable roots under the host's /tmp, re-exposed in the private one
    pins: tuple[str, ...]
    protect: tuple[str, ...]  # existing paths, bound read-only
    placeholders: tuple[tuple[str, bool], ...]  # (path, is_dir): missing protected paths, created by the launcher
    hide_dirs: tuple[str, ...]
    hide_files: tuple[str, ...]
    write_roots: tuple[str, ...]  # real paths, for Landlock
    notes: tuple[str, ...] = field(default=())
    reopen: tuple[str, ...] = ()  # git directories inside a read-only modules/ or worktrees/, bound back writable
    filled: tuple[tuple[str, str], ...] = ()  # (placeholder, text) for placeholders that must not be empty
    home: HomeOverlay | None = None  # ~ inside: the real home under a sandgate-owned writable layer
    expose: tuple[tuple[str, str], ...] = ()  # (path inside, host socket) bound over its hiding (fsguard/exposed.py)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def left_out_by_private_tmp(path: str, private_tmp: bool, rebinds: tuple[str, ...]) -> bool:
    """Under the host's /tmp and not re-exposed: the sandbox's own /tmp already leaves it out."""
    return private_tmp and _under(path, "/tmp") and not any(_under(path, r) for r in rebinds)
