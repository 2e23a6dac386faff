"""Reads policy files: YAML with line numbers, `include:` of bundled lists and paths.

No enforcement here: each section goes to the guard that owns it (`network:` to
netguard.policy). Every user mistake becomes a PolicyFileError naming FILE:LINE.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsguard import policy as fspolicy
from netguard import policy as netpolicy

ALLOWLIST_DIR = Path(__file__).resolve().parent.parent / "allowlists"
TOP_KEYS = ("version", "description", "include", "network", "filesystem", "env")
MAX_INCLUDE_DEPTH = 16


class PolicyFileError(Exception):
    """A policy mistake, already phrased for the one-line `sandgate: error:` message."""

    def __init__(self, where: str, line: int | None, message: str) -> None:
        self.where, self.line, self.message = where, line, message
        super().__init__(f"{where}:{line}: {message}" if line else f"{where}: {message}")


@dataclass(frozen=True)
class Policy:
    """The effective policy of one run, merged from every file, include and command-line entry."""

    network: netpolicy.NetworkPolicy
    sources: tuple[str, ...]
    filesystem: fspolicy.FsPolicy = fspolicy.FsPolicy()
    env: fspolicy.EnvPolicy = fspolicy.EnvPolicy()


@dataclass(frozen=True)
class _Sections:
    """One file's sections, each parsed by the guard that owns it."""

    network: netpolicy.NetworkPolicy
    filesystem: fspolicy.FsPolicy
    env: fspolicy.EnvPolicy


# ---- YAML with line numbers -------------------------------------------------------------


class LocDict(dict[Any, Any]):
    """A mapping that remembers the line of itself and of each key (1-based)."""

    line: int | None = None
    lines: dict[Any, int]


class LocList(list[Any]):
    line: int | None = None
    lines: dict[int, int]


def _construct_map(loader: Any, node: Any) -> LocDict:
    loader.flatten_mapping(node)
    d = LocDict()
    d.line, d.lines = node.start_mark.line + 1, {}
    for knode, vnode in node.value:
        key = loader.construct_object(knode, deep=True)
        if key in d:
            raise netpolicy.PolicyError(f"duplicate key '{key}'", knode.start_mark.line + 1)
        d[key] = loader.construct_object(vnode, deep=True)
        d.lines[key] = knode.start_mark.line + 1
    return d


def _construct_seq(loader: Any, node: Any) -> LocList:
    lst = LocList(loader.construct_object(n, deep=True) for n in node.value)
    lst.line = node.start_mark.line + 1
    lst.lines = {i: n.start_mark.line + 1 for i, n in enumerate(node.value)}
    return lst


