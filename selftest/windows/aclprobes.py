r"""`sandgate verify`'s Windows probe bodies for the ACL boundary: `.git` rename, alternate data
streams, case variants, 8.3 short names (issue 28 H2; Codex's smoke list).

Each probe runs INSIDE the sandbox (as the sandbox user, in the workspace) and pairs the attacks
with the matching permitted action, so a probe that passes proves the refusal came from the
protection and not from a workspace nobody can write. An attack passes only when Windows says
access denied (PermissionError whose Win32 code, where kept, is 5), or refuses the spelling as a
name (ERROR_INVALID_NAME: then that spelling cannot get through either); any other failure is
inconclusive (a sharing violation too), and an attack that works
is undone at once and reported. The threat each answers: code planted where the real user's git
or editor runs it later, through a spelling the ACL plan did not name: `.git` renamed away and a
new one made with hooks; `config:stream`, `.git::$INDEX_ALLOCATION`; `.GiT\HOOKS`; `GIT~1`.
The file operations go through `FsOps` (the real one: win32probefs.py), so the same bodies run on
Linux against the tests' NTFS model of the applied plan (tests/support/ntfsmodel.py).
"""

from __future__ import annotations

import ntpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

#: Windows' "The filename, directory name, or volume label syntax is incorrect".
ERROR_INVALID_NAME = 123
ERROR_ACCESS_DENIED = 5
PROBE = "sandgate-probe"


