"""A model of the NTFS rules the Windows ACL plan relies on, over the fake WinApi's Machine.

Used by tests/support/winfake.py (how Windows writes a DACL back; git's view of the placeholders'
kinds) and by the ACL tests and the verify probe bodies (what the sandbox user can do to the
workspace once the plan is applied). Each rule names the Microsoft page it follows, so that a
plan that relies on something else fails a test here before it fails on a real machine.
"""

from __future__ import annotations

import ntpath
from typing import TYPE_CHECKING

from fsguard.windows import sddl

if TYPE_CHECKING:  # winfake imports this module
    from tests.support.winfake import Machine

# File access rights (https://learn.microsoft.com/en-us/windows/win32/fileio/file-access-rights-constants).
FILE_WRITE_DATA = FILE_ADD_FILE = 0x2
FILE_ADD_SUBDIRECTORY = 0x4
FILE_DELETE_CHILD = 0x40
DELETE = 0x10000
WRITE_DAC = 0x40000
WRITE_OWNER = 0x80000
READ_CONTROL = 0x20000
OWNER_RIGHTS = "S-1-3-4"
_GENERIC = {0x10000000: 0x1F01FF, 0x80000000: 0x120089, 0x40000000: 0x120116, 0x20000000: 0x1200A0}
#: The groups in a standard local user's token besides its own SID: Everyone, Authenticated Users, Users.
GROUPS = ("S-1-1-0", "S-1-5-11", "S-1-5-32-545")

#: ConvertSecurityDescriptorToStringSecurityDescriptor writes these masks by their SDDL names
#: (https://learn.microsoft.com/en-us/windows/win32/secauthz/ace-strings), every other as hex.
_NAMED = {0x1F01FF: "FA", 0x120089: "FR", 0x120116: "FW", 0x1200A0: "FX", 0x10000: "SD", 0x20000: "RC"}
_NAMED |= {0x40000: "WD", 0x80000: "WO", 0x10000000: "GA", 0x80000000: "GR", 0x40000000: "GW", 0x20000000: "GX"}
_ALIAS = {v: k for k, v in sddl.SID_ALIASES.items()}


def windows_spelling(text: str) -> str:
    """The DACL as Windows reads it back after SetNamedSecurityInfo: the binary ACL rewritten in
    Windows' own SDDL (named rights, SID aliases, flags in its order) with SE_DACL_AUTO_INHERITED
    ("AI") set, which SetNamedSecurityInfo does for every DACL it propagates
    (https://learn.microsoft.com/en-us/windows/win32/api/aclapi/nf-aclapi-setnamedsecurityinfow)."""
    head, aces = sddl.split_dacl(text)
    if "NO_ACCESS_CONTROL" in head:
        return head
    flags = "P" if "P" in head[2:] else ""
    out = "D:" + flags + "AI"
    for ace in aces:
        p = sddl.parse_ace(ace)
        f = "".join(x for x in sddl.ACE_FLAGS if x in p.flags)
        mask = _NAMED.get(p.mask, f"0x{p.mask:x}")
        cond = f";{p.condition}" if p.condition else ""
        out += f"({p.kind};{f};{mask};{p.object_guid};{p.inherit_guid};{_ALIAS.get(p.sid, p.sid)}{cond})"
    return out


#: What git expects each name in a git directory to be (https://git-scm.com/docs/gitrepository-layout):
#: the kind a placeholder must keep, or git fails for everyone while the run lasts (issue 28 W8).
GIT_FILES = ("config", "config.worktree", "commondir", "objects\\info\\alternates", "objects\\info\\http-alternates")
GIT_DIRS = ("hooks", "info", "modules", "worktrees", "branches", "remotes", "objects", "refs", "objects\\info")


def git_layout_errors(files: dict[str, bytes], dirs: set[str]) -> list[str]:
    """What would make git refuse a repository of this machine: a git file made a directory, a git
    directory made a file, an empty `commondir` ("failed to read .git/commondir")."""
    errors = []
    for gitdir in (d for d in dirs if ntpath.basename(d).casefold() == ".git"):
        for rel in GIT_FILES:
            if _has(dirs, gitdir + "\\" + rel):
                errors.append(f"{gitdir}\\{rel} is a directory; git reads it as a file")
        for rel in GIT_DIRS:
            if _has(files, gitdir + "\\" + rel):
                errors.append(f"{gitdir}\\{rel} is a file; git reads it as a directory")
        common = next((v for k, v in files.items() if k.casefold() == (gitdir + "\\commondir").casefold()), None)
        if common is not None and not common.strip():
            errors.append(f"{gitdir}\\commondir is empty; git dies on it")
    return errors


