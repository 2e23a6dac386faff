"""What every policy is held to, whoever wrote it: no home as a writable root, no absurd share of
the address space, no unbounded number of rules, no credential for a host it cannot reach. Pure, given a Checks (which `current()` fills in).
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Callable
from dataclasses import dataclass

from fsguard import policy as fspolicy
from launcher.config.errors import PolicyFileError
from launcher.config.locs import LocDict
from netguard import policy as netpolicy
from sgbase.policyerror import line_of

MAX_RULES = 1_000_000  # network rules in all (netguard.hostsfile.MAX_NAMES); the bundled lists have about 100
#: Widest prefix one allow/ask cidr may have without --allow-wide-cidr; all of them together may
#: cover at most four such blocks. A /8 is the largest block any single network holds in IPv4 (and
#: 10.0.0.0/8 is common); in IPv6 whole registries hold /12s and the largest ISPs /19s, so a /16
#: already reaches past any one network. Deny rules only narrow: they may be as wide as wanted.
WIDE_PREFIX = {4: 8, 6: 16}


@dataclass(frozen=True)
class Checks:
    """What every policy is held to in this run, from the command line and the environment."""

    allow_wide_cidr: bool = False  # --allow-wide-cidr; never from a file
    homes: tuple[str, ...] = ()  # every home `~` may mean in this run; no writable root may hold one
    cwd: str = "/"
    realpath: Callable[[str], str] = posixpath.normpath  # os.path.realpath in a run
    others: tuple[str, ...] = ()  # the other people's homes on this machine: no writable root may hold one either

    @classmethod
    def current(cls, *, allow_wide_cidr: bool = False, user: str | None = None) -> Checks:
        """Homes: $HOME, the user's, the sudo caller's and --user's (`~` in a policy means the one CMD runs as)."""
        if sys.platform == "win32":  # no euid, sudo or pwd there (win-py P2); the ACL plan checks Windows paths
            return cls(allow_wide_cidr, (), os.getcwd(), os.path.realpath, ())
        sudo = os.environ.get("SUDO_UID", "") if os.geteuid() == 0 else ""
        found = [os.environ.get("HOME", ""), *(_home(w) for w in (str(os.geteuid()), sudo, user or "") if w)]
        homes = [h for h in found if h.startswith("/")]
        both = [*(posixpath.normpath(h) for h in homes), *(os.path.realpath(h) for h in homes)]
        return cls(allow_wide_cidr, tuple(dict.fromkeys(both)), os.getcwd(), os.path.realpath, _people_homes())


def _home(who: str) -> str:
    import pwd

    try:
        return (pwd.getpwuid(int(who)) if who.isdigit() else pwd.getpwnam(who)).pw_dir
    except (KeyError, ValueError):
        return ""  # an unknown --user is reported by the run itself


def _people_homes() -> tuple[str, ...]:
    """Homes of root and of the login accounts (uid >= 1000, not nobody) that exist: `cd /home &&
    sandgate run` as root must not let a command plant another user's ~/.bashrc either."""
    import pwd

    homes = {
        os.path.realpath(p.pw_dir)
        for p in pwd.getpwall()
        if (p.pw_uid == 0 or 1000 <= p.pw_uid < 65534) and p.pw_dir.startswith("/") and os.path.isdir(p.pw_dir)
    }
    return tuple(sorted(h for h in homes if h != "/"))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def write_root_problem(entry: str, checks: Checks) -> str | None:
    """Why `entry` may not be a writable root (it is a home directory or holds one), or None."""
    if entry == "~" or entry.startswith("~/"):
        paths = [posixpath.normpath(h + entry[1:]) for h in checks.homes]
    else:
        paths = [posixpath.normpath(posixpath.join(checks.cwd, entry))]
    for p in (*paths, *(checks.realpath(p) for p in paths)):
        for home in (*checks.homes, *checks.others):
            if _under(home, p):
                whose = "your home" if home in checks.homes else "a user's home"
                what = f"{whose} directory" if home == p else f"a directory that holds {whose}"
                return (
                    f"'filesystem.write' entry '{entry}' is {what} ({home}): a command could plant files that "
                    "run outside the sandbox (~/.bashrc, ~/.ssh/authorized_keys); writes under ~ already work "
                    "inside (kept in sandgate's home layer), so name the project directories it must write instead"
                )
    return None


