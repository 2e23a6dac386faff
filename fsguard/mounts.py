"""The sandbox's private mount namespace, built in an explicit order (like bubblewrap's arguments).

`plan()` runs in the launcher and only looks at the filesystem; the sandbox's first process
then mounts, in this order (`make_private()`, `fsguard.kernelfs.fresh_proc_sys()`, `build()`):

1. / becomes a slave mount tree: nothing we mount propagates back to the host;
2. a fresh /proc, /sys and a minimal /dev for the new namespaces (fsguard/kernelfs.py);
3. a private, empty /tmp (when /tmp is a writable root), with writable roots that live
   under the host's /tmp bound back in;
4. pins: each directory between a writable root and a protected path is bound onto itself,
   so it becomes a mount point and cannot be renamed away to plant a fresh copy;
5. protected paths bound read-only over themselves; missing ones are covered by a
   placeholder the launcher created, so they cannot be created either (fsguard/placeholders.py:
   why there is no way without one, and how concurrent runs share them). Git directories
   inside a read-only modules/ or worktrees/ are bound back writable first (fsguard/gitguard.py
   decides what in a repository is protected); steps 4-5 go shallowest path first;
6. single files bound over host files (resolv.conf pointing at our DNS listener);
7. hidden paths: files (and unix sockets) under an empty read-only file, then directories
   (secrets, sandgate's own state and approval sockets) under an empty read-only tmpfs;
   sockets named by --expose-socket are bound back over their hiding (fsguard/exposed.py);
8. the working directory re-entered, so it resolves through the new mounts and not the
   directory it named before step 4.
Landlock (applied later, in the command's process) then forbids any mount change, so even
root inside the sandbox cannot undo this.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from pathlib import Path

from fsguard import exposed, gitguard
from fsguard.homeoverlay import HomeOverlay
from fsguard.mountcalls import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_SLAVE,
    bind_readonly,
    detach,
    mount,
    nosuid_bind,
)
from fsguard.mountcalls import MountError as MountError  # kept names: the launcher's, with plan()
from fsguard.mountplan import MountPlan as MountPlan
from fsguard.mountplan import left_out_by_private_tmp as left_out_by_private_tmp
from fsguard.policy import Effective

#: Unix sockets that answer for the host, not the sandbox: a network namespace does not stop
#: them. Resolver sockets would resolve (and leak) any name over the host's network; the
#: container engines' sockets are root on the host.
HOST_SOCKETS: tuple[str, ...] = (
    "/run/systemd/resolve/io.systemd.Resolve",
    "/run/systemd/resolve/io.systemd.Resolve.Monitor",
    "/run/nscd/socket",
    "/var/run/nscd/socket",
    "/run/dbus/system_bus_socket",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan(eff: Effective) -> MountPlan:
    """What to mount for this run. Reads the filesystem (lstat/realpath/scandir), changes nothing.

    Raises MountError for what cannot be protected reliably: a missing writable root, or a
    protected path reached through a symlink the sandbox could swap.
    """
    pairs: list[tuple[str, str]] = []  # (writable path as the policy names it, its real path)
    for w in eff.write:
        if w == "/tmp" and eff.private_tmp:
            pairs.append((w, "/tmp"))
            continue
        if not os.path.exists(w):
            raise MountError(2, f"writable path {w} does not exist; create it or remove it from the policy")
        pairs.append((w, os.path.realpath(w)))
    roots = list(dict.fromkeys(r for _, r in pairs))
    tmp_rebinds = tuple(r for r in roots if eff.private_tmp and r != "/tmp" and _under(r, "/tmp"))

    # `.git/<name>` protections apply to every repository found below the roots (issue 10).
    names, rest = gitguard.split(eff.protect, [w for w, _ in pairs], [r for _, r in pairs])
    try:
        git = gitguard.plan(names)
    except gitguard.GitGuardError as e:
        raise MountError(e.errno, e.strerror) from None
    pins: list[str] = []
    protect: list[str] = []
    placeholders: list[tuple[str, bool]] = []
    notes: list[str] = list(git.notes)
    for path, is_dir in (*rest, *git.protect):
        if path in eff.existing_only and not os.path.lexists(path):
            continue  # a default protection in an extra writable root: only where it exists
        if left_out_by_private_tmp(path, eff.private_tmp, tmp_rebinds):
            continue  # under the host's /tmp, which the private /tmp leaves out anyway
        _walk_protected(path, is_dir, roots, pins, protect, placeholders)
    hide_dirs: list[str] = []
    hide_files: list[str] = []
    for p in (*eff.read_deny, *HOST_SOCKETS):
        if not os.path.lexists(p):
            continue
        real = os.path.realpath(p)  # a mount follows symlinks: hide what the name really reaches
        if not os.path.exists(real):
            continue
        if left_out_by_private_tmp(real, eff.private_tmp, tmp_rebinds):
            continue  # the private /tmp already leaves it out (and there is nothing to mount over)
        (hide_dirs if os.path.isdir(real) else hide_files).append(real)
        if real != p:
            notes.append(f"{p} is a symlink; hiding its target {real}")
    return MountPlan(
        private_tmp=eff.private_tmp,
        tmp_rebinds=tmp_rebinds,
        pins=tuple(sorted(dict.fromkeys(pins), key=lambda p: p.count("/"))),
        protect=tuple(dict.fromkeys(protect)),
        placeholders=tuple(dict.fromkeys(placeholders)),
        # A directory under another hidden one vanishes with it (and could not be mounted over after).
        hide_dirs=tuple(d for d in dict.fromkeys(hide_dirs) if not any(d != o and _under(d, o) for o in hide_dirs)),
        hide_files=tuple(f for f in dict.fromkeys(hide_files) if not any(_under(f, o) for o in hide_dirs)),
        write_roots=tuple(roots),
        notes=tuple(notes),
        reopen=tuple(git.reopen),
        filled=tuple((p, text) for p, text in git.filled.items() if (p, False) in placeholders),
    )


def _walk_protected(
    path: str, is_dir: bool, roots: list[str], pins: list[str], protect: list[str], placeholders: list[tuple[str, bool]]
) -> None:
    """Walk from the root down to one protected path; every existing component must be a real
    directory (no symlink the sandbox could replace), the first missing one gets a placeholder."""
    root = next((r for r in roots if r != "/tmp" and _under(path, r)), None)
    if root is None:
        root = os.path.dirname(path)  # outside every writable root: Landlock already refuses writes
    rel = [c for c in path[len(root) :].split("/") if c]
    cur = root
    chain = [root]
    for i, comp in enumerate(rel):
        cur = posixpath.join(cur, comp)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            placeholders.append((cur, is_dir or i < len(rel) - 1))
            break
        except NotADirectoryError:
            break  # a parent is a file: the path cannot exist; that file is pinned read-only below
        if stat.S_ISLNK(st.st_mode):
            raise MountError(
                40,
                f"protected path {path} passes through the symlink {cur} -> {os.readlink(cur)}; "
                "sandgate cannot protect it reliably: remove the symlink or protect its target",
            )
        if i == len(rel) - 1 or not stat.S_ISDIR(st.st_mode):
            protect.append(cur)  # the path itself, or a file standing where a directory would be
            break
        chain.append(cur)
    pins.extend(chain if _under(path, root) and root in roots else [])


# ---- sandbox side ----------------------------------------------------------------------------------


def make_private() -> None:
    """Step 1: nothing mounted from here on propagates back to the host's mount namespace."""
    mount(None, "/", None, MS_REC | MS_SLAVE)


