"""Placeholders shared by concurrent runs in one workspace (issue 23): made once, used by every run
that needs them, removed when the last run that uses them is gone.

Why placeholders at all, and why there is no way without one: fsguard/placeholders.py.

References, two kinds:
- this user's runs: each run's state file (launcher/run/runstate.py) lists the placeholders it
  uses, made or found; a live run's (pid + start time) are never removed; a killed run's state
  is swept, so its references go with it. No descriptor per placeholder: a workspace with many
  repositories has a thousand of them.
- another user's runs (root's and yours in one workspace keep separate runtime directories):
  what looks like a placeholder and is not in our registry is held with a shared flock for the
  whole run (capped: MAX_FOREIGN); their sweep removes nothing a flock holds.

The registry (<runtime dir>/placeholders.json) lists what this user's runs made, with identity
(device, inode); every step here runs under the runtime directory's lock (runstate.lock).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from fsguard import gitguard, mounts, placeholders

#: Foreign placeholders held per run: each is a descriptor; past this they are bound, not held.
MAX_FOREIGN = 128

Registry = dict[str, placeholders.Ident | None]


def _path(root: Path) -> Path:
    return root / "placeholders.json"


def load(root: Path) -> Registry:
    try:
        raw = json.loads(_path(root).read_text())
        return {str(p): (int(i[0]), int(i[1])) if i else None for p, i in raw["placeholders"].items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return {}  # unreadable: the next runs start a new one (a placeholder it named may stay behind)


def save(root: Path, reg: Registry) -> None:
    path = _path(root)
    if not reg:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"placeholders": {p: list(i) if i else None for p, i in reg.items()}}))
    tmp.replace(path)


def sweep(root: Path, in_use: set[str], orphans: Sequence[str] = ()) -> list[str]:
    """Remove the registered placeholders (and `orphans`, a killed run's, known by name only) that no
    live run uses (`in_use`) and no other user's run holds, deepest first; returns what went."""
    reg = load(root)
    for ph in orphans:
        reg.setdefault(ph, None)
    removed = []
    for path in sorted(reg, key=lambda p: -p.count("/")):
        if path in in_use:
            continue
        outcome = placeholders.try_remove(path, reg[path], gitguard.PLACEHOLDER_TEXTS)
        if outcome != "held":
            del reg[path]
        if outcome == "removed":
            removed.append(path)
    save(root, reg)
    return removed


def take(root: Path, plan: mounts.MountPlan) -> tuple[mounts.MountPlan, placeholders.Refs, list[str]]:
    """The plan with the placeholders earlier live runs made used (nothing made inside them), the
    missing ones made and registered, foreign ones held; and the placeholders this run uses, for its
    state file. placeholders.Stale: the workspace changed since `plan` was made; plan again."""
    reg = load(root)
    known = {p for p in reg if os.path.lexists(p)}
    plan = placeholders.adopt(plan, known)
    refs = placeholders.Refs()
    used = [p for p in plan.protect if p in known]
    filled = dict(plan.filled)
    try:
        for path in plan.protect:
            if path not in known and len(refs.fds) < MAX_FOREIGN and placeholders.looks_like_one(path):
                refs.hold(path)  # another user's run's, perhaps: their sweep must not take it from us
        for path, is_dir in plan.placeholders:
            try:
                reg[path] = placeholders.make(path, is_dir, filled.get(path, ""))
            except FileExistsError:
                raise placeholders.Stale(path) from None
            except OSError as e:
                raise mounts.MountError(
                    e.errno, f"cannot cover the missing protected path {path}: {e.strerror}"
                ) from None
            used.append(path)
    except BaseException:
        refs.close()
        raise
    finally:
        save(root, reg)  # what was made is known, even if this run goes no further
    return plan, refs, used