class FsOps(Protocol):
    """The file operations a probe takes, each raising OSError as the Win32 call fails."""

    def read(self, path: str) -> bytes: ...
    def write(self, path: str, data: bytes) -> None: ...
    def mkdir(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def delete(self, path: str) -> None: ...
    def short_alias(self, path: str) -> str | None: ...  # the 8.3 name of the last component, or None
    def is_dir(self, path: str) -> bool: ...


@dataclass(frozen=True)
class Check:
    label: str
    expect: Literal["blocked", "allowed"]
    action: Callable[[FsOps], None]
    undo: Callable[[FsOps], None] | None = None  # taken back if an attack worked (or after an allowed one)


@dataclass
class ProbeResult:
    name: str
    ok: bool
    lines: list[str] = field(default_factory=list)


def _write(path: str) -> Callable[[FsOps], None]:
    return lambda fs: fs.write(path, b"sandgate probe\n")


def _rename(src: str, dst: str) -> Callable[[FsOps], None]:
    return lambda fs: fs.rename(src, dst)


def _mkdir(path: str) -> Callable[[FsOps], None]:
    return lambda fs: fs.mkdir(path)


def _delete(path: str) -> Callable[[FsOps], None]:
    return lambda fs: fs.delete(path)


def _cleanup(*paths: str) -> Callable[[FsOps], None]:
    """Undo for a permitted write: each spelling deleted if it is (still) there."""

    def undo(fs: FsOps) -> None:
        for path in paths:
            try:
                fs.delete(path)
            except FileNotFoundError:
                pass

    return undo


def _made(path: str) -> Callable[[FsOps], None]:
    """Undo for a write or mkdir: the name without any stream suffix, deleted."""
    head, tail = ntpath.split(path)
    return _delete(ntpath.join(head, tail.split(":")[0]))


def _overwrite(path: str) -> tuple[Callable[[FsOps], None], Callable[[FsOps], None]]:
    """An attack that rewrites an existing protected file, and the undo that puts its bytes back. On NTFS
    `.GIT\\Config` and `GIT~1\\config` ARE `.git\\config` (names compare case-insensitively, an alias names
    the same file): an attack that works must leave the repository's config as it found it."""
    saved: list[bytes | None] = []

    def attack(fs: FsOps) -> None:
        try:
            saved.append(fs.read(path))
        except FileNotFoundError:
            saved.append(None)  # the write would make it: the undo deletes it
        except OSError:
            pass  # unreadable: the write is still the attack; the undo then says it cannot restore
        fs.write(path, b"sandgate probe\n")

    def undo(fs: FsOps) -> None:
        if not saved:
            raise OSError(f"{path} was not readable before: its old contents are unknown")
        if saved[0] is None:
            fs.delete(path)
        else:
            fs.write(path, saved[0])

    return attack, undo


def _back(ws: str) -> Callable[[FsOps], None]:
    """Undo for a `.git` that got renamed away: put it back at once."""
    return _rename(ntpath.join(ws, f"{PROBE}-git"), ntpath.join(ws, ".git"))


def git_rename(ws: str) -> list[Check]:
    git, a, b = ntpath.join(ws, ".git"), ntpath.join(ws, f"{PROBE}-a.txt"), ntpath.join(ws, f"{PROBE}-b.txt")
    away = ntpath.join(ws, f"{PROBE}-git")
    return [
        Check("write a workspace file", "allowed", _write(a)),
        Check("rename a workspace file", "allowed", _rename(a, b), _delete(b)),
        Check("rename .git away", "blocked", _rename(git, away), _back(ws)),
        Check(
            "rename .git\\hooks inside .git",
            "blocked",
            _rename(ntpath.join(git, "hooks"), ntpath.join(git, f"{PROBE}-hooks")),
            _rename(ntpath.join(git, f"{PROBE}-hooks"), ntpath.join(git, "hooks")),
        ),
    ]


def alternate_data_stream(ws: str) -> list[Check]:
    git, a = ntpath.join(ws, ".git"), ntpath.join(ws, f"{PROBE}-a.txt")
    away = ntpath.join(ws, f"{PROBE}-git")
    hook_dir = ntpath.join(git, "hooks", f"{PROBE}::$INDEX_ALLOCATION")
    return [
        Check("write a stream of a workspace file", "allowed", _write(a + f":{PROBE}"), _cleanup(a + f":{PROBE}", a)),
        Check("write .git\\config:stream", "blocked", _write(ntpath.join(git, f"config:{PROBE}"))),
        Check("write .git\\hooks:stream", "blocked", _write(ntpath.join(git, f"hooks:{PROBE}"))),
        Check("mkdir in hooks as name::$INDEX_ALLOCATION", "blocked", _mkdir(hook_dir), _made(hook_dir)),
        Check("rename .git::$INDEX_ALLOCATION away", "blocked", _rename(git + "::$INDEX_ALLOCATION", away), _back(ws)),
    ]


def case_variant(ws: str) -> list[Check]:
    a = ntpath.join(ws, f"{PROBE}-a.txt")
    hook = ntpath.join(ws, ".GiT", "HOOKS", f"{PROBE}-pre-commit")
    upper = ntpath.join(ws, f"{PROBE}-A.TXT".upper())
    return [
        Check("write a workspace file", "allowed", _write(a)),
        Check("write it in upper case", "allowed", _write(upper), _cleanup(upper, a)),
        Check("write .GiT\\HOOKS\\<new hook>", "blocked", _write(hook), _made(hook)),
        Check("write .GIT\\Config", "blocked", *_overwrite(ntpath.join(ws, ".GIT", "Config"))),
        Check(
            "rename .GiT away", "blocked", _rename(ntpath.join(ws, ".GiT"), ntpath.join(ws, f"{PROBE}-git")), _back(ws)
        ),
    ]


def short_name(ws: str, fs: FsOps) -> list[Check] | None:
    """Through the 8.3 aliases the volume made; None: it makes none (8.3 names off), nothing to probe."""
    long = ntpath.join(ws, f"{PROBE}-long-name.txt")
    fs.write(long, b"")
    alias, git_alias = fs.short_alias(long), fs.short_alias(ntpath.join(ws, ".git"))
    fs.delete(long)
    if alias is None or git_alias is None:
        return None
    git = ntpath.join(ws, git_alias)
    hook = ntpath.join(git, "hooks", f"{PROBE}-pre-commit")
    return [
        Check("write a workspace file", "allowed", _write(long)),
        Check(f"write it as {alias}", "allowed", _write(ntpath.join(ws, alias)), _delete(long)),
        Check(f"write {git_alias}\\hooks\\<new hook>", "blocked", _write(hook), _made(hook)),
        Check(f"write {git_alias}\\config", "blocked", *_overwrite(ntpath.join(git, "config"))),
        Check(f"rename {git_alias} away", "blocked", _rename(git, ntpath.join(ws, f"{PROBE}-git")), _back(ws)),
    ]


def run(name: str, checks: list[Check], fs: FsOps) -> ProbeResult:
    """Every check in order; the result passes only if each did what it expects."""
    result = ProbeResult(name, True)
    for check in checks:
        ok, line = _one(check, fs)
        result.ok &= ok
        result.lines.append(f"{'ok' if ok else 'FAIL'}: {check.label}: {line}")
    return result


def _one(check: Check, fs: FsOps) -> tuple[bool, str]:
    try:
        check.action(fs)
    except PermissionError as e:
        # CPython maps ERROR_SHARING_VIOLATION (32) and ERROR_LOCK_VIOLATION (33) to PermissionError
        # too: a handle open elsewhere, not the ACL. Calls that keep the Win32 code (os.rename, mkdir,
        # remove) must say 5; open() goes through the CRT, which keeps none (winerror None).
        if getattr(e, "winerror", None) in (None, ERROR_ACCESS_DENIED):
            return check.expect == "blocked", "access denied"
        return False, f"failed for another reason ({type(e).__name__}: {e})"
    except OSError as e:
        if check.expect == "blocked" and getattr(e, "winerror", None) == ERROR_INVALID_NAME:
            return True, "the spelling is not a valid name here"
        return False, f"failed for another reason ({type(e).__name__}: {e})"
    undone = ""
    if check.undo is not None:
        try:
            check.undo(fs)
        except OSError as e:
            undone = f"; could not undo it ({e}): restore it by hand"
    return check.expect == "allowed", ("done" if check.expect == "allowed" else "IT WORKED") + undone


def probe_all(ws: str, fs: FsOps) -> list[ProbeResult]:
    """The four ACL probes of `sandgate verify` on Windows, in the workspace `ws`."""
    if not fs.is_dir(ntpath.join(ws, ".git")):
        return [ProbeResult("acl_probes", False, [f"{ws} has no .git: run verify in a git repository"])]
    out = [
        run("git_rename", git_rename(ws), fs),
        run("alternate_data_stream", alternate_data_stream(ws), fs),
        run("case_variant", case_variant(ws), fs),
    ]
    try:
        short = short_name(ws, fs)
    except OSError as e:  # the workspace not writable, or no answer about aliases: proves nothing
        return [*out, ProbeResult("short_name", False, [f"FAIL: cannot look for 8.3 names in {ws} ({e})"])]
    if short is None:
        return [*out, ProbeResult("short_name", True, ["no 8.3 aliases here"])]
    return [*out, run("short_name", short, fs)]
