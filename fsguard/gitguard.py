"""Git's indirections inside writable roots: every path through which git finds configuration,
hooks or a program to run, so that mounts.plan() can make them read-only (docs/git-protection.md).

The threat (issue 10): git reads far more than `.git/config` and `.git/hooks`. A `commondir`
file moves the whole common directory (config, hooks) elsewhere; `worktrees/<id>/commondir`,
`modules/<name>/` (a submodule's own config and hooks), `config.worktree`, `info/attributes`
(names filter drivers), `objects/info/alternates`, a `.git` *file* (`gitdir: elsewhere`) and
the scripts the config names (core.hooksPath, include.path, core.fsmonitor...) all run code
on the user's next `git status` or `git commit` on the host, outside any sandbox.

A git directory cannot simply be bound read-only: every ref, index and HEAD update creates a
`*.lock` file next to its target and renames it over. So a git directory stays writable and:

- every existing entry that is not everyday state (WRITABLE_DIRS, WRITABLE_FILES, pseudorefs,
  lock files) is bound read-only, known or not: an allowlist over what exists;
- every missing dangerous name (fsguard.policy.GIT_DIR_PROTECT) gets a placeholder, so it
  cannot be created: a denylist over what does not exist yet;
- `modules/` and `worktrees/` are read-only as a whole (no new submodule or worktree git
  directory can appear), and each git directory already inside them is bound back writable
  ("reopened") with the same treatment one level down.

Only repositories that exist at plan time are protected: a workspace without `.git` gets no
placeholder, so `git init` and `git clone` keep working (a repository the sandbox creates is
as untrusted as any other file it writes). Reads the filesystem, changes nothing.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import shlex
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fsguard import gitscan
from fsguard.policy import GIT_DIR_PROTECT

#: A missing `commondir` cannot get an empty placeholder: git dies on an empty one ("failed to
#: read .git/commondir"), on the host too while the run lasts. "." names the git directory itself,
#: so the placeholder changes nothing for git, and a planted "../evil" cannot take its place.
COMMONDIR_SELF = ".\n"
#: What placeholders.remove_placeholders may delete besides an empty file: our own placeholder texts.
PLACEHOLDER_TEXTS: tuple[str, ...] = (COMMONDIR_SELF,)

#: Directories of everyday state that commits, branches, merges, fetches, stashes and rebases write.
#: Data only: nothing in them names a program (objects/info/alternates is protected separately).
WRITABLE_DIRS = frozenset({"objects", "refs", "logs", "rebase-merge", "rebase-apply", "sequencer", "rr-cache", "lfs"})
#: Files of everyday state, replaced through a `<name>.lock` created next to them.
WRITABLE_FILES = frozenset({"index", "HEAD", "packed-refs", "shallow", "gc.pid", "gc.log"})
# Patterns below are text, compiled by `re` at first use (and cached there): a workspace without
# a repository never pays for them.
#: Pseudorefs and per-operation state (ORIG_HEAD, FETCH_HEAD, MERGE_MSG, COMMIT_EDITMSG,
#: BISECT_LOG, AUTO_MERGE...), lock files and split-index files: data, written by git itself.
_STATE = r"[A-Z][A-Z0-9_]*\Z|.+\.lock\Z|sharedindex\.[0-9a-f]{40,64}\Z"
#: Entries that hold further git directories: read-only, with the git directories inside reopened.
CONTAINERS = ("modules", "worktrees")
#: In a linked worktree's git directory (it has a `commondir`) git takes config, hooks, info,
#: objects... from the common directory: only these names are read from the worktree's own.
PER_WORKTREE = frozenset({"config.worktree"})
#: A walk of a huge writable root (a home directory) stops here, with a warning.
MAX_SCAN_DIRS = 100_000
#: Where fsguard/gitscan.py remembers walks between runs (the launcher sets a directory in the
#: user's runtime directory, hidden from every sandbox); None: every walk lists every directory.
SCAN_CACHE: str | None = None
_MAX_CONFIG = 256 * 1024
_KNOWN_TOPS = frozenset(rel.rstrip("/").split("/")[0] for rel in GIT_DIR_PROTECT)

#: Config keys whose value is a path git reads config, attributes or hooks from.
_PATH_KEYS = {"include.path": False, "core.hookspath": True, "core.attributesfile": False}
_INCLUDE_IF = r"includeif\..*\.path\Z"
#: Config keys whose value is a command git runs: a program named by path inside a writable
#: root is as dangerous as a hook.
_COMMAND_KEYS = (
    r"(core\.(fsmonitor|sshcommand|editor|pager|askpass)|sequence\.editor|diff\.external|gpg\.(.+\.)?program"
    r"|credential\.(.+\.)?helper|filter\..+\.(clean|smudge|process)|merge\..+\.driver|diff\..+\.(textconv|command)"
    r"|alias\..+|pager\..+|uploadpack\.packobjectshook)\Z"
)
_BOOL = frozenset({"", "true", "false", "yes", "no", "on", "off", "1", "0"})


class GitGuardError(OSError):
    """A repository layout sandgate cannot protect reliably."""


@dataclass
class GitPlan:
    """What gitguard found to protect in the repositories below the writable roots."""

    protect: list[tuple[str, bool]] = field(default_factory=list)  # (path, is_dir): existing or missing
    reopen: list[str] = field(default_factory=list)  # git directories inside a read-only container
    filled: dict[str, str] = field(default_factory=dict)  # placeholder path -> its text
    notes: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def split(
    protect: Iterable[tuple[str, bool]], write: Iterable[str], roots: Iterable[str]
) -> tuple[dict[str, list[tuple[str, bool]]], list[tuple[str, bool]]]:
    """Separate `<root>/.git/<rel>` protections (applied to every git directory found below that
    root) from the rest. `write` and `roots` are the policy's writable paths and their real paths."""
    prefixes: list[tuple[str, str]] = []
    for w, real in zip(write, roots, strict=True):
        if w != "/tmp":
            prefixes += [(posixpath.join(w, ".git") + "/", real), (posixpath.join(real, ".git") + "/", real)]
    names: dict[str, list[tuple[str, bool]]] = {}
    rest: list[tuple[str, bool]] = []
    for path, is_dir in protect:
        hit = next(((p, real) for p, real in prefixes if path.startswith(p)), None)
        if hit is None:
            rest.append((path, is_dir))
        elif (item := (path[len(hit[0]) :], is_dir)) not in names.setdefault(hit[1], []):
            names[hit[1]].append(item)
    return names, rest


