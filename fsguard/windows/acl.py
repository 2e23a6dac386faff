"""ACL plans instead of Landlock and bind mounts: what the sandbox user may write, and what never.

Threats answered: a task writing outside its workspace (it gets Modify on the writable roots and
nothing else: a separate user cannot write the real user's profile at all); planting code that
runs later outside the sandbox (`.git` internals, `.vscode/`, `.sandgate*`: explicit deny-write
ACEs, which NTFS evaluates before every inherited allow, and placeholders where they are missing);
reading credentials (deny-read ACEs on the same list as Linux). The lists and their rules are
fsguard's (fsguard/policy.py `effective()`), carried through in mapped form (winpath.py), never
copied. The grant is Modify, never Full Control: FILE_DELETE_CHILD on a parent lets its holder
delete or rename a child whatever the child's own ACL says, which would undo every deny below
("To delete or rename a file, you must have either delete permission on the file, or delete child
permission in the parent directory": https://learn.microsoft.com/en-us/windows/win32/api/fileapi/nf-fileapi-deletefilea).
So that a group's FILE_DELETE_CHILD grant cannot undo them either, and `.git` cannot be renamed
away and recreated with hooks that run as the real user (issue 28 H2), the parents of protected
paths, `.git` itself and every writable root get a "guard" deny for the sandbox SID on that one
object (not inherited: the files below stay writable).
Spellings need no rule of their own: the ACEs sit on the objects, and `.GiT`, the 8.3 alias
`GIT~1`, `.git::$INDEX_ALLOCATION` and `config:stream` all open those same objects
(tests/support/ntfsmodel.py models that, with the Microsoft pages it follows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fsguard import policy as fspolicy
from fsguard.gitguard import COMMONDIR_SELF
from fsguard.windows import winpath

# Access masks (winnt.h): the rights behind Explorer's "Modify" and "Read & execute".
MODIFY = 0x1301BF  # read, write, execute, DELETE of the object; no FILE_DELETE_CHILD, WRITE_DAC, WRITE_OWNER
READ_EXECUTE = 0x1200A9
#: FILE_WRITE_DATA|FILE_APPEND_DATA (= add file / subdirectory on a directory)|FILE_WRITE_EA|
#: FILE_DELETE_CHILD|FILE_WRITE_ATTRIBUTES|DELETE|WRITE_DAC|WRITE_OWNER: no write, create, rename,
#: delete, or re-ACL (alternate data streams are written through FILE_WRITE_DATA too).
DENY_WRITE = 0x000D0156
#: Every deny also names WRITE_DAC|WRITE_OWNER (r2-fixes F1): an allow the sandbox user holds (a
#: CREATOR OWNER ACE inherited on a data volume, an ACE it added while it owned the object) would
#: otherwise let it rewrite the DACL, or take the object back, and drop the deny.
WRITE_DAC_OWNER = 0x000C0000
DENY_READ = 0x00000029 | WRITE_DAC_OWNER  # FILE_READ_DATA (list)|FILE_READ_EA|FILE_EXECUTE (traverse)
FILE_DELETE_CHILD = 0x40
#: On `.git` and every writable root, that object only: no rename or delete of it (DELETE), no
#: removing a protected child through it (FILE_DELETE_CHILD), no re-ACL or ownership change.
#: Not inherited: files and folders below stay writable (git's index, objects, refs).
GUARD_SELF = 0x000D0040
#: On the parent of every protected path, that object only: its children leave only by their own
#: DELETE right, which the protected ones deny.
GUARD_PARENT = FILE_DELETE_CHILD | WRITE_DAC_OWNER
#: On every directory between a writable root and a deeper protected path (`.git\objects`,
#: `.git\objects\info` above `alternates`), that object only: renaming one of them would carry the
#: protected path's deny away and let a new one be made in its place (win-acl A2). The Windows
#: counterpart of fsguard/mounts.py pinning the directories on the way.
GUARD_CHAIN = 0x00010000 | FILE_DELETE_CHILD | WRITE_DAC_OWNER
OICI: Literal["OICI"] = "OICI"  # inherited by files and subdirectories
#: OWNER RIGHTS (S-1-3-4), READ_CONTROL only, inherit-only, on every protected directory (r2-fixes F2):
#: with such an ACE "the access check will use those entries ... to determine the owner's rights"
#: (learn.microsoft.com/previous-versions/windows/it-pro/windows-vista/cc749445(v=ws.10)), so an object
#: below it that the sandbox user made in an earlier run (`pre-commit install`: `.git\hooks\pre-commit`)
#: no longer gives it the owner's implicit WRITE_DAC, which would drop the inherited deny and rewrite the
#: hook. Inherit-only: the directory itself keeps its owner's rights (sandgate's teardown may need them).
OWNER_RIGHTS, READ_CONTROL = "S-1-3-4", 0x00020000


@dataclass(frozen=True)
class Ace:
    kind: Literal["allow", "deny"]
    mask: int
    sid: str
    inherit: Literal["OICI", "OICIIO", ""]

    def sddl(self) -> str:
        return f"({'A' if self.kind == 'allow' else 'D'};{self.inherit};0x{self.mask:x};;;{self.sid})"


@dataclass(frozen=True)
class AclStep:
    path: str  # a Windows path
    ace: Ace
    why: Literal["write", "read", "protect", "read_deny", "guard", "owner"]
    placeholder: bool = False  # create it first (removed at teardown)
    #: the placeholder's kind, from the protected path's definition as on Linux (fsguard's trailing
    #: "/"): `.git\commondir` as a directory breaks every git command, the real user's too (W8)
    kind: Literal["dir", "file"] = "dir"
    text: str = ""  # a file placeholder's content: "." for commondir (git dies on an empty one)


@dataclass(frozen=True)
class AclPlan:
    steps: tuple[AclStep, ...]  # denies first: never a moment with the grant but not the deny
    not_applicable: tuple[str, ...]  # POSIX-only policy paths (/etc/...), skipped: a warning, not a grant


def _mapped(entries: tuple[str, ...]) -> tuple[str, ...]:
    """Drive paths into fsguard's form; `~/`, relative and POSIX entries as they are."""
    return tuple(winpath.to_posix(e) if len(e) > 1 and e[1] == ":" else e for e in entries)


