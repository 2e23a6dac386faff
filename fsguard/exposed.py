"""Named unix sockets shown inside at their own path although their directory is hidden
(`sandgate run --expose-socket`): an ssh-agent or a D-Bus socket under /run/user/<uid>.

Only the socket itself comes back, never its directory's other entries: the hidden directory stays
an empty read-only tmpfs but for a stub for each exposed socket (and the directories leading to
it), with the host's socket bound over the stub. The socket is reached through
a descriptor opened before anything was mounted, so a path the mounts changed cannot redirect it.
Which sockets may be exposed at all (never a sandgate daemon's) is the launcher's decision.
"""

from __future__ import annotations

import os
import stat

from fsguard import mountcalls
from fsguard.mountplan import MountPlan, left_out_by_private_tmp


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def needs_bind(path: str, p: MountPlan) -> bool:
    """Whether `path` would vanish inside (under a hidden directory or the private /tmp)."""
    hidden = any(_under(path, d) for d in p.hide_dirs)
    return hidden or left_out_by_private_tmp(path, p.private_tmp, p.tmp_rebinds)


def binds(named: str, real: str, p: MountPlan) -> tuple[tuple[str, str], ...]:
    """(path inside, host socket) for one exposed socket: at its real path, and at the name the user
    gave when that is a symlink whose own directory is hidden too; only where it would vanish."""
    return tuple((target, real) for target in dict.fromkeys((real, named)) if needs_bind(target, p))


def writable_hides(p: MountPlan) -> frozenset[str]:
    """Hidden directories that hold an exposed socket: writable for a moment, while its stub is made."""
    return frozenset(d for d in p.hide_dirs if any(_under(target, d) for target, _ in p.expose))


def open_sources(p: MountPlan) -> list[tuple[str, int]]:
    """Step 0, before any mount: (path inside, O_PATH descriptor of the host's socket) of each bind."""
    out: list[tuple[str, int]] = []
    try:
        for target, source in p.expose:
            fd = os.open(source, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            out.append((target, fd))
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):  # replaced since the launcher checked it
                raise mountcalls.MountError(22, f"cannot expose {source}: it is no longer a unix socket")
    except OSError as e:
        close(out)
        if isinstance(e, mountcalls.MountError):
            raise
        raise mountcalls.MountError(e.errno, f"cannot expose {e.filename}: {e.strerror}") from None
    return out


def bind_back(sources: list[tuple[str, int]], p: MountPlan) -> None:
    """The end of step 7: each hiding tmpfs that holds an exposed socket is made writable for a
    moment, a stub is made there (or in the private /tmp) for the socket, the host's socket is bound
    over the stub read-only, and the tmpfs is read-only again. Closes the descriptors."""
    try:
        writable = writable_hides(p)
        hiding = mountcalls.MS_NOSUID | mountcalls.MS_NODEV | mountcalls.MS_NOEXEC
        for d in writable:
            mountcalls.mount(None, d, None, mountcalls.MS_REMOUNT | hiding)
        for path, fd in sources:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            except FileExistsError:
                pass  # named twice: one stub, bound again on top
            # Read-only, nosuid, nodev: connect(2) still works (it never writes the inode).
            mountcalls.bind_readonly(f"/proc/self/fd/{fd}", path)
        for d in writable:
            mountcalls.mount(None, d, None, mountcalls.MS_REMOUNT | mountcalls.MS_RDONLY | hiding)
    finally:
        close(sources)


def close(sources: list[tuple[str, int]]) -> None:
    for _, fd in sources:
        os.close(fd)
