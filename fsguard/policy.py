"""The `filesystem:` and `env:` sections: what a task may write and what it must not read (the
`env:` section is parsed here; which variables it never sees is fsguard/env.py).

Pure: values in, immutable plans out; path math only (no stat, no I/O). Defaults are
always on and entries extend them, so forgetting a line never *removes* a protection.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from fsguard.env import EnvPolicy
from sgbase.policyerror import PolicyError, line_of  # below both guards: neither imports the other

#: Writable roots when no policy names any: the workspace and a private /tmp.
DEFAULT_WRITE: tuple[str, ...] = (".", "/tmp")
#: Secrets a task could read and send to an allowed host (an npm token leaves through the
#: allowed registry itself). Credential files and stores only, not whole tool configurations
#: a build needs (~/.gradle, ~/.m2/settings.xml stay readable); missing ones cost nothing.
DEFAULT_READ_DENY: tuple[str, ...] = (
    # keys and agents' stores
    "~/.ssh",
    "~/.gnupg",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.config/op",
    "~/.config/sops",
    "~/.vault-token",
    # cloud providers
    "~/.aws",
    "~/.config/gcloud",
    "~/.azure",
    "~/.oci",
    "~/.config/doctl",
    "~/.boto",
    "~/.s3cfg",
    "~/.config/rclone",
    "~/.kube",
    "~/.terraform.d/credentials.tfrc.json",
    "~/.terraformrc",
    # git hosts and generic login files
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/git/credentials",
    "~/.config/gh",
    "~/.config/hub",
    "~/.config/glab-cli",
    # package registries (a token here can publish, or leave through the registry)
    "~/.npmrc",
    "~/.yarnrc.yml",
    "~/.pypirc",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.gem/credentials",
    "~/.config/composer/auth.json",
    "~/.composer/auth.json",
    "~/.m2/settings-security.xml",
    "~/.cache/huggingface/token",
    "~/.huggingface/token",
    # container registries
    "~/.docker/config.json",
    "~/.dockercfg",
    "~/.config/containers/auth.json",
    # databases
    "~/.pgpass",
    "~/.my.cnf",
)
#: Names inside a git directory through which git finds config, hooks or a program to run, or
#: is sent elsewhere (issue 10: `echo ../evil > .git/commondir` moved config and hooks out of
#: reach). `.git/<name>` protections apply to EVERY git directory found below a writable root
#: (nested repositories, submodules' modules/<name>/, worktrees/<id>/): fsguard/gitguard.py,
#: which also keeps every other existing non-state entry read-only. Why each: docs/git-protection.md.
GIT_DIR_PROTECT: tuple[str, ...] = (
    "config",
    "config.worktree",
    "commondir",
    "hooks/",
    "info/",
    "modules/",
    "worktrees/",
    "branches/",
    "remotes/",
    "objects/info/alternates",
    "objects/info/http-alternates",
)
#: sandgate's own policy and logs: a workspace must not write the policy the user later trusts.
#: ".sandgate.yaml/" as for the tool files below: a missing policy is held by an empty directory
#: (git, npm pack and a concurrent run's policy lookup do not take it for a file); an existing
#: policy is bound read-only as the file it is.
SANDGATE_PROTECT: tuple[str, ...] = (".sandgate.yaml/", ".sandgate/")
#: Editor and agent configuration that runs code when the user next opens the folder or starts
#: the agent (tasks, hooks, MCP servers, direnv), outside any sandbox. `filesystem.unprotect`
#: may open one of these, and only these. The files (.envrc, .mcp.json) carry a "/" too: when
#: missing they are covered by an empty directory, which git does not see, so a sandboxed
#: `git add -A` cannot commit the placeholder; an existing file is bound read-only as a file.
TOOL_PROTECT: tuple[str, ...] = (
    ".vscode/",
    ".idea/",
    ".envrc/",
    ".mcp.json/",
    ".claude/",
    ".codex/",
    ".cursor/",
    ".devcontainer/",
    ".zed/",
    ".gemini/",
)
#: Read-only even inside writable roots: code that runs later outside the sandbox, and
#: sandgate's own policy and logs. Trailing "/" = a directory.
DEFAULT_PROTECT: tuple[str, ...] = (*(".git/" + n for n in GIT_DIR_PROTECT), *SANDGATE_PROTECT, *TOOL_PROTECT)

FS_KEYS = ("write", "read_deny", "protect", "unprotect")
ENV_KEYS = ("drop", "keep")


@dataclass(frozen=True)
class FsPolicy:
    """The `filesystem:` section as written: what is added to (or opened in) the defaults."""

    write: tuple[str, ...] | None = None  # None: no file named any, so DEFAULT_WRITE applies
    read_deny: tuple[str, ...] = ()  # in addition to DEFAULT_READ_DENY
    protect: tuple[str, ...] = ()  # in addition to DEFAULT_PROTECT
    unprotect: tuple[str, ...] = ()  # TOOL_PROTECT entries to leave writable (normalised, no trailing "/")


@dataclass(frozen=True)
class Effective:
    """Absolute, normalised paths for one run."""

    write: tuple[str, ...]
    private_tmp: bool  # /tmp is a writable root: give the sandbox its own, empty /tmp
    read_deny: tuple[str, ...]
    protect: tuple[tuple[str, bool], ...]  # (path, is_dir_hint)
    # Default protections in writable roots other than the workspace: protected where they exist,
    # never covered by a placeholder (an extra --write root such as ~/.cache/pip must not sprout
    # .vscode/ or .sandgate.yaml while a run lasts: apt and friends warn about strangers in theirs).
    existing_only: frozenset[str] = frozenset()


def _strings(section: Any, key: str, where: str) -> tuple[str, ...]:
    value = section.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PolicyError(f"'{where}.{key}' must be a list of strings", line_of(section, key))
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            raise PolicyError(
                f"'{where}.{key}' entries must be non-empty strings, not {item!r}",
                line_of(value, i) or line_of(section, key),
            )
    return tuple(value)


def _mapping(section: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(section, dict):
        raise PolicyError(f"'{where}' must be a mapping with {', '.join(keys)}", getattr(section, "line", None))
    for key in section:
        if key not in keys:
            raise PolicyError(
                f"unknown key '{where}.{key}' (expected one of: {', '.join(keys)})", line_of(section, key)
            )


def parse_filesystem(section: Any) -> FsPolicy:
    if section is None:
        return FsPolicy()
    _mapping(section, FS_KEYS, "filesystem")
    write = _strings(section, "write", "filesystem") if "write" in section else None
    for i, w in enumerate(write or ()):
        check_path(w, line_of(section["write"], i), must_not_be_root=True)
    read_deny = _strings(section, "read_deny", "filesystem")
    for i, p in enumerate(read_deny):
        check_path(p, line_of(section["read_deny"], i), must_not_be_root=True)
    protect = _strings(section, "protect", "filesystem")
    for i, p in enumerate(protect):
        check_path(p, line_of(section["protect"], i), must_not_be_root=True)
    unprotect = _strings(section, "unprotect", "filesystem")
    opened = tuple(
        check_unprotect(p, line_of(section["unprotect"], i) or line_of(section, "unprotect"))
        for i, p in enumerate(unprotect)
    )
    return FsPolicy(write, read_deny, protect, opened)


def _bare(p: str) -> str:
    return posixpath.normpath(p.removeprefix("./")).rstrip("/")


def check_unprotect(p: str, line: int | None) -> str:
    """The TOOL_PROTECT entry `p` names, normalised. Opening anything else would widen what the
    defaults guarantee: git's indirections and sandgate's own files are never negotiable."""
    check_path(p, line)
    bare = _bare(p)
    parts = [c.lower() for c in bare.split("/")]
    if ".git" in parts or any(c.startswith(".sandgate") for c in parts):
        raise PolicyError(f"'{p}' cannot be unprotected: git's files and sandgate's own stay read-only", line)
    if p.startswith(("/", "~")):
        raise PolicyError(f"'{p}': unprotect takes a default protection's relative name, e.g. '.vscode/'", line)
    if bare not in {_bare(t) for t in TOOL_PROTECT}:
        raise PolicyError(
            f"'{p}' is not a default protection that can be opened "
            f"(one of: {', '.join(_bare(t) for t in TOOL_PROTECT)})",
            line,
        )
    return bare


def check_path(p: str, line: int | None, must_not_be_root: bool = False) -> None:
    if p.startswith("~") and not (p == "~" or p.startswith("~/")):
        raise PolicyError(f"'{p}': only '~' (the invoking user's home) is supported, not '~user'", line)
    if ".." in p.split("/"):
        raise PolicyError(f"'{p}': '..' is not allowed; write the path it means", line)
    if must_not_be_root and posixpath.normpath(p) == "/":
        raise PolicyError(f"'{p}' is the whole filesystem; name the directories instead", line)


def parse_env(section: Any) -> EnvPolicy:
    if section is None:
        return EnvPolicy()
    _mapping(section, ENV_KEYS, "env")
    return EnvPolicy(_strings(section, "drop", "env"), _strings(section, "keep", "env"))


def merge_fs(parts: list[FsPolicy]) -> FsPolicy:
    writes = [p.write for p in parts if p.write is not None]
    return FsPolicy(
        write=tuple(w for ws in writes for w in ws) if writes else None,
        read_deny=tuple(x for p in parts for x in p.read_deny),
        protect=tuple(x for p in parts for x in p.protect),
        unprotect=tuple(x for p in parts for x in p.unprotect),
    )


def merge_env(parts: list[EnvPolicy]) -> EnvPolicy:
    return EnvPolicy(tuple(x for p in parts for x in p.drop), tuple(x for p in parts for x in p.keep))


def _absolute(p: str, cwd: str, home: str) -> str:
    if p == "~" or p.startswith("~/"):
        p = home + p[1:]
    return posixpath.normpath(posixpath.join(cwd, p))


def _dedupe(paths: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


def effective(
    fs: FsPolicy, *, cwd: str, home: str, extra_write: tuple[str, ...] = (), extra_read_deny: tuple[str, ...] = ()
) -> Effective:
    """Paths for this run: `~` is the invoking user's home, relative paths are relative to the workspace (cwd)."""
    write = _dedupe(
        [_absolute(p, cwd, home) for p in (*(fs.write if fs.write is not None else DEFAULT_WRITE), *extra_write)]
    )
    read_deny = _dedupe([_absolute(p, cwd, home) for p in (*DEFAULT_READ_DENY, *fs.read_deny, *extra_read_deny)])
    protect: list[tuple[str, bool]] = []
    existing_only: set[str] = set()
    workspace = _absolute(".", cwd, home)
    defaults = (e for e in DEFAULT_PROTECT if _bare(e) not in fs.unprotect)  # `protect:` entries always stay
    for entry in (*defaults, *fs.protect):
        is_dir = entry.endswith("/")
        if entry.startswith(("/", "~")):
            protect.append((_absolute(entry, cwd, home), is_dir))
            continue
        for root in write:  # a relative protection applies inside every writable root but the private /tmp
            if root != "/tmp":
                path = posixpath.normpath(posixpath.join(root, entry))
                protect.append((path, is_dir))
                if root != workspace and entry not in fs.protect:
                    existing_only.add(path)
    return Effective(write, "/tmp" in write, read_deny, tuple(dict.fromkeys(protect)), frozenset(existing_only))
