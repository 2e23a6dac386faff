r"""Which folders `sandgate setup` denies the sandbox user so it cannot plant code that sandgate
itself loads (issue 28, r2-ci C3), purely: the plan, the SDDL edit and its undo, the run's checks.

Threat: a folder made under a drive root inherits the root's default "Authenticated Users: Modify"
(`(OI)(CI)(IO)(M)`: `C:\hostedtoolcache\...\Python`, `C:\Python312`, a checkout under `D:\`), and
the sandbox user is an authenticated user. A `.pth`, `sitecustomize.py` or a replaced module it
drops into the interpreter or site-packages sandgate runs from is executed by the next `sandgate`
command as the real (often elevated) user, outside every boundary.

- Each code folder (sys.base_prefix, sys.prefix, every sys.path directory, the Scripts folder)
  gets an explicit deny for the sandbox SID, inherited by files and folders: write, append, write
  EA/attributes, DELETE, FILE_DELETE_CHILD, WRITE_DAC, WRITE_OWNER (acl.DENY_WRITE). Explicit deny
  comes before every allow, so the inherited Modify loses.
- Each ancestor between the drive root and a code folder gets a this-object-only guard (DELETE,
  FILE_DELETE_CHILD, WRITE_DAC, WRITE_OWNER: acl.GUARD_SELF): renaming `...\Python\3.12.8` away and
  copying the tree back under the old name with a `.pth` added needs only DELETE on that ancestor.
- Skipped: folders inside the real user's profile (created with a DACL for SYSTEM, Administrators
  and the user only; the sandbox user cannot even read them), under %SystemRoot% (TrustedInstaller's;
  administrators cannot change the DACL), in a Microsoft Store package (`...\WindowsApps\...`: the
  same, and read-only to every user), and paths not on a drive letter (UNC). Ancestors at or
  above the profile, %ProgramFiles%, %ProgramData% and %SystemRoot% are not guarded: non-admins hold no
  DELETE there (nor FILE_DELETE_CHILD on the drive root above them).
"""

from __future__ import annotations

import ntpath
import re
from dataclasses import dataclass
from typing import Literal

from fsguard.windows import acl, sddl, winpath

