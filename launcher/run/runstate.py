"""What a run leaves on disk while it lives, and how the next run or `sandgate cleanup` removes a dead one's.

v2 keeps nothing in the host's network namespace (no link, table or route), so a run's only
host-side state is here, under the user's runtime directory (netguard.proxy.control.runtime_dir()):
  runs/<id>.json   who owns the run (pid + start time) and which placeholders it created
  runs/<id>/       files bound into the sandbox (resolv.conf, the empty file, the /tmp stage)
                   and the approval socket
  lock             serialises stale cleanup with placeholder creation between concurrent runs
The whole runtime directory is hidden from the sandbox (mode 0700 and a read-only tmpfs over it).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fsguard import mounts
from launcher.errors import RunError
from netguard.proxy import control


def runtime_dir() -> Path:
    """The user's runtime directory: the daemon's socket, every run's state, the policy cache."""
    try:
        return control.runtime_dir()
    except control.ControlError as e:
        raise RunError(str(e)) from None


@dataclass(frozen=True)
class RunPaths:
    root: Path  # the runtime directory
    id: str

    @property
    def state(self) -> Path:
        return self.root / "runs" / f"{self.id}.json"

    @property
    def dir(self) -> Path:
        return self.root / "runs" / self.id


class lock:
    """An exclusive flock on <runtime dir>/lock for the duration of a with-block."""

    def __init__(self, root: Path) -> None:
        self.path = root / "lock"

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def starttime(pid: int) -> str | None:
    """Process start time (clock ticks since boot): a pid plus this identifies one process, even after reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def make_dirs(p: RunPaths) -> None:
    p.dir.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_state(p: RunPaths, placeholders: list[str]) -> None:
    data = {"id": p.id, "pid": os.getpid(), "start": starttime(os.getpid()), "placeholders": placeholders}
    tmp = p.state.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(p.state)


def remove(p: RunPaths) -> None:
    p.state.unlink(missing_ok=True)
    remove_dir(p.dir)


def remove_dir(d: Path) -> None:
    if not d.is_dir():
        return
    for f in d.iterdir():
        if f.is_dir() and not f.is_symlink():
            try:
                f.rmdir()  # the /tmp staging mount point, empty outside the sandbox's namespace
            except OSError:
                pass
        else:
            f.unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:
        pass


def cleanup_stale(root: Path) -> list[str]:
    """Remove what killed runs left: placeholders, state files, run directories. Live runs are not touched."""
    removed: list[str] = []
    runs = root / "runs"
    if not runs.is_dir():
        return removed
    live: set[str] = set()
    for path in sorted(runs.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            pid, rid = int(data["pid"]), str(data["id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if starttime(pid) == data.get("start"):
            live.add(rid)
            continue
        placeholders = [str(x) for x in data.get("placeholders", [])]
        mounts.remove_placeholders(placeholders)
        removed.extend(f"placeholder {ph}" for ph in placeholders if not os.path.lexists(ph))
        path.unlink(missing_ok=True)
        remove_dir(runs / rid)
        removed.append(f"run {rid}")
    for d in runs.iterdir():
        # A run killed between creating its directory and its state file.
        if d.is_dir() and d.name not in live and not (runs / f"{d.name}.json").exists() and _older_than(d, 60):
            remove_dir(d)
    return removed


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False