def build(p: MountPlan, run_dir: Path, files: dict[str, Path]) -> None:
    """Steps 3-8 of the module docstring; `files` maps host paths to replacement files (resolv.conf).

    The run directory is reached through a descriptor opened first: it may itself lie under
    /tmp (an unprivileged user's runtime directory), which step 3 covers.
    """
    fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _build(
            p,
            Path(f"/proc/self/fd/{fd}"),
            {k: Path(f"/proc/self/fd/{fd}") / v.relative_to(run_dir) for k, v in files.items()},
        )
    finally:
        os.close(fd)


def _protect_mounts(p: MountPlan) -> None:
    """Steps 4-5, shallowest path first, so each mount lands on top of its ancestors' and a
    recursive bind copies none of ours: a pin (bound onto itself) keeps the mode of what it lies
    in, read-only inside a protected directory; a reopened git directory inside a read-only
    modules/ or worktrees/ is bound from a descriptor opened before any of it, so it is the
    writable original; protected paths and placeholders are bound read-only on top."""
    ops = sorted(
        [(d, 0) for d in p.pins]
        + [(d, 1) for d in p.reopen]
        + [(x, 2) for x in (*p.protect, *(ph for ph, _ in p.placeholders))],
        key=lambda op: (op[0].rstrip("/").count("/"), op[1]),
    )
    fds = {d: os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC) for d in p.reopen}
    try:
        for path, kind in ops:
            if kind == 0:
                mount(path, path, None, MS_BIND | MS_REC)
            elif kind == 1:
                mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
            else:
                bind_readonly(path, path)
    finally:
        for fd in fds.values():
            os.close(fd)