def _under_missing_git(path: str, existing: frozenset[str]) -> bool:
    """`.git/<x>` protections apply only where that git directory exists: no `.git` placeholder is
    ever made (it would turn a plain folder into a broken repository for `git status`). A git
    directory is known by its HEAD, as git's own is_git_directory() knows it: a `.git` FILE (a
    linked worktree's or a submodule's `gitdir:` pointer) has no children to protect or plant."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part.casefold() == ".git" and i < len(parts) - 1:
            return not _is_gitdir("/".join(parts[: i + 1]), existing)
    return False


def _is_gitdir(git: str, existing: frozenset[str]) -> bool:
    return winpath.key(winpath.to_windows(git + "/HEAD")) in existing


def _git_names(eff: fspolicy.Effective) -> list[str]:
    """The `.git` paths above the `.git/<x>` protections (mapped, POSIX form)."""
    out: list[str] = []
    for path, _ in eff.protect:
        parts = path.split("/")
        out += ["/".join(parts[: i + 1]) for i, p in enumerate(parts[:-1]) if p.casefold() == ".git"]
    return list(dict.fromkeys(p for p in out if _is_mapped(p)))


def plan_acls(
    fs: fspolicy.FsPolicy,
    *,
    sid: str,
    cwd: str,
    home: str,
    existing: frozenset[str],
    read_grants: tuple[str, ...] = (),
    extra_protect: tuple[str, ...] = (),
) -> AclPlan:
    """Every ACE for one run. `existing` holds winpath.key() of the paths that exist (the caller
    stats them, see `candidates`: this stays pure); `read_grants` are directories the task must
    read (its toolchain, `toolchain_dirs`), granted where they exist and open nothing denied."""
    eff = _effective(fs, cwd, home, extra_protect)
    skipped = [p for p in (*eff.write, *eff.read_deny, *(p for p, _ in eff.protect)) if not _is_mapped(p)]
    deny_w = _protect_steps(eff, sid, existing)
    deny_r = [
        AclStep(winpath.to_windows(p), Ace("deny", DENY_READ, sid, OICI), "read_deny")
        for p in eff.read_deny
        if _is_mapped(p) and winpath.key(winpath.to_windows(p)) in existing
    ]
    grants = [
        AclStep(winpath.to_windows(p), Ace("allow", MODIFY, sid, OICI), "write") for p in eff.write if _is_mapped(p)
    ]
    reads = [
        AclStep(p, Ace("allow", READ_EXECUTE, sid, OICI), "read") for p in _readable(read_grants, eff, home, existing)
    ]
    guards = _guard_steps(eff, deny_w, sid, existing)
    owner = [  # F2: below a protected directory, no owner's implicit WRITE_DAC (grants nobody anything)
        AclStep(s.path, Ace("allow", READ_CONTROL, OWNER_RIGHTS, "OICIIO"), "owner")
        for s in deny_w
        if s.ace.inherit == OICI
    ]
    return AclPlan(_dedupe([*deny_w, *guards, *deny_r, *owner, *grants, *reads]), tuple(dict.fromkeys(skipped)))


def _protect_steps(eff: fspolicy.Effective, sid: str, existing: frozenset[str]) -> list[AclStep]:
    """Deny-write on every protected path; a missing one gets a placeholder of the kind its
    definition names (a trailing "/" in fsguard's list: is_dir), as fsguard/mounts.py makes them."""
    out: list[AclStep] = []
    for path, is_dir in eff.protect:
        if not _is_mapped(path) or _under_missing_git(path, existing):
            continue
        present = winpath.key(winpath.to_windows(path)) in existing
        if not present and path in eff.existing_only:
            continue  # a default protection in an extra root: protected where it exists, never planted
        ace = Ace("deny", DENY_WRITE, sid, OICI if is_dir else "")  # a file passes nothing on
        kind: Literal["dir", "file"] = "dir" if is_dir else "file"
        text = COMMONDIR_SELF if not is_dir and _is_commondir(path) else ""
        out.append(AclStep(winpath.to_windows(path), ace, "protect", not present, kind, text if not present else ""))
    for git in _git_names(
        eff
    ):  # a `.git` file: rewriting its `gitdir:` line points the real user's git at planted hooks
        if winpath.key(winpath.to_windows(git)) in existing and not _is_gitdir(git, existing):
            out.append(AclStep(winpath.to_windows(git), Ace("deny", DENY_WRITE, sid, ""), "protect"))
    return out


def _is_commondir(path: str) -> bool:
    parts = path.split("/")
    return len(parts) > 1 and parts[-1] == "commondir" and parts[-2].casefold() == ".git"


def _guard_steps(eff: fspolicy.Effective, protect: list[AclStep], sid: str, existing: frozenset[str]) -> list[AclStep]:
    """GUARD_SELF on each writable root and each existing `.git` among the protected paths'
    ancestors; GUARD_PARENT on the parent of each protected path inside a writable root (outside
    them the sandbox user holds no grant of ours, and re-ACLing a profile folder walks all of it);
    GUARD_CHAIN on every directory between that root and the protected path ("to delete or rename
    a file, you must have either delete permission on the file, or delete child permission in the
    parent directory": DeleteFile docs, cited at the top). They exist when the guards are applied:
    present, or made as the placeholder's parents by the protect step before them."""
    roots = [winpath.to_windows(p) for p in eff.write if _is_mapped(p)]
    masks: dict[str, int] = {r: GUARD_SELF for r in roots}
    for step in protect:
        parent = _parent(step.path)
        if parent is not None and any(_within(parent, r) for r in roots):
            masks[parent] = masks.get(parent, 0) | GUARD_PARENT
        root = next((r for r in roots if _within(step.path, r) and not _within(r, step.path)), None)
        for folder in _between(root, step.path) if root is not None else []:
            masks[folder] = masks.get(folder, 0) | GUARD_CHAIN
        for gitdir in _git_ancestors(step.path):
            if winpath.key(gitdir) in existing:
                masks[gitdir] = masks.get(gitdir, 0) | GUARD_SELF
    keyed: dict[str, tuple[str, int]] = {}
    for path, mask in masks.items():  # one ACE per object, whatever the spelling it came by
        old = keyed.get(winpath.key(path), (path, 0))
        keyed[winpath.key(path)] = (old[0], old[1] | mask)
    return [AclStep(p, Ace("deny", m, sid, ""), "guard") for p, m in keyed.values()]


def _parent(path: str) -> str | None:
    head, _, _ = path.rstrip("\\").rpartition("\\")
    return None if not head or head.endswith(":") else head


def _between(root: str, path: str) -> list[str]:
    """The directories strictly between `root` and `path` below it, outermost first."""
    parts = path.rstrip("\\").split("\\")[len(root.rstrip("\\").split("\\")) : -1]
    return ["\\".join([root.rstrip("\\"), *parts[: i + 1]]) for i in range(len(parts))]


def _git_ancestors(path: str) -> list[str]:
    parts = path.split("\\")
    return ["\\".join(parts[: i + 1]) for i, p in enumerate(parts[:-1]) if p.casefold() == ".git"]


def _within(path: str, root: str) -> bool:
    p, r = winpath.key(path).rstrip("\\"), winpath.key(root).rstrip("\\")
    return p == r or p.startswith(r + "\\")


#: Profile folders too broad to open for reading even when PATH names them: they hold browser
#: profiles, tokens and every per-user app's data (AppData) or the whole profile (home).
_BROAD = ("", "AppData", "AppData\\Local", "AppData\\Roaming", "AppData\\LocalLow", "AppData\\Local\\Programs")
#: App Execution Aliases (on every default user PATH): IO_REPARSE_TAG_APPEXECLINK entries that start only for
#: their owner (exesearch.app_alias refuses them), so a grant there buys nothing, and pushing an inheritable
#: ACE onto them is not known to succeed ("The file cannot be accessed by the system": r4-run N2).
_ALIASES = "AppData\\Local\\Microsoft\\WindowsApps"


def toolchain_dirs(environ: Mapping[str, str], home: str) -> tuple[str, ...]:
    """The real user's PATH entries inside their profile (issue 28 M6): per-user toolchains
    (%LOCALAPPDATA%\\Programs\\Python, %APPDATA%\\npm, ~\\.cargo\\bin) that the sandbox user, who
    cannot read that profile, must read to run the command. Entries outside the profile are
    readable by Users already. Only these directories: the folders above them need no grant, since
    every user holds "bypass traverse checking" by default (FILE_TRAVERSE row of
    https://learn.microsoft.com/en-us/windows/win32/fileio/file-access-rights-constants)."""
    value = next((v for k, v in environ.items() if k.casefold() == "path"), "")
    out: list[str] = []
    for entry in value.split(";"):
        try:
            path = winpath.to_windows(winpath.to_posix(entry.strip().strip('"')))
        except winpath.WinPathError:
            continue  # relative, UNC or empty entries: nothing to grant
        broad = any(winpath.key(path) == winpath.key(_join(home, b)) for b in _BROAD)
        if _within(path, home) and not broad and not _within(path, _join(home, _ALIASES)):
            out.append(path)
    return tuple(dict.fromkeys(out))


def _join(home: str, rel: str) -> str:
    return home.rstrip("\\") + ("\\" + rel if rel else "")


def _readable(grants: tuple[str, ...], eff: fspolicy.Effective, home: str, existing: frozenset[str]) -> list[str]:
    """The read grants that exist and open nothing denied: an explicit allow on a folder below a
    deny-read one would win over the deny it inherits (explicit ACEs come first), so a grant at or
    under a denied path, or over one, is dropped; a grant inside a writable root adds nothing."""
    denied = [winpath.to_windows(p) for p in eff.read_deny if _is_mapped(p)]
    roots = [winpath.to_windows(p) for p in eff.write if _is_mapped(p)]
    return [
        g
        for g in grants
        if winpath.key(g) in existing
        and not any(_within(g, d) or _within(d, g) for d in denied)
        and not any(_within(g, r) for r in roots)
        and not _within(home, g)
    ]


def _effective(fs: fspolicy.FsPolicy, cwd: str, home: str, extra_protect: tuple[str, ...]) -> fspolicy.Effective:
    """fsguard's own rules on the mapped paths: the one computation both plan_acls and candidates use."""
    mapped = dataclasses.replace(
        fs,
        write=None if fs.write is None else _mapped(fs.write),
        read_deny=_mapped(fs.read_deny),
        protect=_mapped((*fs.protect, *extra_protect)),
    )
    return fspolicy.effective(mapped, cwd=winpath.to_posix(cwd), home=winpath.to_posix(home))


def candidates(
    fs: fspolicy.FsPolicy,
    *,
    cwd: str,
    home: str,
    extra_protect: tuple[str, ...] = (),
    read_grants: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """Every Windows path whose existence changes the plan (protected and denied paths, the
    `.git` directories above `.git/<x>` protections, the read grants): what the caller stats."""
    eff = _effective(fs, cwd, home, extra_protect)
    gits = [p for g in _git_names(eff) for p in (g, g + "/HEAD")]  # HEAD: a git directory, not a `.git` file
    out = [*gits, *(p for p in (*(p for p, _ in eff.protect), *eff.read_deny) if _is_mapped(p))]
    return tuple(dict.fromkeys([*(winpath.to_windows(p) for p in out), *read_grants]))


def _is_mapped(path: str) -> bool:
    return len(path) >= 3 and path[0] == "/" and path[2] == ":"


def _dedupe(steps: list[AclStep]) -> tuple[AclStep, ...]:
    seen: set[tuple[str, str]] = set()
    out = []
    for s in steps:
        k = (winpath.key(s.path), s.ace.sddl())
        if k not in seen:
            seen.add(k)
            out.append(s)
    return tuple(out)
