"""Reads policy files: YAML with line numbers, `include:` of bundled lists and paths.

No enforcement here: each section goes to the guard that owns it (`network:` to
netguard.policy). Every user mistake becomes a PolicyFileError naming FILE:LINE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> LocDict:
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


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> LocList:
    lst = LocList(loader.construct_object(n, deep=True) for n in node.value)
    lst.line = node.start_mark.line + 1
    lst.lines = {i: n.start_mark.line + 1 for i, n in enumerate(node.value)}
    return lst


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)  # type: ignore[arg-type]
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)  # type: ignore[arg-type]


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except netpolicy.PolicyError as e:
        raise PolicyFileError(where, e.line, str(e)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise PolicyFileError(where, mark.line + 1 if mark else None, f"invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise PolicyFileError(where, None, f"invalid YAML: {e}") from None


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