def _has(where: set[str] | dict[str, bytes], path: str) -> bool:
    return any(p.casefold() == path.casefold() for p in where)


class Denied(PermissionError):
    pass


class Ntfs:
    """The sandbox user's view of the fake machine: names resolved as NTFS does, rights checked as
    the DACLs say. `short_names`: whether the volume makes 8.3 aliases (the default on C:)."""

    def __init__(self, machine: Machine, sid: str, *, short_names: bool = True) -> None:
        self.m = machine
        self.token = (sid, *GROUPS)
        self.short_names = short_names

    # names (https://learn.microsoft.com/en-us/windows/win32/fileio/naming-a-file: names compare
    # case-insensitively; an 8.3 alias names the same file:
    # https://learn.microsoft.com/en-us/openspecs/windows_protocols/ms-fscc/cb90d9e0-695d-4418-8d89-a29e2ba9faf8)
    def _children(self, folder: str) -> list[str]:
        m = self.m
        every = {*m.dirs, *m.files, *m.dacls}  # the fake's files may have only a DACL
        return sorted(p for p in every if ntpath.dirname(p).casefold() == folder.casefold() and p != folder)

    def short_alias(self, path: str) -> str | None:
        """GetShortPathName's answer for the last component: BASE~N(.EXT); None when the name is
        8.3 already or the volume makes no aliases."""
        name = ntpath.basename(path)
        if not self.short_names or _is_83(name):
            return None
        stem, ext = _split83(name)
        siblings = [c for c in self._children(ntpath.dirname(path)) if c != path and not _is_83(ntpath.basename(c))]
        n = 1 + sum(1 for c in siblings if _split83(ntpath.basename(c))[0] == stem and c.casefold() < path.casefold())
        return f"{stem}~{n}" + (f".{ext}" if ext else "")

    def resolve(self, path: str) -> tuple[str, str]:
        """(the object's stored path or the path it would get, the stream: "" default, ":$I30" the
        directory itself, else a named data stream). A component `x::$INDEX_ALLOCATION` is the
        directory x (https://learn.microsoft.com/en-us/openspecs/windows_protocols/ms-fscc/c54dec26-1551-4d3a-a0ea-4fa40f848eb3);
        `file:name` is a named stream of file (https://learn.microsoft.com/windows/win32/fileio/file-streams)."""
        drive, rest = ntpath.splitdrive(path)
        cur, stream = drive + "\\", ""
        parts = [p for p in rest.split("\\") if p]
        for i, raw in enumerate(parts):
            name, _, st = raw.partition(":")
            st_type = st.rpartition(":")[2].upper() if ":" in st else ("" if not st else "$DATA")
            if st_type == "$INDEX_ALLOCATION" or st.upper() in ("$I30", "$I30:$INDEX_ALLOCATION"):
                st = "$I30"
            elif st_type == "$DATA" and st.partition(":")[0] == "":
                st = ""  # file::$DATA is the default stream
            else:
                st = st.partition(":")[0]
            if i < len(parts) - 1 and st not in ("", "$I30"):
                raise FileNotFoundError(path)  # a stream is no folder to go through
            cur = self._child(cur, name)
            stream = st
        return cur, stream

    def _child(self, folder: str, name: str) -> str:
        for child in self._children(folder):
            base = ntpath.basename(child)
            if base.casefold() == name.casefold() or self.short_alias(child) == name.upper():
                return child
        return ntpath.join(folder, name)

    def _exists(self, path: str) -> bool:
        m = self.m
        return path in m.dirs or path in m.files or path in m.dacls

    def _is_dir(self, path: str) -> bool:
        return path in self.m.dirs

    # rights (https://learn.microsoft.com/en-us/windows/win32/secauthz/how-dacls-control-access-to-an-object:
    # ACEs in order, the first deny naming a requested right refuses, allows add up)
    def _aces(self, path: str) -> list[sddl.ParsedAce]:
        """The ACEs that apply to `path`, in evaluation order: its explicit ones (not inherit-only),
        then those its ancestors pass down (CI to folders, OI to files; NP stops after one level),
        nearest first (https://learn.microsoft.com/en-us/windows/win32/secauthz/ace-inheritance-rules)."""
        dacls = self.m.dacls
        own = [sddl.parse_ace(a) for a in sddl.split_dacl(dacls.get(path, "D:"))[1]]
        out = [a for a in own if "ID" not in a.flags and "IO" not in a.flags]
        want, cur, first = "CI" if self._is_dir(path) else "OI", path, True
        while ntpath.dirname(cur) != cur:
            cur = ntpath.dirname(cur)
            for a in (sddl.parse_ace(t) for t in sddl.split_dacl(dacls.get(cur, "D:"))[1]):
                if "ID" not in a.flags and want in a.flags and (first or "NP" not in a.flags):
                    out.append(a)
            first = False
        return out + [a for a in own if "ID" in a.flags]

    def allowed(self, path: str, want: int) -> bool:
        left = want
        aces = self._aces(path)
        if self.m.owners.get(path) in self.token and not any(a.sid == OWNER_RIGHTS for a in aces):
            # "An object's owner implicitly has WRITE_DAC access to the object" (with READ_CONTROL),
            # granted before the DACL is read, so no deny ACE takes it back; an OWNER RIGHTS ACE
            # replaces it (https://learn.microsoft.com/en-us/windows/win32/secauthz/owner-of-a-new-object,
            # MS-DTYP 2.5.3.2 https://learn.microsoft.com/en-us/openspecs/windows_protocols/ms-dtyp/4f1bbcbb-814a-4c70-a11e-2a5b8779a6f9)
            left &= ~(READ_CONTROL | WRITE_DAC)
            if not left:
                return True
        for a in aces:
            if a.sid not in self.token:
                continue
            mask = a.mask
            for g, m in _GENERIC.items():
                mask = (mask & ~g) | m if mask & g else mask
            if a.kind in ("D", "XD", "OD") and mask & left:
                return False
            if a.kind in ("A", "XA", "OA"):
                left &= ~mask
            if not left:
                return True
        return False

    def _may_delete(self, path: str) -> bool:
        """DELETE on the object, or FILE_DELETE_CHILD on its parent: either suffices
        (https://learn.microsoft.com/en-us/windows/win32/api/fileapi/nf-fileapi-deletefilea)."""
        return self.allowed(path, DELETE) or self.allowed(ntpath.dirname(path), FILE_DELETE_CHILD)

    # operations, each raising as the Win32 call would
    def write(self, path: str, data: bytes) -> None:
        obj, stream = self.resolve(path)
        if self._exists(obj):
            if self._is_dir(obj) and stream in ("", "$I30"):
                raise IsADirectoryError(path)
            if not self.allowed(obj, FILE_WRITE_DATA):  # streams share their file's security
                raise Denied(path)
            if not stream:
                self.m.files[obj] = data
            return
        if stream == "$I30":
            return self.mkdir(path)
        self._create(obj, FILE_ADD_FILE)
        self.m.files[obj] = data

    def mkdir(self, path: str) -> None:
        obj, _ = self.resolve(path)
        if self._exists(obj):
            raise FileExistsError(path)
        self._create(obj, FILE_ADD_SUBDIRECTORY)
        self.m.dirs.add(obj)

    def _create(self, obj: str, right: int) -> None:
        parent = ntpath.dirname(obj)
        if not self._is_dir(parent):
            raise FileNotFoundError(obj)
        if not self.allowed(parent, right):
            raise Denied(obj)
        self.m.dacls[obj] = "D:AI"  # inherits the rest
        self.m.owners[obj] = self.token[0]  # "the default owner SID from the ... token of the creating process"

    def set_dacl(self, path: str, text: str) -> None:
        """SetNamedSecurityInfo(DACL_SECURITY_INFORMATION) as this user: WRITE_DAC, or the owner's."""
        obj, _ = self.resolve(path)
        if not self._exists(obj):
            raise FileNotFoundError(path)
        if not self.allowed(obj, WRITE_DAC):
            raise Denied(path)
        self.m.dacls[obj] = text

    def set_owner(self, path: str) -> None:
        """SetNamedSecurityInfo(OWNER_SECURITY_INFORMATION) with this user's own SID: "To set the owner,
        the caller must have WRITE_OWNER access to the object" and without SeRestorePrivilege the SID
        "must be contained in the caller's token" (learn.microsoft.com/windows/win32/api/aclapi/nf-aclapi-setnamedsecurityinfow)."""
        obj, _ = self.resolve(path)
        if not self._exists(obj):
            raise FileNotFoundError(path)
        if not self.allowed(obj, WRITE_OWNER):
            raise Denied(path)
        self.m.owners[obj] = self.token[0]

    def delete(self, path: str) -> None:
        """DeleteFile / RemoveDirectory: the object's DELETE or its parent's FILE_DELETE_CHILD."""
        obj, stream = self.resolve(path)
        if not self._exists(obj) or stream not in ("", "$I30"):
            raise FileNotFoundError(path)
        if self._is_dir(obj) and self._children(obj):
            raise OSError(145, "directory not empty", path)
        if not self._may_delete(obj):
            raise Denied(path)
        self.m.dirs.discard(obj)
        self.m.files.pop(obj, None)
        self.m.dacls.pop(obj, None)

    def rename(self, src: str, dst: str) -> None:
        """MoveFileEx without replace: the source leaves its parent, the target is created."""
        s, s_stream = self.resolve(src)
        d, _ = self.resolve(dst)
        if not self._exists(s) or s_stream not in ("", "$I30"):
            raise FileNotFoundError(src)
        if self._exists(d):
            raise FileExistsError(dst)
        if not self._may_delete(s):
            raise Denied(src)
        if not self.allowed(ntpath.dirname(d), FILE_ADD_SUBDIRECTORY if self._is_dir(s) else FILE_ADD_FILE):
            raise Denied(dst)
        m = self.m

        def moved(p: str) -> str:
            return d + p[len(s) :] if p == s or p.startswith(s + "\\") else p

        m.dirs = {moved(p) for p in m.dirs}
        m.files = {moved(p): v for p, v in m.files.items()}
        m.dacls = {moved(p): v for p, v in m.dacls.items()}
        m.owners = {moved(p): v for p, v in m.owners.items()}


