"""Refusals by design, explained at exit: when a command failed, which of sandgate's own rules it likely met.

The kernel does not tell sandgate when Landlock, a read-only bind, a hidden path or the
private /tmp refused something (no log reaches the launcher, and the command only sees an
errno: "Device or resource busy", "Read-only file system", "No such file"). So this never
claims a refusal happened; it says what sandgate knows for certain (its own plan: the run's
`policy` record) next to cheap evidence that the command went there (its argv and `sh -c`
script naming a protected, hidden or host-/tmp path, git subcommands that write git's config,
system package managers run as root, a PATH entry warned about at start and exit status 127).
A command that reaches a path only through a variable or a file it reads is not seen: the
docs say so. Pure: facts and the policy record in, lines out; `exists` is the one host look-up.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from netguard.audit import PolicyRecord

#: git subcommands that write files sandgate keeps read-only (config, hooks, modules/, worktrees/).
GIT_WRITERS = frozenset({"config", "remote", "submodule", "init", "maintenance", "lfs", "worktree", "filter-repo"})
GIT_READS = frozenset({"--get", "--get-all", "--get-regexp", "--list", "-l", "get", "list", "--show-origin", "-v"})
GIT_UPSTREAM = frozenset({"-u", "--set-upstream", "--set-upstream-to", "--track"})
#: Tools that need the host's root (system directories writable, setuid): never inside a sandbox.
SYSTEM_TOOLS = frozenset(
    {"apt", "apt-get", "aptitude", "dpkg", "yum", "dnf", "rpm", "apk", "pacman", "zypper", "snap"}
    | {"sudo", "su", "doas", "mount", "umount", "systemctl", "useradd", "usermod", "groupadd", "passwd", "chroot"}
)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox"})
NOT_FOUND = 127  # a shell's "command not found"


@dataclass(frozen=True)
class Facts:
    """What the launcher knows of the command without looking inside it."""

    argv: tuple[str, ...]
    cwd: str
    home: str
    status: int  # the command's exit status (128+N for a signal)
    root_inside: bool  # uid 0 inside the sandbox (a user namespace's root, never the host's)


def words(argv: Sequence[str]) -> list[str]:
    """argv, with each `sh -c SCRIPT` (any argument holding a space) split as a shell would, roughly."""
    out: list[str] = []
    for arg in argv:
        if any(c.isspace() for c in arg):
            try:
                out += list(shlex.shlex(arg, posix=True, punctuation_chars=True))
            except ValueError:  # an unbalanced quote: whitespace is the best guess
                out += arg.split()
        else:
            out.append(arg)
    return out


def _paths(ws: Iterable[str], facts: Facts) -> list[str]:
    """Absolute, normalised paths the words name (`--opt=PATH` included); `~` is the user's home."""
    out: list[str] = []
    for w in ws:
        w = w.partition("=")[2] if w.startswith("-") and "=" in w else w
        if w.startswith("~/") or w == "~":
            w = facts.home + w[1:]
        if not (w.startswith(("/", ".")) or "/" in w) or "://" in w:
            continue  # a word, an option or a URL: not a path
        out.append(posixpath.normpath(posixpath.join(facts.cwd, w)))
    return list(dict.fromkeys(out))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _in_git_dir(path: str) -> bool:
    return "/.git/" in path + "/"


def _subcommand(rest: Sequence[str]) -> str:
    """git's subcommand: the first word that is neither an option nor the value of `-c`/`-C`."""
    skip = False
    for x in rest:
        if skip or x.startswith("-"):
            skip = x in ("-c", "-C") and not skip
            continue
        return x
    return ""


def _git(ws: Sequence[str], policy: PolicyRecord) -> str | None:
    """`git config x.y z`, `git remote add`, `git push -u`...: they write what the run keeps read-only."""
    if not any(_in_git_dir(p) for p in policy["protect"]):
        return None  # no git directory under a writable root: nothing of git's is protected
    for i, w in enumerate(ws):
        if posixpath.basename(w) != "git":
            continue
        rest = ws[i + 1 :]
        sub = _subcommand(rest)
        if (sub in GIT_WRITERS and not GIT_READS & set(rest)) or GIT_UPSTREAM & set(rest):
            return (
                "git's config, hooks and other control files are read-only inside (git protection: writing "
                "them fails with 'Device or resource busy' or 'Read-only file system'); run that git command "
                "outside the sandbox (docs/git-protection.md)"
            )
    return None


def _protected(paths: Sequence[str], policy: PolicyRecord) -> str | None:
    hit = next((p for p in paths for r in policy["protect"] if _under(p, r) and not _in_git_dir(p)), None)
    if hit is None:
        return None
    return (
        f"{hit} is read-only inside (a protected path: tools outside the sandbox trust it); change it "
        "outside the sandbox, or open an editor's folder with `filesystem: {unprotect: [...]}`"
    )


def _hidden(paths: Sequence[str], policy: PolicyRecord, path_warned: bool) -> str | None:
    hit = next((p for p in paths for r in policy["hidden"] if _under(p, r)), None)
    if hit is None and not path_warned:
        return None
    what = hit or "a PATH entry (warned about at start)"
    return (
        f"{what} is hidden inside (secrets, host sockets, sandgate's state, --read-deny): it appears empty; "
        "broker a credential with the policy's `credentials:`, show a socket with --expose-socket"
    )


def _private_tmp(
    paths: Sequence[str], policy: PolicyRecord, exists: Callable[[str], bool], path_warned: bool
) -> str | None:
    if not policy["private_tmp"]:
        return None
    rebinds = [r for r in policy["write"] if r != "/tmp" and _under(r, "/tmp")]
    hit = next((p for p in paths if _under(p, "/tmp") and p != "/tmp" and not any(_under(p, r) for r in rebinds)), None)
    if hit is not None and not exists(hit):
        hit = None  # made inside, in the sandbox's own /tmp: not the host's file the command missed
    if hit is None and not path_warned:
        return None
    what = f"{hit} is on the host's /tmp, which" if hit else "a PATH entry under the host's /tmp (warned at start):"
    return f"{what} the sandbox does not see (its /tmp is private and empty); --write {hit or 'DIR'} shows it"


def _root(ws: Sequence[str], facts: Facts) -> str | None:
    tool = next((posixpath.basename(w) for w in ws if posixpath.basename(w) in SYSTEM_TOOLS), None)
    if tool is None:
        return None
    who = (
        "uid 0 inside is a user namespace's root, with no host privilege"
        if facts.root_inside
        else "setuid programs do not raise privileges inside"
    )
    return (
        f"{tool} needs the host's root, which the sandbox never has ({who}; system directories are read-only, "
        "hence 'are you root?'); install into the workspace (a venv, node_modules) or run it outside the sandbox"
    )


def hints(facts: Facts, policy: PolicyRecord | None, exists: Callable[[str], bool]) -> list[str]:
    """One `sandgate: hint:` line per kind of by-design refusal the failed command likely met."""
    if facts.status == 0 or policy is None:
        return []
    ws = words(facts.argv)
    paths = _paths(ws, facts)
    not_found = facts.status == NOT_FOUND
    warned = [w for w in policy["warnings"] if w.startswith("PATH entry ")] if not_found else []
    found = [
        _git(ws, policy),
        _protected(paths, policy),
        _hidden(paths, policy, any("sandgate hides" in w for w in warned)),
        _private_tmp(paths, policy, exists, any("private /tmp" in w for w in warned)),
        _root(ws, facts),
    ]
    from launcher.audit.text import escape  # here: only a failed run pays for its yaml import

    return [escape(f"sandgate: hint: {x}") for x in found if x is not None]
