"""PATH entries the sandbox cannot see, found at start from the mount plan and said before CMD runs.

Why: a tool in a venv under the host's /tmp, or in a directory sandgate hides, turns into a bare
"command not found" inside, which names neither sandgate nor the option that would help. The
mount plan already knows what is left out (the private /tmp) and what is hidden; this only
compares PATH against it. Pure apart from `resolve` (os.path.realpath by default: a symlinked
entry is judged by where it leads, as the kernel will).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Literal

from fsguard import mounts

Why = Literal["private-tmp", "hidden"]


class Unseen:
    """One PATH entry the sandbox cannot see: why, and the hidden directory or /tmp path that hides it.

    A plain class: a dataclass costs a few hundred microseconds at import, paid by every run's start."""

    __slots__ = ("entry", "under", "why")

    def __init__(self, entry: str, why: Why, under: str) -> None:
        self.entry, self.why, self.under = entry, why, under


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def unseen(
    path_value: str | None,
    plan: mounts.MountPlan,
    resolve: Callable[[str], str] = os.path.realpath,
    exists: Callable[[str], bool] = os.path.isdir,
) -> list[Unseen]:
    """The absolute PATH entries that exist on the host but that the plan leaves out or hides, each once."""
    out: list[Unseen] = []
    for entry in dict.fromkeys((path_value or "").split(":")):
        if not entry.startswith("/"):
            continue  # relative: follows the working directory, which is the workspace
        if not exists(entry):
            continue  # missing on the host too: not sandgate's doing
        found = _judge(entry, plan) or _judge(resolve(entry), plan)
        if found is not None:
            out.append(Unseen(entry, *found))
    return out


def _judge(path: str, plan: mounts.MountPlan) -> tuple[Why, str] | None:
    if mounts.left_out_by_private_tmp(path, plan.private_tmp, plan.tmp_rebinds):
        return "private-tmp", path
    hidden = next((d for d in plan.hide_dirs if _under(path, d)), None)
    return ("hidden", hidden) if hidden is not None else None


def view_root(entry: str) -> str:
    """What `--write` would best show for an entry: a venv's or prefix's root rather than its bin/."""
    parent, base = os.path.split(entry.rstrip("/"))
    return parent if base in ("bin", "sbin") and parent not in ("/tmp", "") else entry.rstrip("/")


def message(u: Unseen) -> str:
    """One warning line's text (without the `sandgate: warning: ` prefix)."""
    if u.why == "private-tmp":
        return (
            f"PATH entry {u.entry} is not visible inside: the sandbox has its own private /tmp; "
            f"--write {view_root(u.entry)} shows it (writable), or install the tool outside /tmp"
        )
    return (
        f"PATH entry {u.entry} is not visible inside: sandgate hides {u.under} (secrets, sockets or its own "
        "state; or your --read-deny/read_deny); install the tool elsewhere"
    )


def warnings(path_value: str | None, plan: mounts.MountPlan) -> Sequence[str]:
    """The warning texts for one run's PATH (empty for almost every run)."""
    return [message(u) for u in unseen(path_value, plan)]
