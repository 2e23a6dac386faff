"""What a run leaves on disk while it lives, and how the next run or `sandgate cleanup` removes a dead one's.

v2 keeps nothing in the host's network namespace (no link, table or route), so a run's only
host-side state is here, under the user's runtime directory (netguard.daemon.control.runtime_dir()):
  runs/<id>.json     who owns the run (pid + start time) and which placeholders it uses: while
                     it lives, no run of this user removes them
  runs/<id>/         files bound into the sandbox (resolv.conf, the empty file, the /tmp stage)
                     and the approval socket
  placeholders.json  every placeholder this user's runs made that may still exist, with its
                     identity (device, inode): the ones `sweep` removes once no run holds them
  lock               serialises planning, placeholder creation, the sweep and stale cleanup
                     between concurrent runs
The whole runtime directory is hidden from the sandbox (mode 0700 and a read-only tmpfs over it).

Placeholders are shared (launcher/run/placeholdershare.py): a run uses the ones an earlier live
run made, and any run's sweep (at its start, at its end, `sandgate cleanup`) removes those no live
run uses.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import RunError
from launcher.run import placeholdershare
from netguard.daemon import control


def runtime_dir() -> Path:
    """The user's runtime directory: the daemon's socket, every run's state, the policy cache."""
    try:
        return control.runtime_dir()
    except control.ControlError as e:
        raise RunError(str(e)) from None


@dataclass(frozen=True)
class RunPaths:
    """One run's directory and state file under the runtime directory."""

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
    """Remove what killed runs left: state files, run directories, and placeholders no run holds.

    Live runs are not touched. Call it under `lock(root)`."""
    removed: list[str] = []
    runs = root / "runs"
    if not runs.is_dir():
        return removed
    live: set[str] = set()
    orphans: list[str] = []
    for path in sorted(runs.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            pid, rid = int(data["pid"]), str(data["id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if starttime(pid) == data.get("start"):
            live.add(rid)
            continue
        orphans += [str(x) for x in data.get("placeholders", [])]  # planned: maybe made, maybe not registered
        path.unlink(missing_ok=True)
        remove_dir(runs / rid)
        removed.append(f"run {rid}")
    for d in runs.iterdir():
        # A run killed between creating its directory and its state file.
        if d.is_dir() and d.name not in live and not (runs / f"{d.name}.json").exists() and _older_than(d, 60):
            remove_dir(d)
    removed += [f"placeholder {ph}" for ph in sweep(root, orphans)]
    return removed


def references(root: Path) -> set[str]:
    """The placeholders live runs of this user use (their state files): never removed under them."""
    used: set[str] = set()
    for path in (root / "runs").glob("*.json"):
        try:
            data = json.loads(path.read_text())
            if starttime(int(data["pid"])) == data.get("start"):
                used.update(str(x) for x in data.get("placeholders", []))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return used


def sweep(root: Path, orphans: Sequence[str] = ()) -> list[str]:
    """Remove this user's placeholders no live run uses (launcher/run/placeholdershare.py). Under `lock(root)`."""
    return placeholdershare.sweep(root, references(root), orphans)


def release(p: RunPaths) -> None:
    """A run's end: its references go with its state file, then what no other run uses is removed."""
    with lock(p.root):
        p.state.unlink(missing_ok=True)
        sweep(p.root)


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False
