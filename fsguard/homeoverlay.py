"""The sandbox's home directory: writable, warm across runs of one workspace, never the real one.

Package managers write caches and config under ~ (npm ~/.npm, uv ~/.cache/uv, poetry, pdm
~/.local, corepack); with ~ read-only they fail (npm even advises `sudo chown`). Making ~
writable would let a command plant ~/.bashrc or a poisoned cache that later UNSANDBOXED use
trusts. So ~ inside is an overlay, the real home read-only at the bottom:

    upper:  this run's own directory (fresh, empty)                   runs/<id>/upper, runs/<id>/work
    lower:  the workspace's layer: what its finished runs wrote       ws-<key>/layer
    lower:  the real home

(paths under `layerstore.store()`: root /var/lib/sandgate/homes-<uid>, others
/var/tmp/sandgate-<uid>/homes, then one directory per home path AND identity, so a new account
given a deleted account's uid starts from its own home; fsguard/layerstore.py has the layout).
Why this shape:

* An upper or work directory is never used by two live mounts: each run gets its own. Two
  overlays sharing one (as one layer per home did) is undefined behaviour in overlayfs, and was
  seen to fail (`npm ci` ENOENT in ~/.npm/_cacache/tmp, `Directory nonexistent` among 30 writers).
* Caches stay warm: when a run has ended, the next run of the workspace folds its upper into the
  workspace's layer (fsguard/layermerge.py: renames, under the workspace's lock) before it mounts.
  Overlapping runs each keep their own writes; ended runs are folded in the order they started
  (for one file, the run started last wins: for a cache, a miss at worst). Folding at the next
  start rather than at exit gives one path for runs that ended and runs that were killed (a
  SIGKILLed run's lock dies with it), and no exit waits for a fold. The layer is a lower layer
  only: no mount ever writes to it.
* Scoped like the workspace's trust: a command can already leave code for the next run of its
  workspace in the workspace itself, so the layer is per workspace (its real path AND identity,
  st_dev:st_ino and the inode's generation: a directory removed and made again is a new workspace,
  with an empty layer). What a run in workspace A writes under ~ (a ~/.gitconfig fsmonitor,
  ~/.bashrc, a ~/.local/bin/git shim, an .npmrc) is never seen by a run in workspace B, whose
  network or credentials may be wider.
* Nothing written inside is shared across workspaces, caches included. The tools verify what they
  download, not what they later read from their cache: npm's _cacache maps request URLs to content
  and stores packuments (metadata naming the tarballs and their hashes), pip keeps built wheels,
  cargo's registry/src and Go's pkg/mod hold unpacked sources no build re-checks, and pnpm's and
  yarn's stores are found through index files. A shared writable cache would carry code from
  workspace A into B. What IS shared is the real home itself (the bottom layer, read-only): caches
  the user filled outside any sandbox warm every workspace's first run.
* `--fresh-home`: no workspace layer (the real home only), and the run's writes are dropped.
* `sandgate cache clear` removes every layer, and refuses (or with --wait, waits) while any
  sandbox of the user lives; every user's store is hidden inside every sandbox (the threat: a run
  reading or seeding another workspace's or another user's layer through the store's path).

The real home never changes. Hidden paths (~/.ssh, tokens...) are mounted over the overlay
afterwards, so they stay hidden, and writable roots inside ~ (a workspace ~/proj) are bound back
so their writes stay real.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fsguard import layermerge, layerstore
from fsguard.layerstore import HomeOverlayError, RunEntry, store

__all__ = [
    "HomeOverlay",
    "HomeOverlayError",
    "LayersBusy",
    "RunEntry",
    "base_dir",
    "clear",
    "forget_under",
    "hidden_stores",
    "plan",
    "store",
]


class LayersBusy(HomeOverlayError):
    """`cache clear` while sandboxes use the layers."""

    def __init__(self, live: list[RunEntry]) -> None:
        self.live = live
        who = "; ".join(f"pid {r.pid} in {r.workspace}" for r in live)
        super().__init__(16, f"{len(live)} running sandbox(es) use the home layers ({who})")


@dataclass(frozen=True)
class HomeOverlay:
    """This run's overlay of the home: its own upper and work directories over the workspace's layer."""

    home: str  # the real home (the bottom layer), where the overlay is mounted
    upper: str  # this run's own upper directory
    work: str  # and work directory: no other mount ever uses either
    rebinds: tuple[str, ...]  # writable roots inside the home: bound back over the overlay
    layers: tuple[str, ...] = ()  # read-only layers between the upper and the home (the workspace's)
    hold: int = -1  # the run's lock, held while the launcher or the sandbox it forked lives
    notes: tuple[str, ...] = ()  # warnings for the user (an earlier run's writes that could not be kept)


def hidden_stores(uid: int) -> tuple[Path, ...]:
    """What no sandbox may see: sandgate's state of EVERY user, not only the command's: root's
    stores (one per uid) and each user's own `/var/tmp/sandgate-<uid>`. The threat: other users'
    layers (their caches, a token a sandboxed `npm login` wrote) and other workspaces'. File modes
    are not the boundary: root's stores are root's files, which a root-started command reads (it
    keeps DAC_OVERRIDE); a sudo caller's command owns its own store; another user's is kept out
    only by a mode its owner or a tool may have widened."""
    return tuple(dict.fromkeys((layerstore.ROOT_BASE, Path(f"/var/tmp/sandgate-{uid}"), *layerstore.user_stores())))


def base_dir(uid: int, home: str) -> Path:
    """One directory per user AND home path: two homes must never share (or see) each other's writes."""
    return layerstore.home_dir(uid, home)