def plan(names: dict[str, list[tuple[str, bool]]]) -> GitPlan:
    """Find every repository below the roots in `names` and what to protect in each."""
    out = GitPlan()
    seen: set[str] = set()
    roots = sorted(names, key=len)
    done: list[str] = []
    for root in roots:
        if any(_under(root, d) for d in done):
            continue  # a root inside another: already walked
        done.append(root)
        for kind, path in _discover(root, out.notes):
            if kind == "link":
                raise GitGuardError(
                    errno.ELOOP,
                    f"{path} is a symlink to {os.readlink(path)}; sandgate cannot keep "
                    "it from being replaced: make it a .git file containing 'gitdir: <target>'",
                )
            if kind == "file":
                out.protect.append((path, False))  # the pointer itself: rewritten, it moves git elsewhere
                target = _read_gitfile(path)
                path = os.path.realpath(posixpath.join(posixpath.dirname(path), target)) if target else ""
                if not path or not os.path.isdir(path):
                    continue
            root_of = next((r for r in reversed(roots) if _under(path, r)), None)
            if root_of is not None:  # outside every writable root: Landlock already refuses writes
                _treat(path, names[root_of], out, seen)
    out.reopen = [g for g in sorted(seen) if any(_under(g, c) and g != c for c in out.containers)]
    # A path the config names outside every writable root is already read-only (Landlock), and a
    # placeholder there would change the host outside the workspace.
    out.protect = [(p, d) for p, d in out.protect if any(_under(p, r) for r in roots)]
    return out


def _looks_like_gitdir(entries: dict[str, os.DirEntry[str]]) -> bool:
    """git's own test (setup.c is_git_directory): HEAD, and refs/ and objects/ here or in the
    directory a `commondir` names (a linked worktree's git directory has neither of its own)."""

    def is_dir(n: str) -> bool:
        return n in entries and entries[n].is_dir(follow_symlinks=False)

    return "HEAD" in entries and ("commondir" in entries or (is_dir("refs") and is_dir("objects")))


