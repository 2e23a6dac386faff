"""Every sandgate runtime directory of the user, in every spelling, and `/run/user/<uid>`: what a
sandbox must not see, and which unix sockets `--expose-socket` may put back.

The threat (issue 22): a daemon's control socket found from inside. A launcher hides the runtime
directory it resolved itself, but another daemon of the same user may live under another
spelling of it (netguard.daemon.control.runtime_base): a login session's `$XDG_RUNTIME_DIR/sandgate`
beside a run started without XDG_RUNTIME_DIR (cron, su, CI), or the user's own daemon beside a
`sudo sandgate run`. `/run/user/<uid>` holds the user's systemd manager and D-Bus: `systemd-run
--user` from inside would be a process escape. So every spelling is hidden, for every uid the run
speaks for (the launcher's, the sudo caller's, the command's).

`plan` and `refusal` are pure (paths in, paths out). `check_exposed` and `daemon_sockets` look at
the filesystem (stat, a bounded scan) and change nothing.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The spellings (control.runtime_base): root's, any user's under the shared /tmp, a login session's.
ROOT_DIR = "/run/sandgate"
TMP_FMT = "/tmp/sandgate-{uid}"
USER_RUN_FMT = "/run/user/{uid}"
#: Any uid's sandgate runtime directory, named by path alone (the user's, root's or another's).
_SANDGATE_DIR = re.compile(r"^(/run/sandgate|/tmp/sandgate-\d+|/run/user/\d+/sandgate)(/|$)")
SCAN_LIMIT = 2000  # entries looked at per runtime directory when collecting its sockets


@dataclass(frozen=True)
class RuntimeDirs:
    """What one run hides, and what it never exposes."""

    hide: tuple[str, ...]  # directories to hide; only those that exist get a mount (fsguard.mounts.plan)
    sandgate: tuple[str, ...]  # every sandgate runtime directory spelling: never exposable
    notes: tuple[str, ...] = ()  # warnings: a directory left visible because a writable root lies in it


def uids(euid: int, uid: int, environ: Mapping[str, str], command_uid: int | None) -> tuple[int, ...]:
    """The uids whose runtime directories a run hides: the launcher's (effective and real), the sudo
    caller's (SUDO_UID: the user's own daemon beside a `sudo sandgate run`) and the command's (--user)."""
    sudo = environ.get("SUDO_UID", "")
    found = [euid, uid, *((int(sudo),) if sudo.isdigit() else ()), *((command_uid,) if command_uid is not None else ())]
    return tuple(dict.fromkeys(found))


def _norm(path: str) -> str:
    return posixpath.normpath(path)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan(environ: Mapping[str, str], for_uids: Iterable[int], keep_visible: Iterable[str] = ()) -> RuntimeDirs:
    """Every runtime directory spelling of `for_uids`, plus `/run/user/<uid>` itself (pure).

    $XDG_RUNTIME_DIR/sandgate is hidden whatever the variable says (owned by another uid, as after
    `sudo -E`, or not a directory at all): a daemon may have resolved it differently. A relative
    value is ignored, as control.runtime_base ignores it. `keep_visible` (the writable roots and
    the workspace) is never covered: a directory holding one is left visible and named in `notes`.
    """
    ids = tuple(dict.fromkeys(for_uids))
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    sandgate = [ROOT_DIR]
    if xdg.startswith("/") and _norm(xdg) != "/":
        sandgate.append(_norm(xdg) + "/sandgate")
    for uid in ids:
        sandgate += [USER_RUN_FMT.format(uid=uid) + "/sandgate", TMP_FMT.format(uid=uid)]
    candidates = [*dict.fromkeys(sandgate), *(USER_RUN_FMT.format(uid=uid) for uid in ids)]
    keep = [_norm(p) for p in keep_visible]
    hide: list[str] = []
    notes: list[str] = []
    for d in dict.fromkeys(candidates):
        holding = [k for k in keep if _under(k, d)]
        if holding:
            notes.append(f"{d} stays visible inside: the writable path {holding[0]} lies in it")
        else:
            hide.append(d)
    return RuntimeDirs(tuple(hide), tuple(dict.fromkeys(sandgate)), tuple(notes))


def refusal(real: str, sandgate: Iterable[str], own: Iterable[str]) -> str | None:
    """Why the socket at `real` (a resolved path) may never be exposed, or None (pure).

    A daemon's control socket and a run's approval socket: a sandbox that reached either could
    bind itself a wider policy, stop the daemon or answer its own questions. Any uid's runtime
    directory is refused by its name alone, and this run's spellings and own state by prefix."""
    if _SANDGATE_DIR.match(real) or any(_under(real, _norm(d)) for d in sandgate):
        return "it lies in a sandgate runtime directory (a daemon's control socket is never exposed)"
    if any(_under(real, _norm(d)) for d in own):
        return "it is sandgate's own (this run's runtime directory, approvals, trust records, audit logs)"
    return None


# ---- effects: stat and a bounded scan ----------------------------------------------------------


class ExposeError(Exception):
    """A --expose-socket path that cannot be exposed; one line for the user."""


@dataclass(frozen=True)
class Exposed:
    """One socket to show inside: as the user named it, and the file the mount binds."""

    path: str
    real: str


def daemon_sockets(dirs: Iterable[str]) -> frozenset[tuple[int, int]]:
    """(st_dev, st_ino) of every socket in these runtime directories and one level below (runs/<id>/):
    the same socket under another name (a hard link, a bind mount) is still refused."""
    found: set[tuple[int, int]] = set()
    for top in dirs:
        seen = 0
        stack = [(top, 0)]
        while stack and seen < SCAN_LIMIT:
            d, depth = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue  # missing, or not ours to read: nothing we could be asked to expose from it
            for e in entries[: SCAN_LIMIT - seen]:
                seen += 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    found.add((st.st_dev, st.st_ino))
                elif stat.S_ISDIR(st.st_mode) and depth < 2:
                    stack.append((e.path, depth + 1))
    return frozenset(found)


def check_exposed(paths: Iterable[str], sandgate: tuple[str, ...], own: tuple[str, ...]) -> tuple[Exposed, ...]:
    """The sockets `--expose-socket` named, resolved and checked; ExposeError for the first refused."""
    wanted = tuple(dict.fromkeys(paths))
    if not wanted:
        return ()
    out: list[Exposed] = []
    forbidden = daemon_sockets((*sandgate, *own))
    for path in wanted:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            st = None
        if st is None or not stat.S_ISSOCK(st.st_mode):
            raise ExposeError(f"--expose-socket {path}: not an existing unix socket")
        why = refusal(real, (*sandgate, *map(os.path.realpath, sandgate)), (*own, *map(os.path.realpath, own)))
        if why is None and (st.st_dev, st.st_ino) in forbidden:
            why = "it is a sandgate runtime directory's socket under another name"
        if why is not None:
            raise ExposeError(f"--expose-socket {path}: refused, {why}")
        out.append(Exposed(path, real))
    return tuple(out)