@functools.cache
def _loader() -> Any:
    """PyYAML's SafeLoader with line numbers; built on first use (importing yaml costs ~15 ms a run)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
    Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)
    return Loader


def parse_yaml(text: str, where: str) -> Any:
    cached = _cache_get(text)
    if cached is not _MISS:
        return cached
    import yaml

    try:
        doc = yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except netpolicy.PolicyError as e:
        raise PolicyFileError(where, e.line, str(e)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise PolicyFileError(where, mark.line + 1 if mark else None, f"invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise PolicyFileError(where, None, f"invalid YAML: {e}") from None
    _cache_put(text, doc)
    return doc


# ---- a cache of parsed documents, keyed by their exact text ------------------------------
# Only for speed (every run parses the bundled lists). It lives in sandgate's runtime
# directory, which the sandbox can neither see nor write: a sandbox able to write this cache
# could widen its own next policy. Keyed by the SHA-256 of the text, so a hit is always the
# same document; anything odd (unreadable, malformed, a type JSON cannot hold) is a miss.

_MISS = object()
CACHE_DIR: Path | None = None  # set by the run path (launcher/cli.py); None: no cache


def _cache_file(text: str) -> Path | None:
    if CACHE_DIR is None:
        return None
    import hashlib

    return CACHE_DIR / f"{hashlib.sha256(text.encode()).hexdigest()}.json"


def _cache_get(text: str) -> Any:
    path = _cache_file(text)
    if path is None:
        return _MISS
    try:
        return _decode(json.loads(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return _MISS


def _cache_put(text: str, doc: Any) -> None:
    path = _cache_file(text)
    if path is None:
        return
    try:
        data = json.dumps(_encode(doc)).encode()
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        tmp.replace(path)
    except (OSError, TypeError, ValueError):
        pass


def _encode(v: Any) -> Any:
    if isinstance(v, LocDict):
        return {"m": [[k, _encode(x), v.lines.get(k)] for k, x in v.items()], "l": v.line}
    if isinstance(v, LocList):
        return {"s": [_encode(x) for x in v], "l": v.line, "ls": [v.lines.get(i) for i in range(len(v))]}
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise TypeError(f"not cacheable: {type(v).__name__}")  # e.g. a YAML timestamp


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if "m" in v:
            d = LocDict()
            d.line, d.lines = v["l"], {}
            for k, x, line in v["m"]:
                d[k] = _decode(x)
                d.lines[k] = line
            return d
        lst = LocList(_decode(x) for x in v["s"])
        lst.line, lst.lines = v["l"], dict(enumerate(v["ls"]))
        return lst
    return v


# ---- files and includes -----------------------------------------------------------------


def bundled_names() -> list[str]:
    return sorted(p.stem for p in ALLOWLIST_DIR.glob("*.yaml"))


def bundled_path(name: str) -> Path | None:
    p = ALLOWLIST_DIR / f"{name}.yaml"
    return p if name in bundled_names() else None


def describe_bundled() -> list[tuple[str, str, int]]:
    """(name, description, number of allow entries) for `sandgate allowlists`."""
    out = []
    for name in bundled_names():
        doc = _load_file(ALLOWLIST_DIR / f"{name}.yaml", f"allowlists/{name}.yaml")
        out.append((name, str(doc.get("description", "")), len((doc.get("network") or {}).get("allow") or [])))
    return out


def _display(path: Path) -> str:
    """How a file is named in errors and rule origins: bundled lists by their repo path, others as given."""
    try:
        return f"allowlists/{path.resolve().relative_to(ALLOWLIST_DIR)}"
    except ValueError:
        return str(path)


def _load_file(path: Path, where: str) -> LocDict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyFileError(where, None, "no such file; check the path given with --policy or include:") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyFileError(where, None, f"cannot read: {e}") from None
    doc = parse_yaml(text, where)
    if doc is None:
        raise PolicyFileError(where, None, "empty policy; it needs at least 'version: 1'")
    if not isinstance(doc, dict):
        raise PolicyFileError(where, getattr(doc, "line", 1), "a policy must be a YAML mapping with 'version: 1'")
    for key in doc:
        if key not in TOP_KEYS:
            raise PolicyFileError(
                where, netpolicy.line_of(doc, key), f"unknown key '{key}' (expected one of: {', '.join(TOP_KEYS)})"
            )
    if "version" not in doc:
        raise PolicyFileError(where, 1, "missing 'version: 1'")
    if doc["version"] != 1 or isinstance(doc["version"], bool):
        raise PolicyFileError(
            where, netpolicy.line_of(doc, "version"), f"unsupported version {doc['version']!r}; this sandgate reads version 1"
        )
    return doc


def load_policy_file(path: Path, _stack: tuple[Path, ...] = ()) -> list[_Sections]:
    """Sections of `path` and of everything it includes, depth first, includes before the file itself."""
    where = _display(path)
    real = path.resolve()
    if real in _stack:
        chain = " -> ".join(_display(p) for p in (*_stack, real))
        raise PolicyFileError(where, None, f"include cycle: {chain}")
    if len(_stack) >= MAX_INCLUDE_DEPTH:
        raise PolicyFileError(where, None, f"includes nested deeper than {MAX_INCLUDE_DEPTH}")
    doc = _load_file(path, where)
    out: list[_Sections] = []
    includes = doc.get("include")
    if includes is not None:
        if isinstance(includes, str):
            includes = [includes]
        if not isinstance(includes, list):
            raise PolicyFileError(where, netpolicy.line_of(doc, "include"), "'include' must be a list of names or paths")
        for i, inc in enumerate(includes):
            line = netpolicy.line_of(includes, i) or netpolicy.line_of(doc, "include")
            if not isinstance(inc, str) or not inc:
                raise PolicyFileError(where, line, "an include must be a bundled list name or a file path")
            target = _resolve_include(inc, path.parent)
            if target is None:
                raise PolicyFileError(
                    where, line, f"unknown allowlist '{inc}' (bundled: {', '.join(bundled_names())}); a file path needs a '/' or '.yaml'"
                )
            out.extend(load_policy_file(target, (*_stack, real)))
    try:
        out.append(_Sections(netpolicy.parse_network(doc.get("network"), where),
                             fspolicy.parse_filesystem(doc.get("filesystem")), fspolicy.parse_env(doc.get("env"))))
    except (netpolicy.PolicyError, fspolicy.FsPolicyError) as e:
        raise PolicyFileError(where, e.line, str(e)) from None
    return out


def _resolve_include(ref: str, base: Path) -> Path | None:
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        p = Path(ref).expanduser()
        return p if p.is_absolute() else base / p
    return bundled_path(ref)


def build_policy(files: list[Path], allow: list[str], deny: list[str]) -> Policy:
    """The effective policy from --policy files plus --allow/--deny entries (each NAME, HOST or HOST:PORT)."""
    parts: list[_Sections] = []
    sources: list[str] = []
    for f in files:
        parts.extend(load_policy_file(f))
        sources.append(_display(f))
    for ref in allow:
        if (p := bundled_path(ref)) is not None:
            parts.extend(load_policy_file(p))
            sources.append(_display(p))
        else:
            parts.append(_Sections(flag_entry(ref, "allow"), fspolicy.FsPolicy(), fspolicy.EnvPolicy()))
    for ref in deny:
        parts.append(_Sections(flag_entry(ref, "deny"), fspolicy.FsPolicy(), fspolicy.EnvPolicy()))
    if allow or deny:
        sources.append("command line")
    try:
        network = netpolicy.merge([p.network for p in parts])
    except netpolicy.PolicyError as e:
        raise PolicyFileError("policy", None, str(e)) from None
    return Policy(network, tuple(sources), fspolicy.merge_fs([p.filesystem for p in parts]),
                  fspolicy.merge_env([p.env for p in parts]))


def flag_entry(ref: str, which: str) -> netpolicy.NetworkPolicy:
    """`--allow HOST[:PORT]` / `--deny HOST[:PORT]` as a one-entry network section."""
    where = f"--{which} {ref}"
    host, port = ref, None
    if ref.startswith("["):
        inner, _, rest = ref[1:].partition("]")
        host, port = inner, rest[1:] if rest.startswith(":") else None
    elif ref.count(":") == 1:
        host, port = ref.split(":")
    entry: dict[str, Any] = {"host": host}
    if port is not None:
        if not port.isdigit():
            raise PolicyFileError(where, None, f"invalid port '{port}'; use HOST or HOST:PORT")
        entry["ports"] = [int(port)]
    if "/" in host:
        entry = {"cidr": host, **({"ports": entry["ports"]} if "ports" in entry else {})}
    if which == "allow" and "." not in host and ":" not in host and "/" not in host:
        raise PolicyFileError(
            where, None, f"'{ref}' is neither a bundled allowlist ({', '.join(bundled_names())}) nor a host name with a dot"
        )
    try:
        return netpolicy.parse_network({which: [entry]}, "command line")
    except netpolicy.PolicyError as e:
        raise PolicyFileError(where, None, str(e)) from None
