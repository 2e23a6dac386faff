"""The workspace's code-running files: git's hooks, config and indirections, and the editor and agent
configs that run code when the user next opens the folder (outside any sandbox)."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
from pathlib import Path

from selftest.probes.core import Ctx, Result, Unsupported, attempt, combine, probe
from selftest.probes.filesystem import git_dir, try_append, unique_tag, write_into
from selftest.probes.syscalls import fresh_libc

GIT_TIMEOUT = 15.0
#: Inside `.git`: through these git finds config, hooks or code elsewhere (v1: commondir).
GIT_TARGETS = (
    "commondir",
    "modules/x/hooks/pre-commit",
    "config.worktree",
    "info/attributes",
    "objects/info/alternates",
)
#: Workspace files an editor or agent runs code from when the user next opens the folder.
TOOL_TARGETS = (".vscode/settings.json", ".envrc", ".mcp.json", ".claude/settings.json")


@probe("filesystem", "git_hooks", "blocked")
def git_hooks(c: Ctx) -> Result:
    """A git hook planted in the workspace runs on the user's next commit, outside any sandbox."""
    return try_append(git_dir() / "hooks" / "pre-commit", b"# " + c.marker, create=True)


@probe("filesystem", "git_config", "blocked")
def git_config(c: Ctx) -> Result:
    """.git/config can name programs git runs (core.fsmonitor, core.sshCommand...)."""
    return try_append(git_dir() / "config", b"# " + c.marker, create=False)


def _rename_and_restore(src: Path, dst: Path) -> Result:
    os.rename(src, dst)
    try:
        return "permitted", f"renamed {src} -> {dst}"
    finally:
        os.rename(dst, src)


@probe("filesystem", "rename_protected", "blocked")
def rename_protected(c: Ctx) -> Result:
    """Renaming a protected directory away and putting a writable one in its place."""
    git = git_dir()
    return combine(
        [
            (".git/hooks", attempt(_rename_and_restore, git / "hooks", git / f"hooks-{c.context}")),
            (".git", attempt(_rename_and_restore, git, Path(f".git-{c.context}"))),
        ],
        need="any",
    )


MS_REMOUNT, MS_BIND = 32, 4096


@probe("filesystem", "remount_rw", "blocked")
def remount_rw(c: Ctx) -> Result:
    """Remounting a read-only protection (.git/hooks) read-write."""
    target = git_dir() / "hooks"
    libc = fresh_libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(None, str(target).encode(), None, MS_REMOUNT | MS_BIND, None) == 0:
        return "permitted", f"remounted {target} read-write"
    err = ctypes.get_errno()
    if err == errno.EINVAL:
        raise Unsupported(f"{target} is not a mount point here (EINVAL)")
    raise OSError(err, os.strerror(err), str(target))


def _commit(c: Ctx) -> Result:
    name = f"verify-commit-{unique_tag(c)}.txt"
    Path(name).write_text(f"committed from {c.mark}\n")
    msg = f"verify commit {c.mark}"
    for args in (["add", "--", name], ["commit", "-q", "-m", msg, "--", name], ["log", "-1", "--format=%s"]):
        r = subprocess.run(
            ["git", "-c", "safe.directory=*", "-c", "commit.gpgsign=false", *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        if r.returncode != 0:
            return "blocked", f"git {args[0]} failed: {(r.stderr or r.stdout).strip()[:200]}"
    if r.stdout.strip() != msg:
        raise Unsupported(f"git log shows {r.stdout.strip()!r}, not our commit")
    return "permitted", f"git add + commit of {name} worked"


@probe("filesystem", "git_commit", "permitted")
def git_commit(c: Ctx) -> Result:
    """Control: `git add` and `git commit` work in the workspace repository despite the .git protection."""
    git_dir()
    return _commit(c)


@probe("filesystem", "git_indirection", "blocked")
def git_indirection(c: Ctx) -> Result:
    """Writing the files through which git finds config, hooks or objects elsewhere (commondir, modules/, config.worktree, info/, alternates)."""
    git, line = git_dir(), b"# " + c.marker
    return combine([(t, attempt(write_into, git / t, line)) for t in GIT_TARGETS], need="any")


@probe("filesystem", "tool_configs", "blocked")
def tool_configs(c: Ctx) -> Result:
    """Editor and agent configs in the workspace (.vscode, .envrc, .mcp.json, .claude) that run code when the user opens it."""
    line = b"// " + c.marker
    return combine([(t, attempt(write_into, Path(t), line)) for t in TOOL_TARGETS], need="any")