def _scan(d: str) -> dict[str, os.DirEntry[str]] | None:
    try:
        with os.scandir(d) as it:
            return {e.name: e for e in it}
    except OSError:
        return None


def _discover(root: str, notes: list[str]) -> Iterator[tuple[str, str]]:
    """("dir"|"file"|"link", path) for each git directory, `.git` file and `.git` symlink below root
    (every directory is visited; gitscan lists again only those changed since the last walk)."""
    for found in gitscan.walk(root, _listing, SCAN_CACHE, MAX_SCAN_DIRS):
        if found is None:
            notes.append(
                f"stopped looking for git repositories in {root} after {MAX_SCAN_DIRS} directories; "
                "repositories deeper in it are not protected"
            )
            return
        yield found


def _listing(d: str) -> tuple[bool, list[str], list[tuple[str, str]]] | None:
    """What the walk needs of one directory: is it a git directory, its subdirectories, its `.git` entries."""
    entries = _scan(d)
    if entries is None:
        return None
    if _looks_like_gitdir(entries):  # a bare repository (or the root is a git directory)
        return True, [], []
    subdirs, found = [], []
    for name, e in entries.items():
        if name == ".git":
            kind = "link" if e.is_symlink() else "dir" if e.is_dir(follow_symlinks=False) else "file"
            if kind != "file" or e.is_file(follow_symlinks=False):
                found.append((kind, e.path))
        elif e.is_dir(follow_symlinks=False):
            subdirs.append(e.path)
    return False, subdirs, found


