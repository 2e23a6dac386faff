"""The files that configure a run stay as they are while it runs: read-only inside, wherever they live.

A `--policy` file may widen the network and bind credentials; sandgate's own code runs next outside
any sandbox; the files it includes, the
`--upstream-ca` bundle, the `--approvals` socket and the audit log decide what the next run trusts,
whom it asks and what it records. Lying in the workspace they were writable from inside: a run
rewrote its own `agent.yaml` to inspect another host and bind the credential there, and the user's
next identical command sent the real secret to that host (issue 24).

So each one that lies under a writable root is a protected path of the run (fsguard/mounts.py):
bound read-only over itself (a write is EROFS; unlinking it or renaming another file over it is
EBUSY, a mount point) and every directory between the root and it pinned (a mount point too:
renaming a parent away and making a new one in its place is EBUSY). Landlock forbids undoing any
mount. The name the next run will open must lead to the same file, so a name that reaches it
through a symlink, or through `dir/..`, that the run could replace is refused in one line before
anything starts; a file that does not exist yet configures nothing (sandgate makes the approvals
socket before planning, when it may ask at all). Outside every writable root Landlock already
refuses writes, and under the host's /tmp the run has a /tmp of its own.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
import sys
from dataclasses import dataclass

from fsguard import policy as fspolicy
from launcher.errors import RunError
from launcher.run.options import RunOptions

MAX_LINKS = 40  # symlinks followed in one name, as the kernel allows (ELOOP beyond)


@dataclass(frozen=True)
class ConfigFile:
    """One file that configures the run, absolute as the user (or an include) named it."""

    path: str
    what: str  # how the user knows it: "--policy file", "--upstream-ca", ...


@dataclass(frozen=True)
class Walk:
    """A name resolved as the kernel resolves it."""

    real: str  # where it leads (the rest of the name appended where a component is missing)
    links: tuple[str, ...]  # the symlinks passed through
    ups: tuple[str, ...]  # the directories left by '..'
    exists: bool


def of_run(opts: RunOptions) -> tuple[ConfigFile, ...]:
    """Every file that configures this run."""
    files = [ConfigFile(str(p), "policy file") for p in opts.policy.read]
    if opts.upstream_ca_file:
        files.append(ConfigFile(posixpath.join(os.getcwd(), opts.upstream_ca_file), "--upstream-ca"))  # '..' kept
    if opts.approvals:
        files.append(ConfigFile(opts.approvals, "--approvals socket"))
    files.append(ConfigFile(str(opts.audit_path), "audit log"))
    return (*files, *installation())


def walk(path: str) -> Walk:
    """Resolve an absolute `path` component by component, noting every symlink and '..' on the way."""
    todo = [c for c in path.split("/") if c and c != "."]
    cur, links, ups = "/", list[str](), list[str]()
    while todo:
        comp = todo.pop(0)
        if comp == "..":
            ups.append(cur)
            cur = posixpath.dirname(cur)
            continue
        nxt = posixpath.join(cur, comp)
        try:
            st = os.lstat(nxt)
        except OSError:  # missing, or a file where a directory should be
            return Walk(posixpath.join(nxt, *todo), tuple(links), tuple(ups), False)
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        links.append(nxt)
        if len(links) > MAX_LINKS:
            return Walk(nxt, tuple(links), tuple(ups), False)
        target = os.readlink(nxt)
        todo = [c for c in target.split("/") if c and c != "."] + todo
        cur = "/" if target.startswith("/") else cur
    return Walk(cur, tuple(links), tuple(ups), True)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    """Strictly below a writable root: the command may rename or replace it."""
    return any(path != r and _under(path, r) for r in roots)


def writable_roots(eff: fspolicy.Effective) -> tuple[str, ...]:
    """The writable roots as real paths; never the private /tmp (the host's /tmp is not in it)."""
    return tuple(dict.fromkeys(os.path.realpath(w) for w in eff.write if not (w == "/tmp" and eff.private_tmp)))


def plan(files: tuple[ConfigFile, ...], roots: tuple[str, ...]) -> tuple[str, ...]:
    """The real paths to hold read-only; RunError for a name the run could make lead elsewhere."""
    out: list[str] = []
    for f in files:
        w = walk(f.path)
        movable = [(link, "a symlink") for link in w.links if _inside(link, roots)]
        movable += [(d + "/..", "'..'") for d in w.ups if _inside(d, roots)]
        if movable:
            where, kind = movable[0]
            raise RunError(
                f"{f.what} {f.path} is reached through {where} ({kind} inside a writable path), which the "
                f"command could change before the next run; name it by its real path"
                + (f", {w.real}" if w.exists else "")
            )
        if not w.exists or not any(_under(w.real, r) for r in roots):
            continue  # nothing to hold, or out of the command's reach already
        if w.real in roots:
            raise RunError(f"{f.what} {f.path} is itself a writable path of the run; it cannot be both")
        _single(f, w.real)
        out.append(w.real)
    return tuple(dict.fromkeys(out))


def _single(f: ConfigFile, real: str) -> None:
    """A held file must have no other name: a hard link made by an earlier run (`ln agent.yaml cache/a`)
    is another way in to the same inode, and the read-only bind holds only this name (issue 24 review)."""
    st = os.stat(real)
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise RunError(
            f"{f.what} {f.path} has {st.st_nlink} hard links, and a writable path could hold another of them: "
            f"remove the others (find / -xdev -samefile {real}) or keep the file outside the workspace"
        )


def installation() -> tuple[ConfigFile, ...]:
    """sandgate's own code and the interpreter that runs it: the next run executes them outside any sandbox,
    as whoever starts it (root too). The README's quick start runs from the checkout, whose `.venv` and
    packages were then writable from inside (issue 24 review)."""
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # holds launcher/
    dirs = [os.path.join(src, name) for name in ("launcher", "netguard", "fsguard", "sgbase", "allowlists")]
    exe = os.path.realpath(sys.executable)
    dirs += [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(exe))]
    return tuple(ConfigFile(d, "sandgate's own installation") for d in dict.fromkeys(dirs) if os.path.isdir(d))


def protect(eff: fspolicy.Effective, files: tuple[ConfigFile, ...]) -> fspolicy.Effective:
    """`eff` with every configuring file under a writable root among its protected paths."""
    held = plan(files, writable_roots(eff))
    return dataclasses.replace(eff, protect=tuple(dict.fromkeys((*eff.protect, *((p, False) for p in held)))))
