"""The sandbox's home directory: writable, persistent across runs, and never the real one.

Package managers write caches and config under ~ (npm ~/.npm, uv ~/.cache/uv, poetry, pdm
~/.local, corepack); with ~ read-only they fail (npm even advises `sudo chown`). Making ~
writable would let a command plant ~/.bashrc or a poisoned cache that later UNSANDBOXED use
trusts. So ~ inside is an overlay: the real home read underneath, every write going to a
sandgate-owned upper directory outside it (overlayfs refuses an upper inside its lower):
  root:  /var/lib/sandgate/homes-<uid>/<home>   others: /var/tmp/sandgate-<uid>/homes/<home>
(one layer per home path, named by a hash of it).
Downloads cached by one sandboxed run are there for the next (a second `npm ci` is warm); the
real home never changes. The trade-off, stated plainly: what one sandboxed run writes under ~
(a cache entry, a ~/.bashrc) is seen by later SANDBOXED runs; `sandgate cache clear` empties it.
Hidden paths (~/.ssh, tokens...) are mounted over the overlay afterwards, so they stay hidden,
and writable roots inside ~ (a workspace ~/proj) are bound back so their writes stay real.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

ROOT_BASE = Path("/var/lib/sandgate")


class HomeOverlayError(OSError):
    """The upper directory cannot be used (squatted, not ours); one line for the user."""


@dataclass(frozen=True)
class HomeOverlay:
    home: str  # the real home (lower), where the overlay is mounted
    upper: str
    work: str
    rebinds: tuple[str, ...]  # writable roots inside the home: bound back over the overlay


def store(uid: int) -> Path:
    """Where a user's sandbox homes live (root keeps one store per uid the command runs as)."""
    return ROOT_BASE / f"homes-{uid}" if os.geteuid() == 0 else Path(f"/var/tmp/sandgate-{uid}") / "homes"


def base_dir(uid: int, home: str) -> Path:
    """One layer per user AND home path: two homes must never share (or see) each other's writes."""
    from _sha2 import sha256  # CPython's own; hashlib would load OpenSSL on every run

    digest: str = sha256(home.encode()).hexdigest()  # _sha2 ships no type information
    return store(uid) / digest[:12]


def _private(path: Path, uid: int) -> None:
    """Create `path` 0700 (parents too); an existing one must be a real directory owned by `uid`, 0700."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise HomeOverlayError(e.errno or 1, f"cannot create the sandbox's home store {path}: {e.strerror}") from None
    # The threat: /var/tmp is shared; another user creating our name first could read or seed our home.
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        # Someone else's entry in a shared directory cannot be removed by us: say who can.
        fix = (
            "remove it and run again"
            if st.st_uid == uid
            else f"it belongs to uid {st.st_uid}: ask an administrator to remove it"
        )
        raise HomeOverlayError(
            1,
            f"refusing {path} as the sandbox's home store: it must be a directory owned by "
            f"uid {uid} with mode 0700; {fix}",
        )


def plan(home: str, write_roots: tuple[str, ...], *, uid: int, owner: int) -> HomeOverlay | None:
    """The overlay for `home`, or None where there is nothing to overlay (no real home, or one under /tmp,
    which the private /tmp already replaces)."""
    real = os.path.realpath(home)
    if not os.path.isdir(real) or real == "/" or real.startswith("/tmp/") or real == "/tmp":
        return None
    base = base_dir(uid, real)
    if owner != 0:
        _private(base.parent.parent, owner)
    _private(base.parent, owner)
    _collect(base.parent, keep=base)
    _private(base, owner)
    (base / "home").write_text(real + "\n")  # whose layer this is: a layer whose home is gone is garbage
    upper, work = base / "upper", base / "work"
    st = os.stat(real)
    for d in (upper, work):
        d.mkdir(mode=0o700, exist_ok=True)  # inside the private base: nobody else can have made them
    # The overlay's root takes the upper directory's owner and mode: the home's own, so a sudo
    # caller's command (uid U) can use its home inside as it can outside.
    try:
        os.chown(upper, st.st_uid, st.st_gid)
    except PermissionError:
        # Unprivileged, with a home whose group (or owner) is not the caller's: the layer keeps
        # the caller's ids, which is what the command inside is anyway.
        pass
    os.chmod(upper, stat.S_IMODE(st.st_mode))
    rebinds = tuple(r for r in write_roots if r != real and r.startswith(real.rstrip("/") + "/"))
    return HomeOverlay(real, str(upper), str(work), rebinds)


def _collect(store_dir: Path, keep: Path) -> None:
    """Remove the layers of homes that no longer exist (a deleted user's, a test's or verify's)."""
    try:
        entries = list(store_dir.iterdir())
    except OSError:
        return
    for layer in entries:
        if layer == keep or layer.is_symlink() or not layer.is_dir():
            continue
        try:
            home = (layer / "home").read_text().strip()
        except OSError:
            continue  # not one of ours, or being created: leave it
        if home and not os.path.lexists(home):
            try:
                _force_rmtree(layer)
            except OSError:
                pass


def forget_under(uid: int, prefix: str) -> None:
    """Drop the layers of every home below `prefix` (verify's and the tests' throwaway homes, when done)."""
    prefix = os.path.realpath(prefix).rstrip("/") + "/"
    try:
        layers = list(store(uid).iterdir())
    except OSError:
        return
    for layer in layers:
        try:
            home = (layer / "home").read_text().strip()
        except OSError:
            continue
        if (home + "/").startswith(prefix) and layer.is_dir() and not layer.is_symlink():
            _force_rmtree(layer)


def clear(uid: int, owner: int) -> Path | None:
    """`sandgate cache clear`: forget everything sandboxed runs wrote under ~ (every home). Returns what was removed."""
    base = store(uid)
    if not os.path.lexists(base):
        return None
    st = os.lstat(base)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != owner:
        raise HomeOverlayError(1, f"refusing to remove {base}: not a directory of uid {owner}")
    _force_rmtree(base)
    return base


def _force_rmtree(path: Path) -> None:
    """rmtree that also removes what overlayfs leaves unreadable (its work/work is mode 000)."""

    def onexc(func: object, p: str, exc: BaseException) -> None:
        if not isinstance(exc, PermissionError) or not os.path.isdir(p) or os.path.islink(p):
            raise exc
        os.chmod(p, 0o700)
        shutil.rmtree(p, onexc=onexc)

    shutil.rmtree(path, onexc=onexc)
