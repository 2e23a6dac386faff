"""ACL plans instead of Landlock and bind mounts: what the sandbox user may write, and what never.

Threats answered: a task writing outside its workspace (it gets Modify on the writable roots and
nothing else: a separate user cannot write the real user's profile at all); planting code that
runs later outside the sandbox (`.git` internals, `.vscode/`, `.sandgate*`: explicit deny-write
ACEs, which NTFS evaluates before every inherited allow, and placeholders where they are missing);
reading credentials (deny-read ACEs on the same list as Linux). The lists and their rules are
fsguard's (fsguard/policy.py `effective()`), carried through in mapped form (winpath.py), never
copied. The grant is Modify, never Full Control: FILE_DELETE_CHILD on a parent lets its holder
delete or rename a child whatever the child's own ACL says, which would undo every deny below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from fsguard import policy as fspolicy
from launcher.platform.windows import winpath

# Access masks (winnt.h): the rights behind Explorer's "Modify" and "Read & execute".
MODIFY = 0x1301BF  # read, write, execute, DELETE of the object; no FILE_DELETE_CHILD, WRITE_DAC, WRITE_OWNER
READ_EXECUTE = 0x1200A9
#: FILE_WRITE_DATA|FILE_APPEND_DATA (= add file / subdirectory on a directory)|FILE_WRITE_EA|
#: FILE_DELETE_CHILD|FILE_WRITE_ATTRIBUTES|DELETE|WRITE_DAC|WRITE_OWNER: no write, create, rename,
#: delete, or re-ACL (alternate data streams are written through FILE_WRITE_DATA too).
DENY_WRITE = 0x000D0156
DENY_READ = 0x00000029  # FILE_READ_DATA (list)|FILE_READ_EA|FILE_EXECUTE (traverse)
OICI: Literal["OICI"] = "OICI"  # inherited by files and subdirectories


@dataclass(frozen=True)
class Ace:
    kind: Literal["allow", "deny"]
    mask: int
    sid: str
    inherit: Literal["OICI", ""]

    def sddl(self) -> str:
        return f"({'A' if self.kind == 'allow' else 'D'};{self.inherit};0x{self.mask:x};;;{self.sid})"


@dataclass(frozen=True)
class AclStep:
    path: str  # a Windows path
    ace: Ace
    why: Literal["write", "read", "protect", "read_deny"]
    placeholder: bool = False  # create an empty directory first (removed at teardown)


@dataclass(frozen=True)
class AclPlan:
    steps: tuple[AclStep, ...]  # denies first: never a moment with the grant but not the deny
    not_applicable: tuple[str, ...]  # POSIX-only policy paths (/etc/...), skipped: a warning, not a grant


def _mapped(entries: tuple[str, ...]) -> tuple[str, ...]:
    """Drive paths into fsguard's form; `~/`, relative and POSIX entries as they are."""
    return tuple(winpath.to_posix(e) if len(e) > 1 and e[1] == ":" else e for e in entries)


def _under_missing_git(path: str, existing: frozenset[str]) -> bool:
    """`.git/<x>` protections apply only where that git directory exists: no `.git` placeholder is
    ever made (it would turn a plain folder into a broken repository for `git status`)."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part.casefold() == ".git" and i < len(parts) - 1:
            return winpath.key(winpath.to_windows("/".join(parts[: i + 1]))) not in existing
    return False


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
    read (its toolchain)."""
    eff = _effective(fs, cwd, home, extra_protect)
    skipped = [p for p in (*eff.write, *eff.read_deny, *(p for p, _ in eff.protect)) if not _is_mapped(p)]
    deny_w: list[AclStep] = []
    for path, is_dir in eff.protect:
        if not _is_mapped(path) or _under_missing_git(path, existing):
            continue
        present = winpath.key(winpath.to_windows(path)) in existing
        if not present and path in eff.existing_only:
            continue  # a default protection in an extra root: protected where it exists, never planted
        ace = Ace("deny", DENY_WRITE, sid, OICI if is_dir or not present else "")
        deny_w.append(AclStep(winpath.to_windows(path), ace, "protect", placeholder=not present))
    deny_r = [
        AclStep(winpath.to_windows(p), Ace("deny", DENY_READ, sid, OICI), "read_deny")
        for p in eff.read_deny
        if _is_mapped(p) and winpath.key(winpath.to_windows(p)) in existing
    ]
    grants = [
        AclStep(winpath.to_windows(p), Ace("allow", MODIFY, sid, OICI), "write") for p in eff.write if _is_mapped(p)
    ]
    reads = [AclStep(p, Ace("allow", READ_EXECUTE, sid, OICI), "read") for p in read_grants]
    return AclPlan(_dedupe([*deny_w, *deny_r, *grants, *reads]), tuple(dict.fromkeys(skipped)))


def _effective(fs: fspolicy.FsPolicy, cwd: str, home: str, extra_protect: tuple[str, ...]) -> fspolicy.Effective:
    """fsguard's own rules on the mapped paths: the one computation both plan_acls and candidates use."""
    mapped = dataclasses.replace(
        fs,
        write=None if fs.write is None else _mapped(fs.write),
        read_deny=_mapped(fs.read_deny),
        protect=_mapped((*fs.protect, *extra_protect)),
    )
    return fspolicy.effective(mapped, cwd=winpath.to_posix(cwd), home=winpath.to_posix(home))


def candidates(fs: fspolicy.FsPolicy, *, cwd: str, home: str, extra_protect: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every Windows path whose existence changes the plan (protected and denied paths, and the
    `.git` directories above `.git/<x>` protections): what the caller stats to build `existing`."""
    eff = _effective(fs, cwd, home, extra_protect)
    out: list[str] = []
    for path in (*(p for p, _ in eff.protect), *eff.read_deny):
        if not _is_mapped(path):
            continue
        parts = path.split("/")
        out += ["/".join(parts[: i + 1]) for i, part in enumerate(parts[:-1]) if part.casefold() == ".git"]
        out.append(path)
    return tuple(dict.fromkeys(winpath.to_windows(p) for p in out))


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