def _mount_overlay(h: HomeOverlay) -> None:
    """Mounted from inside the sandbox's user namespace, where overlayfs may not set trusted.*
    xattrs: without `userxattr` (Linux 5.11+) it cannot record a removed or renamed directory of
    the real home (whiteouts, redirects), and `rm -rf ~/.cache/x` fails with EIO. Older kernels
    do not know the option: there the overlay still works, only without those operations.
    The workspace's layer lies between this run's own upper directory and the real home
    (fsguard/homeoverlay.py): its whiteouts and opaque directories hide what the real home has."""
    data = f"lowerdir={':'.join((*h.layers, h.home))},upperdir={h.upper},workdir={h.work}"
    try:
        mount("overlay", h.home, "overlay", MS_NOSUID | MS_NODEV, data + ",userxattr")
    except MountError as e:
        if e.errno != errno.EINVAL:
            raise
        mount("overlay", h.home, "overlay", MS_NOSUID | MS_NODEV, data)


def _home_overlay(h: HomeOverlay) -> None:
    """Step 3b: ~ becomes the overlay; writable roots inside it are bound back to the real ones."""
    keep = [(r, os.open(r, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for r in h.rebinds]
    try:
        try:
            _mount_overlay(h)
        except MountError as e:
            # Fail soft, never open: the home simply stays as it was (read-only to the command).
            os.write(2, f"sandgate: warning: the home directory stays read-only inside ({e.strerror})\n".encode())
            return
        for root, fd in keep:
            os.makedirs(root, exist_ok=True)  # in the upper layer only, if it was not there
            mount(f"/proc/self/fd/{fd}", root, None, MS_BIND | MS_REC)
            nosuid_bind(root)
    finally:
        for _, fd in keep:
            os.close(fd)


def _build(p: MountPlan, run_dir: Path, files: dict[str, Path]) -> None:
    sockets = exposed.open_sources(p)  # before any mount
    if p.home is not None:
        _home_overlay(p.home)
    if p.private_tmp:
        stage = run_dir / "hosttmp"
        mount("/tmp", str(stage), None, MS_BIND | MS_REC)
        sfd = os.open(stage, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the host's /tmp, by handle
        try:
            mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
            for root in p.tmp_rebinds:
                inside = posixpath.join("/tmp", os.path.relpath(root, "/tmp"))
                os.makedirs(inside, exist_ok=True)
                mount(f"/proc/self/fd/{sfd}/{os.path.relpath(root, '/tmp')}", inside, None, MS_BIND | MS_REC)
                nosuid_bind(inside)
            detach(f"/proc/self/fd/{sfd}")
        finally:
            os.close(sfd)
    _protect_mounts(p)
    for target, source in files.items():
        real = os.path.realpath(target)
        if not os.path.isfile(real):
            # Creating it would write to the host's filesystem: the mount namespace does not isolate files.
            raise MountError(2, f"cannot cover {target}: {real} is not a file")
        bind_readonly(str(source), real)
    empty = run_dir / "empty"
    for f in p.hide_files:
        bind_readonly(str(empty), f)
    # Directories last: sandgate's own run directory (the source of the binds above) is one of them.
    for d in p.hide_dirs:
        try:
            mount("tmpfs", d, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=4k")
        except MountError as e:
            if e.errno != errno.ENOENT:
                raise
            # Removed since the plan (another user's store, a finished run's): nothing left to hide. One
            # made again later is as visible as one made after this run began (README: what is not covered).
    exposed.bind_back(sockets, p)  # the end of step 7 (closes the handles)
    os.chdir(os.getcwd())  # step 8: the old cwd still names the directory *under* the pins