def _read_gitfile(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        first = os.read(fd, 4096).decode(errors="replace").splitlines()[:1]
    finally:
        os.close(fd)
    return first[0][len("gitdir:") :].strip() if first and first[0].startswith("gitdir:") else ""


def _treat(gitdir: str, names: list[tuple[str, bool]], out: GitPlan, seen: set[str]) -> None:
    """Protect one git directory: dangerous or unknown entries read-only, missing dangerous names covered."""
    if gitdir in seen:
        return
    seen.add(gitdir)
    entries = _scan(gitdir)
    if entries is None:
        out.notes.append(f"cannot read the git directory {gitdir}; it is not protected")
        return
    # Our own placeholder (".", another live run's) names this directory itself: not a linked worktree,
    # whose missing names would then go uncovered.
    linked = "commondir" in entries and entries["commondir"].is_file(follow_symlinks=False)
    linked = linked and _read_small(entries["commondir"].path) != COMMONDIR_SELF
    whole = {rel.rstrip("/") for rel, _ in names}
    tops = {rel.split("/")[0] for rel in whole}
    for name, e in sorted(entries.items()):
        path = e.path
        is_dir = e.is_dir(follow_symlinks=False)
        if name in CONTAINERS and name in whole and is_dir:
            out.protect.append((path, True))
            out.containers.append(path)
            for sub in _nested_gitdirs(path):
                _treat(sub, names, out, seen)
        elif name in tops:
            if name in whole:
                out.protect.append((path, is_dir))  # a symlink here is refused by mounts.plan
        elif _writable(name, is_dir) or name in _KNOWN_TOPS:
            continue  # everyday state, or a known name a self-test deliberately left open
        elif e.is_symlink():
            out.notes.append(f"{path} is a symlink; sandgate cannot make it read-only")
        else:
            out.protect.append((path, is_dir))  # unknown to us: read-only, in case git reads it
    for rel, is_dir in names:
        rel = rel.rstrip("/")
        if (linked and rel not in PER_WORKTREE) or rel in entries:
            continue
        out.protect.append((posixpath.join(gitdir, rel), is_dir))
        if rel == "commondir":
            out.filled[posixpath.join(gitdir, rel)] = COMMONDIR_SELF
    out.protect.extend(config_paths(gitdir, entries))


def _read_small(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 64).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _writable(name: str, is_dir: bool) -> bool:
    return (name in WRITABLE_DIRS) if is_dir else (name in WRITABLE_FILES or bool(re.match(_STATE, name)))


def _nested_gitdirs(container: str, depth: int = 0) -> Iterator[str]:
    """Git directories inside modules/ or worktrees/ (a submodule's name may contain '/')."""
    entries = _scan(container)
    if entries is None or depth > 8:
        return
    for e in entries.values():
        if e.is_dir(follow_symlinks=False):
            sub = _scan(e.path)
            if sub is not None and _looks_like_gitdir(sub):
                yield e.path
            elif sub is not None:
                yield from _nested_gitdirs(e.path, depth + 1)


# ---- paths the repository's own config names --------------------------------------------------------


def config_paths(gitdir: str, entries: dict[str, os.DirEntry[str]]) -> list[tuple[str, bool]]:
    """Files and directories the config of `gitdir` reads or runs: included files, core.hooksPath,
    scripts named by command-valued keys. Inside a writable root they are as dangerous as hooks;
    mounts.plan drops those outside every root (Landlock already keeps them read-only)."""
    found: list[tuple[str, bool]] = []
    worktree = posixpath.dirname(gitdir) if posixpath.basename(gitdir) == ".git" else None
    queue = [posixpath.join(gitdir, n) for n in ("config", "config.worktree") if n in entries]
    for key, value in _read_config(queue[0]) if queue else ():
        if key == "core.worktree" and value:  # a submodule's git directory names its checkout
            worktree = posixpath.normpath(posixpath.join(gitdir, value))
    seen: set[str] = set()
    while queue and len(seen) < 16:
        conf = queue.pop()
        if conf in seen:
            continue
        seen.add(conf)
        for key, value in _read_config(conf):
            target = _config_target(key, value, posixpath.dirname(conf), worktree or gitdir)
            if target is not None:
                found.append(target)
                if not target[1] and (key == "include.path" or re.match(_INCLUDE_IF, key)):
                    queue.append(target[0])
    return found


def _config_target(key: str, value: str, confdir: str, base: str) -> tuple[str, bool] | None:
    if key in _PATH_KEYS or re.match(_INCLUDE_IF, key):
        is_dir = _PATH_KEYS.get(key, False)
        relative_to = base if key == "core.hookspath" else confdir
    elif re.match(_COMMAND_KEYS, key) and value.lower() not in _BOOL:
        try:
            words = shlex.split(value.lstrip("!"))
        except ValueError:
            return None
        if not words or "/" not in words[0]:
            return None  # a program found on PATH, not one in the workspace
        value, is_dir, relative_to = words[0], False, base
    else:
        return None
    if not value:
        return None
    path = os.path.expanduser(value) if value.startswith("~") else posixpath.join(relative_to, value)
    return posixpath.normpath(path), is_dir


def _read_config(path: str) -> list[tuple[str, str]]:
    """(section[.subsection].key lower-cased but the subsection, value) pairs of a git config file.

    Enough of git's syntax for the keys above; a file that cannot be read yields nothing.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        text = os.read(fd, _MAX_CONFIG).decode(errors="replace")
    finally:
        os.close(fd)
    pairs: list[tuple[str, str]] = []
    section = ""
    for raw in text.replace("\\\n", "").splitlines():
        line = raw.strip()
        if line.startswith("["):
            head = line[1 : line.find("]")] if "]" in line else line[1:]
            name, _, sub = head.partition(" ")
            section = name.lower() + (f".{sub.strip().strip(chr(34))}" if sub.strip() else "")
            line = line[line.find("]") + 1 :].strip() if "]" in line else ""
        if not line or line[0] in "#;" or not section:
            continue
        key, _, value = line.partition("=")
        pairs.append((f"{section}.{key.strip().lower()}", _unquote(value)))
    return pairs


def _unquote(value: str) -> str:
    out, quoted, i = [], False, 0
    value = value.strip()
    while i < len(value):
        c = value[i]
        if c == '"':
            quoted = not quoted
        elif c == "\\" and i + 1 < len(value):
            i += 1
            out.append({"n": "\n", "t": "\t"}.get(value[i], value[i]))
        elif c in "#;" and not quoted:
            break
        else:
            out.append(c)
        i += 1
    return "".join(out).strip()