def plan(
    home: str, write_roots: tuple[str, ...], *, uid: int, owner: int, workspace: str | None = None, fresh: bool = False
) -> HomeOverlay | None:
    """This run's overlay for `home`, or None where there is nothing to overlay (no real home, or one
    under /tmp, which the private /tmp already replaces). Folds the workspace's finished runs into
    its layer first. `workspace`: the run's working directory (default: the current one)."""
    real = os.path.realpath(home)
    if not os.path.isdir(real) or real == "/" or real.startswith("/tmp/") or real == "/tmp":
        return None
    try:
        return _plan(real, write_roots, uid, owner, workspace or os.getcwd(), fresh)
    except HomeOverlayError:
        raise
    except OSError as e:  # a full disk, an unreadable workspace: one line, never a traceback
        where = f" ({e.filename})" if e.filename else ""
        raise HomeOverlayError(
            e.errno or 1, f"cannot prepare the sandbox's home layer: {e.strerror or e}{where}"
        ) from None


def _plan(real: str, write_roots: tuple[str, ...], uid: int, owner: int, workspace: str, fresh: bool) -> HomeOverlay:
    base = base_dir(uid, real)
    if owner != 0:
        layerstore.private(base.parent.parent, owner)
    layerstore.private(base.parent, owner)
    _collect(base.parent, keep=base)
    layerstore.private(base, owner)
    # Whose layer this is: a layer whose home is gone, or is another directory now, is garbage.
    layerstore.record_home(base, real, layerstore.home_identity(real))
    ws, ws_real, ident = layerstore.workspace_dir(base, workspace)
    with layerstore.locked(ws, owner=owner):
        if layerstore.recorded_workspace(ws) is None:
            (ws / "workspace").write_text(f"{ws_real}\n{ident}\n")
        (ws / "layer").mkdir(mode=0o700, exist_ok=True)
        notes = _fold_finished(ws)
        run, hold = layerstore.new_run(ws, ws_real, fresh=fresh)
    _collect_workspaces(base, keep=ws)
    upper, work = run / "upper", run / "work"
    _like_home(upper, real)
    rebinds = tuple(r for r in write_roots if r != real and r.startswith(real.rstrip("/") + "/"))
    layers = () if fresh else (str(ws / "layer"),)
    return HomeOverlay(real, str(upper), str(work), rebinds, layers, hold, tuple(notes))


def _like_home(upper: Path, real: str) -> None:
    """The overlay's root takes the upper directory's owner and mode: the home's own, so a sudo
    caller's command (uid U) can use its home inside as it can outside."""
    st = os.stat(real)
    try:
        os.chown(upper, st.st_uid, st.st_gid)
    except PermissionError:
        # Unprivileged, with a home whose group (or owner) is not the caller's: the layer keeps
        # the caller's ids, which is what the command inside is anyway.
        pass
    os.chmod(upper, stat.S_IMODE(st.st_mode))