def _is_83(name: str) -> bool:
    base, _, ext = name.partition(".")
    return name == name.upper() and 0 < len(base) <= 8 and len(ext) <= 3 and "." not in ext and base.isalnum()


def _split83(name: str) -> tuple[str, str]:
    bare = name.lstrip(".")
    base, dot, ext = bare.rpartition(".")
    if not dot:
        base, ext = bare, ""
    return "".join(c for c in base.upper() if c.isalnum())[:6], "".join(c for c in ext.upper() if c.isalnum())[:3]


class ModelFsOps:
    """aclprobes.FsOps over the model: the probe bodies run as the sandbox user would run them."""

    def __init__(self, ntfs: Ntfs) -> None:
        self.ntfs = ntfs

    def read(self, path: str) -> bytes:
        obj, stream = self.ntfs.resolve(path)
        if not self.ntfs._exists(obj):
            raise FileNotFoundError(path)
        if self.ntfs._is_dir(obj):
            raise IsADirectoryError(path)
        if not self.ntfs.allowed(obj, 0x1):  # FILE_READ_DATA; a stream shares its file's security
            raise Denied(path)
        return b"" if stream else self.ntfs.m.files.get(obj, b"")

    def write(self, path: str, data: bytes) -> None:
        self.ntfs.write(path, data)

    def mkdir(self, path: str) -> None:
        self.ntfs.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        self.ntfs.rename(src, dst)

    def delete(self, path: str) -> None:
        self.ntfs.delete(path)

    def short_alias(self, path: str) -> str | None:
        obj, _ = self.ntfs.resolve(path)
        return self.ntfs.short_alias(obj) if self.ntfs._exists(obj) else None

    def is_dir(self, path: str) -> bool:
        obj, stream = self.ntfs.resolve(path)
        return self.ntfs._is_dir(obj) and stream in ("", "$I30")


def acl_probe_result(machine: Machine, user_sid: str, argv: tuple[str, ...], cwd: str) -> dict[str, object] | None:
    """What probeacl's script writes when it runs as the sandbox user on this machine: the same
    aclprobes bodies, over this model instead of Win32. None: not an ACL probe."""
    from selftest.windows import aclprobes, probeacl

    if not argv or argv[-1] not in probeacl.NAMES:
        return None
    ops = ModelFsOps(Ntfs(machine, user_sid))
    got = [r for r in aclprobes.probe_all(cwd, ops) if r.name in (argv[-1], "acl_probes")]
    return {"probes": [{"name": r.name, "ok": r.ok, "lines": r.lines} for r in got]}