def check_writes(doc: LocDict, fs: fspolicy.FsPolicy, where: str, checks: Checks) -> None:
    """One file's `filesystem.write` entries, each named at its line when it is a home or holds one."""
    entries = (doc.get("filesystem") or {}).get("write")
    for i, entry in enumerate(fs.write or ()):
        if (problem := write_root_problem(entry, checks)) is not None:
            raise PolicyFileError(where, line_of(entries, i), problem)


def _covered(nets: list[netpolicy.Network]) -> int:
    """How many addresses the union of `nets` (one IP version) holds."""
    total, end = 0, -1
    for lo, hi in sorted((int(n.network_address), int(n.broadcast_address)) for n in nets):
        if hi > end:
            total += hi - max(lo, end + 1) + 1
            end = hi
    return total


def wide_cidr_problem(net: netpolicy.NetworkPolicy) -> tuple[netpolicy.Rule, str] | None:
    """The first allow/ask cidr that is too wide alone, or that takes all of them past four such blocks."""
    rules = [
        (name, r, r.value)
        for name, rs in (("allow", net.allow), ("ask", net.ask))
        for r in rs
        if not isinstance(r.value, str)
    ]
    how = "list the ranges the task needs, or pass --allow-wide-cidr to sandgate if you mean it"
    for name, r, n in rules:
        if n.prefixlen < WIDE_PREFIX[n.version]:
            return r, (
                f"network.{name}: cidr {n} covers 1/{2**n.prefixlen} of all IPv{n.version} addresses "
                f"(one rule may cover at most a /{WIDE_PREFIX[n.version]}); {how}"
            )
    for version, bits in ((4, 32), (6, 128)):
        same = [x for x in rules if x[2].version == version]
        limit = 4 << (bits - WIDE_PREFIX[version])
        if _covered([n for _, _, n in same]) <= limit:
            continue
        lo, hi = 1, len(same)  # the first k whose union passes the limit: the union only grows with k
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _covered([n for _, _, n in same[:mid]]) > limit else (mid + 1, hi)
        name, r, n = same[lo - 1]
        share = 2**bits // _covered([x[2] for x in same[:lo]])
        return r, (
            f"network.{name}: with cidr {n}, the cidr rules cover 1/{share} of all IPv{version} addresses, "
            f"more than four /{WIDE_PREFIX[version]}s; {how}"
        )
    return None


def check_network(net: netpolicy.NetworkPolicy, checks: Checks) -> None:
    """The merged network rules: not too many, and no absurd share of the address space unless the flag says so."""
    rules = (*net.allow, *net.deny, *net.ask)
    if len(rules) > MAX_RULES:
        raise PolicyFileError.at(
            rules[MAX_RULES].origin,
            f"more than {MAX_RULES} network rules in all; allow wildcards or cidrs instead of listing every host",
        )
    if not checks.allow_wide_cidr and (found := wide_cidr_problem(net)) is not None:
        raise PolicyFileError.at(found[0].origin, found[1])
    check_credentials(net)


def check_credentials(net: netpolicy.NetworkPolicy) -> None:
    """A credential whose host no allow rule reaches on 443 would never be sent: a mistake, said at its line."""
    if not net.credentials:
        return
    from netguard import rules

    rs = rules.compile_policy(net)
    for c in net.credentials:
        if not rules.decide(rs, c.host, 443).allowed:
            raise PolicyFileError.at(
                c.origin,
                f"credential for {c.host} would never be used: no allow rule reaches {c.host} on port 443; "
                f"allow it (e.g. '- host: {c.host}') or remove the credential",
            )