def _fold_finished(ws: Path) -> list[str]:
    """Under the workspace's lock: every ended run's writes into the layer (a --fresh-home run's are
    dropped), then its directory removed. Returns warnings for what could not be kept."""
    _, dead = layerstore.runs(ws)
    trash = ws / "trash"  # left behind only by a fold that was killed
    if not dead and not trash.exists():
        return []
    trash.mkdir(mode=0o700, exist_ok=True)
    problems: list[str] = []
    for run in dead:
        if not run.fresh and (run.path / "upper").is_dir():
            problems += layermerge.merge(run.path / "upper", ws / "layer", trash)
        try:
            layermerge.force_rmtree(run.path)
        except OSError as e:
            problems.append(f"{run.path}: {e.strerror or e}")
    try:
        layermerge.force_rmtree(trash)
    except OSError as e:
        problems.append(f"{trash}: {e.strerror or e}")
    if not problems:
        return []
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return [f"some of what an earlier run wrote under ~ could not be kept: {problems[0]}{more}"]


def _collect(store_dir: Path, keep: Path) -> None:
    """Remove the layers of homes that no longer exist, or are another directory now (a deleted
    user's, a test's or verify's; a new account's home at a deleted one's path)."""
    for layer in layerstore.homes(store_dir):
        if layer != keep and layerstore.home_gone(layer):
            _remove_idle(layer)


def _collect_workspaces(base: Path, keep: Path) -> None:
    """Remove the layers of workspaces that no longer exist (or were made again: a new identity)."""
    for ws in layerstore.workspaces(base):
        if ws != keep and layerstore.vanished(ws):
            with contextlib.suppress(OSError), layerstore.locked(ws, owner=None) as there:
                if there and not layerstore.runs(ws)[0]:
                    layermerge.force_rmtree(ws)


def _remove_idle(home_base: Path) -> None:
    """Remove a home's directory unless a run still uses one of its workspaces' layers."""
    if any(layerstore.runs(ws)[0] for ws in layerstore.workspaces(home_base)):
        return
    with contextlib.suppress(OSError):
        layermerge.force_rmtree(home_base)


def forget_under(uid: int, prefix: str) -> None:
    """Drop the layers of every home below `prefix` (verify's and the tests' throwaway homes, when done)."""
    prefix = os.path.realpath(prefix).rstrip("/") + "/"
    for layer in layerstore.homes(store(uid)):
        rec = layerstore.recorded_home(layer)
        if rec is not None and (rec[0] + "/").startswith(prefix):
            layermerge.force_rmtree(layer)


def clear(uid: int, owner: int, *, wait: bool = False, waiting: Callable[[list[RunEntry]], None] | None = None) -> int:
    """`sandgate cache clear`: forget everything sandboxed runs wrote under ~ (every home, every
    workspace). Returns how many workspace layers were removed. Raises LayersBusy while sandboxes
    live (or, `wait`, waits for them: `waiting` is told who once)."""
    base = store(uid)
    if not os.path.lexists(base):
        return 0
    st = os.lstat(base)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != owner:
        raise HomeOverlayError(1, f"refusing to remove {base}: not a directory of uid {owner}")
    told = False
    while True:
        live, removed = _clear_idle(base)
        if not live:
            return removed
        if not wait:
            raise LayersBusy(live)
        if waiting is not None and not told:
            waiting(live)
            told = True
        for run in live:
            layerstore.wait_for(run)


def _clear_idle(base: Path) -> tuple[list[RunEntry], int]:
    """With every workspace locked at once: if no run lives, remove every layer (and the legacy
    one-per-home layer of sandgate before issue 23). Returns the live runs, or the count removed."""
    homes = layerstore.homes(base)
    spaces = [ws for h in homes for ws in layerstore.workspaces(h)]
    with contextlib.ExitStack() as held:
        present = [ws for ws in spaces if held.enter_context(layerstore.locked(ws, owner=None))]
        live = [r for ws in present for r in layerstore.runs(ws)[0]]
        if live:
            return live, 0
        for ws in present:
            layermerge.force_rmtree(ws)  # waiters find their lock file gone and make the workspace again
        legacy = [d for h in homes for d in (h / "upper", h / "work") if d.is_dir() and not d.is_symlink()]
        for d in legacy:
            layermerge.force_rmtree(d)
    return [], len(present) + len({d.parent for d in legacy})