Kind = Literal["code", "guard"]
_DRIVE_PATH = re.compile(r"^[A-Za-z]:\\")
#: Store packages: `%ProgramFiles%\WindowsApps\<package>`, or `<drive>:\WindowsApps\<package>` for apps moved to
#: another volume. TrustedInstaller's, read-only to every user: "These types of apps cannot normally write to
#: their installation directory" (learn.microsoft.com/uwp/schemas/appxpackage/uapmanifestschema/
#: element-uap10-installedlocationvirtualization).
_STORE_ON_DRIVE = re.compile(r"^[A-Za-z]:\\WindowsApps(\\|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Edit:
    """One deny ACE on one folder: "code" (inherited below it) or "guard" (that folder only)."""

    path: str
    kind: Kind

    def ace(self, sid: str) -> str:
        if self.kind == "code":
            return f"(D;OICI;{acl.DENY_WRITE:#x};;;{sid})"
        return f"(D;;{acl.GUARD_SELF:#x};;;{sid})"


@dataclass(frozen=True)
class SelfPlan:
    edits: tuple[Edit, ...]  # code folders first, then their ancestors' guards
    skipped: tuple[tuple[str, str], ...]  # (folder, why): said by setup, never silently dropped


def _key(path: str) -> str:
    return winpath.key(path).rstrip("\\")


def within(path: str, root: str) -> bool:
    """`path` is `root` or below it (case-insensitive, as NTFS compares names)."""
    p, r = _key(path), _key(root)
    return p == r or p.startswith(r + "\\")


def _skip(path: str, home: str, windows: tuple[str, ...], store: tuple[str, ...]) -> str | None:
    if not _DRIVE_PATH.match(path):
        return "a network path: not protected, keep sandgate on a local drive"
    if within(path, home):
        return "inside your profile (the sandbox user cannot read it)"
    if any(within(path, w) for w in windows):
        return "inside the Windows folder (administrators cannot change its ACL)"
    if any(within(path, s) for s in store) or _STORE_ON_DRIVE.match(path):
        # r4-setup R1: the Store's Python lives here; setting its ACL fails with error 5 (setup would never finish)
        return "a Microsoft Store package (read-only to every user; administrators cannot change its ACL)"
    return None


def plan(dirs: tuple[str, ...], home: str, system: tuple[str, ...]) -> SelfPlan:
    """`dirs`: the existing code folders (win32selfprotect.sources); `system`: %SystemRoot% first, then
    %ProgramFiles% and %ProgramFiles(x86)%, then optionally %ProgramData% (empty entries ignored): no
    guard at or above any of them (r4-setup R6: a guard on %ProgramData% walks every OS subtree in it)."""
    code: dict[str, str] = {}
    skipped: list[tuple[str, str]] = []
    windows = tuple(s for s in system[:1] if s)
    store = tuple(ntpath.join(s, "WindowsApps") for s in system[1:3] if s)
    for d in dirs:
        path = ntpath.normpath(d)
        if not (_DRIVE_PATH.match(path) or path.startswith("\\\\")):
            continue  # not a Windows path at all (the tests' POSIX interpreter): nothing to deny
        why = _skip(path, home, windows, store)
        if why is not None:
            skipped.append((path, why))
        else:
            code.setdefault(_key(path), path)
    guards: dict[str, str] = {}
    for path in code.values():
        for up in _ancestors(path):
            if not _unguarded(up, home, tuple(s for s in system if s), tuple(code.values())):
                guards.setdefault(_key(up), up)
    edits = [Edit(p, "code") for p in code.values()] + [Edit(p, "guard") for p in guards.values()]
    return SelfPlan(tuple(edits), tuple(dict.fromkeys(skipped)))


def _ancestors(path: str) -> list[str]:
    out, here = [], ntpath.dirname(path)
    while here and ntpath.dirname(here) != here:  # the drive root itself is never edited
        out.append(here)
        here = ntpath.dirname(here)
    return out


def _unguarded(up: str, home: str, system: tuple[str, ...], code: tuple[str, ...]) -> bool:
    """An ancestor the sandbox user cannot rename by default, or one a code folder's inherited deny
    already covers (its DELETE is denied through inheritance)."""
    if within(up, home) or within(home, up):
        return True
    if any(within(up, s) or within(s, up) for s in system):
        return True
    return any(within(up, c) for c in code)


def has(dacl: str, edit: Edit, sid: str) -> bool:
    """Our ACE is in the DACL, by meaning (Windows respells SDDL: sddl.same_ace)."""
    _, aces = sddl.split_dacl(dacl)
    return any(sddl.same_ace(a, edit.ace(sid)) for a in aces)


def applied(dacl: str, edit: Edit, sid: str) -> str:
    return sddl.with_ace(dacl, edit.ace(sid))


def undone(dacl: str, edit: Edit, sid: str) -> str:
    """Exactly our ACE out (by meaning); the sandbox SID's other ACEs and everyone else's kept."""
    head, aces = sddl.split_dacl(dacl)
    return head + "".join(a for a in aces if not sddl.same_ace(a, edit.ace(sid)))


def missing(current: SelfPlan, recorded: tuple[Edit, ...]) -> tuple[Edit, ...]:
    """This interpreter's edits that setup did not record (a venv made after setup): each needs setup."""
    known = {(_key(e.path), e.kind) for e in recorded}
    return tuple(e for e in current.edits if (_key(e.path), e.kind) not in known)


def overlap(roots: tuple[str, ...], code: tuple[str, ...], protected: tuple[Edit, ...]) -> str | None:
    """A writable root of the run that would reach sandgate's own code: the root is a code folder or
    inside one (the run's explicit grant beats the inherited deny), or it contains a code folder that
    carries no deny (a venv under the profile inside the workspace). None: no overlap. A root that
    contains a protected code folder is fine: the folder's explicit deny comes before the grant."""
    denied = {_key(e.path) for e in protected if e.kind == "code"}
    for root in roots:
        for c in code:
            if within(root, c) or (within(c, root) and _key(c) not in denied):
                return f"the run's writable folder {root} holds sandgate's own code ({c})"
    return None


def code_folders(p: SelfPlan) -> tuple[str, ...]:
    """Every code folder on a drive, denied or skipped (the profile's too): what a run's writable
    folders must not reach (overlap)."""
    skipped = tuple(path for path, _ in p.skipped if _DRIVE_PATH.match(path))
    return tuple(e.path for e in p.edits if e.kind == "code") + skipped


def from_record(protected: tuple[tuple[str, str], ...]) -> tuple[Edit, ...]:
    return tuple(Edit(path, "code" if kind == "code" else "guard") for path, kind in protected)


def to_record(edits: tuple[Edit, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((e.path, e.kind) for e in edits)


def merged(old: tuple[Edit, ...], new: tuple[Edit, ...]) -> tuple[Edit, ...]:
    """A second setup from another interpreter keeps the first one's edits (remove takes out both)."""
    seen = {(_key(e.path), e.kind) for e in new}
    return new + tuple(e for e in old if (_key(e.path), e.kind) not in seen)
