"""The sandbox's own user namespace: who the command is inside, and how that maps to the host.

Every sandbox gets one, whoever starts sandgate: capabilities held inside a user namespace
count only for the namespaces it owns, so even a command that is "root" inside cannot setns
into the host's network namespaces, open_by_handle_at, mknod real devices, load modules or
change the host's hostname (threat model: "host capabilities kept by a root command").

How uids map (`plan`, pure):
  started by root, no --user/sudo caller  inside 0 = host root, and apt's `_apt` sandbox account,
                                          nothing else: a root-owned workspace (CI, containers)
                                          stays usable and apt can drop privileges, but other
                                          users' files appear as `nobody` and root's
                                          DAC_OVERRIDE does not reach them
  started by root for user U (sudo, --user) inside U = host U (and 0 = 0 for sandgate's own
                                          setup process); the command runs as U with no capability
  started by user U                       inside U = host U: the command is just U, no capability
  started by user U with --user 0/root    inside 0 = host U: "root" to apt/dpkg, holding nothing
                                          over the host (its files are U's)
An unprivileged user may map only its own ids, and must deny setgroups(2) first (the kernel's
rule against dropping a group that denied access).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


class UsernsError(Exception):
    """A mapping that cannot be made (another user's uid without root); one line for the user."""


@dataclass(frozen=True)
class IdMap:
    """One line of a uid_map or gid_map: `count` ids from `inside` map to ids from `outside`."""

    inside: int
    outside: int
    count: int = 1


@dataclass(frozen=True)
class Identity:
    """The user namespace's maps and who the command becomes inside it."""

    uid_map: tuple[IdMap, ...]
    gid_map: tuple[IdMap, ...]
    deny_setgroups: bool
    uid: int  # the command's uid, inside
    gid: int
    groups: tuple[int, ...]  # supplementary groups inside; () when setgroups is denied
    switch: bool  # the command must setgroups/setgid/setuid before exec (its setup process is someone else)

    @property
    def root_inside(self) -> bool:
        return self.uid == 0


def plan(
    launcher_uid: int,
    launcher_gid: int,
    target: tuple[int, int, tuple[int, ...]] | None,
    root_inside: bool,
    helpers: tuple[tuple[int, int], ...] = (),
) -> Identity:
    """Maps for a sandbox started by `launcher_uid`; `target` (uid, gid, groups) is the host user to run as.

    `root_inside`: the caller asked for uid 0 inside (`--user 0`/`--user root`). `helpers`: (uid, gid)
    of the accounts root tools drop to (apt's `_apt`), mapped too so root inside can switch to them;
    their files are all they add to what root inside may override.
    """
    if launcher_uid == 0:
        if root_inside or target is None or target[0] == 0:
            uids = tuple(dict.fromkeys((0, *(u for u, _ in helpers))))
            gids = tuple(dict.fromkeys((0, *(g for _, g in helpers))))
            return Identity(tuple(IdMap(u, u) for u in uids), tuple(IdMap(g, g) for g in gids), False, 0, 0, (), False)
        uid, gid, groups = target
        gids = tuple(dict.fromkeys((0, gid, *groups)))
        return Identity(
            (IdMap(0, 0), IdMap(uid, uid)),
            tuple(IdMap(g, g) for g in gids),
            False,
            uid,
            gid,
            tuple(dict.fromkeys(groups)),
            True,
        )
    if target is not None and target[0] != launcher_uid:
        raise UsernsError(
            f"cannot run the command as uid {target[0]} without root; as yourself, "
            "leave out --user, or use --user 0 to be root inside the sandbox only"
        )
    if root_inside:
        return Identity((IdMap(0, launcher_uid),), (IdMap(0, launcher_gid),), True, 0, 0, (), False)
    return Identity(
        (IdMap(launcher_uid, launcher_uid),),
        (IdMap(launcher_gid, launcher_gid),),
        True,
        launcher_uid,
        launcher_gid,
        (),
        False,
    )


def map_text(maps: tuple[IdMap, ...]) -> str:
    return "".join(f"{m.inside} {m.outside} {m.count}\n" for m in maps)


def write_maps(pid: int, ident: Identity) -> None:
    """From the parent namespace, after `pid` unshared CLONE_NEWUSER: one write() each, as the kernel requires."""
    if ident.deny_setgroups:
        _write(f"/proc/{pid}/setgroups", "deny")
    _write(f"/proc/{pid}/uid_map", map_text(ident.uid_map))
    _write(f"/proc/{pid}/gid_map", map_text(ident.gid_map))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def become(ident: Identity) -> None:
    """In the command's process, before exec: take the command's ids (setgroups first, setuid last)."""
    if not ident.switch:
        return
    os.setgroups(list(ident.groups))
    os.setgid(ident.gid)
    os.setuid(ident.uid)  # from 0 to U: the kernel clears every capability here


#: The sandbox's own limit on the user namespaces made inside it (per user namespace, Linux 4.9+).
MAX_USER_NAMESPACES = "/proc/sys/user/max_user_namespaces"
#: What a run with `--allow-nested-userns` records among its warnings and prints with -v.
NESTED_WARNING = (
    "nested user namespaces are allowed (--allow-nested-userns): the command can hold CAP_NET_ADMIN and "
    "CAP_SYS_ADMIN over namespaces of its own, and reach nf_tables and the other kernel code behind them"
)


def forbid_nested() -> None:
    """No user namespace can be made inside the sandbox's: call from its setup process, which still
    holds CAP_SYS_RESOURCE there. The limit is per user namespace and checked for every ancestor, so
    it holds whatever call the command makes (clone3's flags, which seccomp cannot read, included),
    and nobody inside can raise it again without CAP_SYS_RESOURCE in this namespace (a command that
    is root inside does not keep it). seccomp answers EPERM first; this is the kernel's own backstop
    (ENOSPC). The threat: a nested user namespace gives CAP_NET_ADMIN over a network namespace of the
    command's own, and with it nf_tables, where most recent kernel privilege escalations live."""
    _write(MAX_USER_NAMESPACES, "0")


def _read_sysctl(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def unprivileged_userns_problem(read: Callable[[str], str | None] = _read_sysctl) -> str | None:
    """Why an ordinary user cannot create a user namespace here, naming the setting; None if nothing known."""
    checks = (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "sysctl kernel.unprivileged_userns_clone=1"),
        ("/proc/sys/user/max_user_namespaces", "0", "sysctl user.max_user_namespaces=15000"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "sysctl kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile allowing userns "
            "for sandgate's python)",
        ),
    )
    for path, bad, fix in checks:
        if read(path) == bad:
            return f"{path.removeprefix('/proc/sys/').replace('/', '.')} = {bad}; enable it with: {fix}"
    return None
