"""The `filesystem:` and `env:` sections: what a task may write, what it must not read, and
which environment variables it never sees.

Pure: values in, immutable plans out; path math only (no stat, no I/O). Defaults are
always on and entries extend them, so forgetting a line never *removes* a protection.
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass
from typing import Any

#: Writable roots when no policy names any: the workspace and a private /tmp.
DEFAULT_WRITE: tuple[str, ...] = (".", "/tmp")
#: Secrets a task could read and send to an allowed host.
DEFAULT_READ_DENY: tuple[str, ...] = ("~/.ssh", "~/.aws", "~/.gnupg", "~/.config/gh", "~/.netrc",
                                      "~/.docker/config.json", "~/.kube")
#: Read-only even inside writable roots: code that runs later outside the sandbox (hooks,
#: git config aliases/fsmonitor) and sandgate's own policy and logs. Trailing "/" = a directory.
DEFAULT_PROTECT: tuple[str, ...] = (".git/hooks/", ".git/config", ".sandgate.yaml", ".sandgate/")
#: Credentials commonly passed in the environment (srt #58: a cluster-admin token passed straight in).
DEFAULT_ENV_DROP: tuple[str, ...] = ("*_TOKEN", "*_SECRET*", "*_PASSWORD*", "AWS_*", "GITHUB_TOKEN", "SSH_AUTH_SOCK")

FS_KEYS = ("write", "read_deny", "protect")
ENV_KEYS = ("drop", "keep")


class FsPolicyError(ValueError):
    """A user mistake in `filesystem:`/`env:`; `line` points at it."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class FsPolicy:
    write: tuple[str, ...] | None = None  # None: no file named any, so DEFAULT_WRITE applies
    read_deny: tuple[str, ...] = ()  # in addition to DEFAULT_READ_DENY
    protect: tuple[str, ...] = ()  # in addition to DEFAULT_PROTECT


@dataclass(frozen=True)
class EnvPolicy:
    drop: tuple[str, ...] = ()  # in addition to DEFAULT_ENV_DROP
    keep: tuple[str, ...] = ()


@dataclass(frozen=True)
class Effective:
    """Absolute, normalised paths for one run."""

    write: tuple[str, ...]
    private_tmp: bool  # /tmp is a writable root: give the sandbox its own, empty /tmp
    read_deny: tuple[str, ...]
    protect: tuple[tuple[str, bool], ...]  # (path, is_dir_hint)


def _line(container: Any, key: Any) -> int | None:
    lines = getattr(container, "lines", None)
    if lines is not None and key in lines:
        return lines[key]
    return getattr(container, "line", None)


def _strings(section: Any, key: str, where: str) -> tuple[str, ...]:
    value = section.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FsPolicyError(f"'{where}.{key}' must be a list of strings", _line(section, key))
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            raise FsPolicyError(f"'{where}.{key}' entries must be non-empty strings, not {item!r}",
                                _line(value, i) or _line(section, key))
    return tuple(value)


def _mapping(section: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(section, dict):
        raise FsPolicyError(f"'{where}' must be a mapping with {', '.join(keys)}", getattr(section, "line", None))
    for key in section:
        if key not in keys:
            raise FsPolicyError(f"unknown key '{where}.{key}' (expected one of: {', '.join(keys)})", _line(section, key))


def parse_filesystem(section: Any) -> FsPolicy:
    if section is None:
        return FsPolicy()
    _mapping(section, FS_KEYS, "filesystem")
    write = _strings(section, "write", "filesystem") if "write" in section else None
    for i, w in enumerate(write or ()):
        check_path(w, _line(section["write"], i), must_not_be_root=True)
    read_deny = _strings(section, "read_deny", "filesystem")
    for i, p in enumerate(read_deny):
        check_path(p, _line(section["read_deny"], i), must_not_be_root=True)
    protect = _strings(section, "protect", "filesystem")
    for i, p in enumerate(protect):
        check_path(p, _line(section["protect"], i), must_not_be_root=True)
    return FsPolicy(write, read_deny, protect)


def check_path(p: str, line: int | None, must_not_be_root: bool = False) -> None:
    if p.startswith("~") and not (p == "~" or p.startswith("~/")):
        raise FsPolicyError(f"'{p}': only '~' (the invoking user's home) is supported, not '~user'", line)
    if ".." in p.split("/"):
        raise FsPolicyError(f"'{p}': '..' is not allowed; write the path it means", line)
    if must_not_be_root and posixpath.normpath(p) == "/":
        raise FsPolicyError(f"'{p}' is the whole filesystem; name the directories instead", line)


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
    )


def merge_env(parts: list[EnvPolicy]) -> EnvPolicy:
    return EnvPolicy(tuple(x for p in parts for x in p.drop), tuple(x for p in parts for x in p.keep))


def _absolute(p: str, cwd: str, home: str) -> str:
    if p == "~" or p.startswith("~/"):
        p = home + p[1:]
    return posixpath.normpath(posixpath.join(cwd, p))


def _dedupe(paths: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


def effective(fs: FsPolicy, *, cwd: str, home: str, extra_write: tuple[str, ...] = (),
              extra_read_deny: tuple[str, ...] = ()) -> Effective:
    """Paths for this run: `~` is the invoking user's home, relative paths are relative to the workspace (cwd)."""
    write = _dedupe([_absolute(p, cwd, home) for p in (*(fs.write if fs.write is not None else DEFAULT_WRITE),
                                                       *extra_write)])
    read_deny = _dedupe([_absolute(p, cwd, home) for p in (*DEFAULT_READ_DENY, *fs.read_deny, *extra_read_deny)])
    protect: list[tuple[str, bool]] = []
    for entry in (*DEFAULT_PROTECT, *fs.protect):
        is_dir = entry.endswith("/")
        if entry.startswith(("/", "~")):
            protect.append((_absolute(entry, cwd, home), is_dir))
            continue
        for root in write:  # a relative protection applies inside every writable root but the private /tmp
            if root != "/tmp":
                protect.append((posixpath.normpath(posixpath.join(root, entry)), is_dir))
    return Effective(write, "/tmp" in write, read_deny, tuple(dict.fromkeys(protect)))


def filter_env(env: dict[str, str], policy: EnvPolicy) -> tuple[dict[str, str], list[str]]:
    """(environment for the task, names dropped). `keep` wins over `drop`; matching is case-sensitive, like the names."""
    drop = (*DEFAULT_ENV_DROP, *policy.drop)
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        if any(fnmatch.fnmatchcase(name, k) for k in policy.keep) or not any(
                fnmatch.fnmatchcase(name, d) for d in drop):
            kept[name] = value
        else:
            dropped.append(name)
    return kept, sorted(dropped)
