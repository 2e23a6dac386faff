"""Reads policy files: YAML with line numbers, `include:` of bundled lists and paths, and the checks
every policy is held to whoever wrote it.

No enforcement here: each section goes to the guard that owns it (`network:` to netguard.policy).
Every user mistake becomes a PolicyFileError naming FILE:LINE. A policy file is hostile input (a
checkout brings its own): only regular files up to 1 MiB are read, YAML nesting and size are
bounded, and until a file says `version: 1` no message quotes anything from it.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsguard import policy as fspolicy
from fsguard.env import EnvPolicy
from launcher import trust
from netguard import policy as netpolicy
from netguard.policyerror import PolicyError, line_of

ALLOWLIST_DIR = Path(__file__).resolve().parent.parent / "allowlists"
TOP_KEYS = ("version", "description", "include", "network", "filesystem", "env")
MAX_INCLUDE_DEPTH = 16
MAX_FILES = 64  # distinct files in one policy: includes may fan out, each file is read once
MAX_BYTES = 1 << 20  # a real policy is a few kilobytes
MAX_DEPTH = 32  # YAML nesting; a policy needs 6 levels
MAX_VALUES = 100_000  # YAML values in one file, an alias counted each time it is used
MAX_RULES = 10_000  # network rules in all; the bundled lists have about 100 together
#: Widest prefix one allow/ask cidr may have without --allow-wide-cidr; all of them together may
#: cover at most four such blocks. A /8 is the largest block any single network holds in IPv4 (and
#: 10.0.0.0/8 is common); in IPv6 whole registries hold /12s and the largest ISPs /19s, so a /16
#: already reaches past any one network. Deny rules only narrow: they may be as wide as wanted.
WIDE_PREFIX = {4: 8, 6: 16}
VOCABULARY = frozenset(
    (*TOP_KEYS, *netpolicy.SECTION_KEYS, *netpolicy.ENTRY_KEYS, *fspolicy.FS_KEYS, *fspolicy.ENV_KEYS)
)


class PolicyFileError(Exception):
    """A policy mistake, already phrased for the one-line `sandgate: error:` message."""

    def __init__(self, where: str, line: int | None, message: str) -> None:
        self.where, self.line, self.message = where, line, message
        super().__init__(_printable(f"{where}:{line}: {message}" if line else f"{where}: {message}"))


def _printable(text: str, limit: int = 600) -> str:
    """One line of plain text: no newline or terminal escape from a file reaches the user's terminal."""

    def plain(c: str) -> str:
        if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp"):
            return c
        return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"

    out = "".join(map(plain, text))
    return out if len(out) <= limit else out[: limit - 1] + "…"


@dataclass(frozen=True)
class Policy:
    """The effective policy of one run, merged from every file, include and command-line entry."""

    network: netpolicy.NetworkPolicy
    sources: tuple[str, ...]
    filesystem: fspolicy.FsPolicy = field(default_factory=fspolicy.FsPolicy)
    env: EnvPolicy = field(default_factory=EnvPolicy)
    files: tuple[Path, ...] = ()  # applied in full (--policy, a trusted ./.sandgate.yaml); "always" goes to the first
    narrowed: trust.Narrowed | None = None  # an untrusted ./.sandgate.yaml, applied only where it narrows


@dataclass(frozen=True)
class _Sections:
    """One file's sections, each parsed by the guard that owns it."""

    network: netpolicy.NetworkPolicy
    filesystem: fspolicy.FsPolicy
    env: EnvPolicy


@dataclass(frozen=True)
class Checks:
    """What every policy is held to in this run, from the command line and the environment."""

    allow_wide_cidr: bool = False  # --allow-wide-cidr; never from a file
    homes: tuple[str, ...] = ()  # every home `~` may mean in this run; no writable root may hold one
    cwd: str = "/"
    realpath: Callable[[str], str] = posixpath.normpath  # os.path.realpath in a run

    @classmethod
    def current(cls, *, allow_wide_cidr: bool = False, user: str | None = None) -> Checks:
        """Homes: $HOME, the user's, the sudo caller's and --user's (`~` in a policy means the one CMD runs as)."""
        sudo = os.environ.get("SUDO_UID", "") if os.geteuid() == 0 else ""
        found = [os.environ.get("HOME", ""), *(_home(w) for w in (str(os.geteuid()), sudo, user or "") if w)]
        homes = [h for h in found if h.startswith("/")]
        both = [*(posixpath.normpath(h) for h in homes), *(os.path.realpath(h) for h in homes)]
        return cls(allow_wide_cidr, tuple(dict.fromkeys(both)), os.getcwd(), os.path.realpath)


def _home(who: str) -> str:
    import pwd

    try:
        return (pwd.getpwuid(int(who)) if who.isdigit() else pwd.getpwnam(who)).pw_dir
    except (KeyError, ValueError):
        return ""  # an unknown --user is reported by the run itself


def _read(path: Path, where: str) -> bytes:
    try:
        return trust.read_file(path, MAX_BYTES)
    except trust.Unreadable as e:
        raise PolicyFileError(where, None, str(e)) from None


# ---- YAML with line numbers and limits --------------------------------------------------


class LocDict(dict[Any, Any]):
    """A mapping that remembers the line of itself and of each key (1-based)."""

    line: int | None = None
    lines: dict[Any, int]


class LocList(list[Any]):
    line: int | None = None
    lines: dict[int, int]


class _NotPolicy(Exception):
    """Why a text is not a sandgate policy: `message` for the file itself, `short` when another file includes it."""

    def __init__(self, message: str, short: str, line: int | None) -> None:
        super().__init__(message)
        self.message, self.short, self.line = message, short, line


def _construct_map(loader: Any, node: Any) -> LocDict:
    loader.flatten_mapping(node)
    d = LocDict()
    d.line, d.lines = node.start_mark.line + 1, {}
    for knode, vnode in node.value:
        line = knode.start_mark.line + 1
        key = loader.construct_object(knode, deep=True)
        try:
            hash(key)
        except TypeError:
            raise _NotPolicy("invalid YAML: a mapping key must be a plain value", "invalid YAML", line) from None
        if key in d:
            name = f" '{key}'" if key in VOCABULARY else ""
            raise _NotPolicy(f"duplicate key{name}; each key may appear once in a mapping", "duplicate key", line)
        d[key] = loader.construct_object(vnode, deep=True)
        d.lines[key] = line
    return d


def _construct_seq(loader: Any, node: Any) -> LocList:
    lst = LocList(loader.construct_object(n, deep=True) for n in node.value)
    lst.line = node.start_mark.line + 1
    lst.lines = {i: n.start_mark.line + 1 for i, n in enumerate(node.value)}
    return lst


@functools.cache
def _loader() -> Any:
    """PyYAML's SafeLoader with line numbers and limits; built on first use (importing yaml costs ~15 ms a run)."""
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0
        nodes = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth, self.nodes = self.depth + 1, self.nodes + 1
            try:
                line = self.peek_event().start_mark.line + 1
                if self.depth > MAX_DEPTH:
                    raise _NotPolicy(
                        f"nested deeper than {MAX_DEPTH} levels; a policy needs 6", "nested too deeply", line
                    )
                if self.nodes > MAX_VALUES:
                    raise _NotPolicy(f"more than {MAX_VALUES} values; a policy has a few hundred", "too large", line)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except (ValueError, OverflowError):  # int("9" * 5000), 2026-13-45 ...
                raise _NotPolicy(
                    "invalid YAML: a value that cannot be read (a number too long, a date that does not exist?)",
                    "invalid YAML",
                    node.start_mark.line + 1,
                ) from None

    Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
    Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)
    return Loader


#: PyYAML's problems, by how they start, in words that quote nothing from the file (its own
#: messages can carry a character, an alias or a tag from it).
_YAML_PROBLEMS = (
    ("could not find expected ':'", "could not find expected ':'"),
    ("mapping values are not allowed", "mapping values are not allowed here (a ': ' inside a plain value?)"),
    ("mapping keys are not allowed", "mapping keys are not allowed here"),
    ("sequence entries are not allowed", "sequence entries are not allowed here"),
    ("block sequence entries are not allowed", "sequence entries are not allowed here"),
    ("expected <block end>", "expected the end of a block: check the indentation"),
    ("expected ',' or ']'", "expected ',' or ']' in a [...] list"),
    ("expected ',' or '}'", "expected ',' or '}' in a {...} mapping"),
    ("expected the node content", "expected a value"),
    ("found unexpected end of stream", "the file ends inside a quoted value"),
    ("found character", "found a character that cannot start a value (a tab? indent with spaces)"),
    ("found undefined alias", "an alias (*name) names no anchor"),
    ("found duplicate anchor", "an anchor (&name) is defined twice"),
    ("found unknown escape character", "an unknown escape in a double-quoted value"),
    ("found unhashable key", "a mapping key must be a plain value"),
    ("could not determine a constructor", "a '!tag' sandgate does not read; remove it"),
    ("found unconstructable recursive node", "an alias inside the collection it names"),
    ("expected a comment or a line break", "unexpected text after a value ('#' needs a space before it)"),
    ("but found another document", "more than one YAML document ('---'); a policy is one"),
)


def _yaml_problem(problem: str | None) -> str:
    return next(
        (f"invalid YAML: {said}" for start, said in _YAML_PROBLEMS if (problem or "").startswith(start)), "invalid YAML"
    )


def _check_expanded(doc: Any) -> None:
    """Aliases make a small file a huge or deep document; count every value as a walk over it would."""
    stack, seen = [(doc, 1)], 1
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _NotPolicy(
                f"nested deeper than {MAX_DEPTH} levels (aliases included); a policy needs 6", "nested too deeply", None
            )
        children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else ()
        seen += len(children)
        if seen > MAX_VALUES:
            raise _NotPolicy(f"more than {MAX_VALUES} values (an alias counts each time it is used)", "too large", None)
        stack.extend((c, depth + 1) for c in children)


def _parse(text: str) -> Any:
    cached = _cache_get(text)
    if cached is not _MISS:
        return cached
    import yaml

    try:
        doc = yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except RecursionError:
        raise _NotPolicy("nested too deeply for YAML to read", "nested too deeply", None) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise _NotPolicy(
            _yaml_problem(e.problem or e.context), "invalid YAML", mark.line + 1 if mark else None
        ) from None
    except yaml.reader.ReaderError as e:
        raise _NotPolicy(
            "invalid YAML: a control character YAML does not allow", "invalid YAML", text.count("\n", 0, e.position) + 1
        ) from None
    except yaml.YAMLError:
        raise _NotPolicy("invalid YAML", "invalid YAML", None) from None
    _check_expanded(doc)
    _cache_put(text, doc)
    return doc


def parse_yaml(text: str, where: str) -> Any:
    """A YAML document with line numbers (any document: `sandgate audit suggest` checks its own output too)."""
    try:
        return _parse(text)
    except _NotPolicy as e:
        raise PolicyFileError(where, e.line, e.message) from None


def _document(data: bytes, where: str) -> LocDict:
    """The top-level mapping of a policy file; _NotPolicy until it shows `version: 1`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _NotPolicy(
            "not UTF-8 text; save the policy as UTF-8", "not UTF-8 text", data.count(b"\n", 0, e.start) + 1
        ) from None
    doc = _parse(text)
    if doc is None:
        raise _NotPolicy("empty policy; it needs at least 'version: 1'", "empty", None)
    if not isinstance(doc, LocDict):
        raise _NotPolicy("a policy must be a YAML mapping with 'version: 1'", "not a mapping", getattr(doc, "line", 1))
    if "version" not in doc:
        raise _NotPolicy("missing 'version: 1'", "no 'version: 1'", 1)
    v = doc["version"]
    if v != 1 or isinstance(v, bool):
        said = f" {v}" if type(v) is int and 0 <= v < 1000 else ""
        raise _NotPolicy(
            f"unsupported version{said}; this sandgate reads version 1",
            "version is not 1",
            line_of(doc, "version"),
        )
    for key in doc:  # from here on the file says it is a sandgate policy: messages may quote it
        if key not in TOP_KEYS:
            raise PolicyFileError(
                where, line_of(doc, key), f"unknown key '{key}' (expected one of: {', '.join(TOP_KEYS)})"
            )
    return doc


# ---- a cache of parsed documents, keyed by their exact text ------------------------------
# Only for speed (every run parses the bundled lists). It lives in sandgate's runtime
# directory, which the sandbox can neither see nor write: a sandbox able to write this cache
# could widen its own next policy. Keyed by the SHA-256 of the text, so a hit is always the
# same document; anything odd (unreadable, malformed, a type JSON cannot hold) is a miss.
# Only documents that passed the limits above are stored.

_MISS = object()
CACHE_DIR: Path | None = None  # set by the run path (launcher/cli.py); None: no cache


def _cache_file(text: str) -> Path | None:
    if CACHE_DIR is None:
        return None
    return CACHE_DIR / f"{trust.digest(text.encode())}.json"


def _cache_get(text: str) -> Any:
    path = _cache_file(text)
    if path is None:
        return _MISS
    try:
        return _decode(json.loads(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
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
    except (OSError, TypeError, ValueError, RecursionError):
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
        where = f"allowlists/{name}.yaml"
        doc = _doc(_read(ALLOWLIST_DIR / f"{name}.yaml", where), where, None)
        out.append((name, str(doc.get("description", "")), len((doc.get("network") or {}).get("allow") or [])))
    return out


def _display(path: Path) -> str:
    """How a file is named in errors and rule origins: bundled lists by their repo path, others as given."""
    try:
        return f"allowlists/{path.resolve().relative_to(ALLOWLIST_DIR)}"
    except ValueError:
        return str(path)


def _doc(data: bytes, where: str, ref: tuple[str, int | None, str] | None) -> LocDict:
    """The document of a file; when it is no policy, an included file is reported at its include line."""
    try:
        return _document(data, where)
    except _NotPolicy as e:
        if ref is None:
            raise PolicyFileError(where, e.line, e.message) from None
        at = f" at line {e.line}" if e.line else ""
        raise PolicyFileError(ref[0], ref[1], f"include '{ref[2]}' is not a sandgate policy ({e.short}{at})") from None


def _sections(doc: LocDict, where: str) -> _Sections:
    try:
        return _Sections(
            netpolicy.parse_network(doc.get("network"), where),
            fspolicy.parse_filesystem(doc.get("filesystem")),
            fspolicy.parse_env(doc.get("env")),
        )
    except PolicyError as e:
        raise PolicyFileError(where, e.line, str(e)) from None


def _includes(doc: LocDict, where: str) -> list[tuple[str, int | None]]:
    includes = doc.get("include")
    if includes is None:
        return []
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list):
        raise PolicyFileError(where, line_of(doc, "include"), "'include' must be a list of names or paths")
    out = []
    for i, inc in enumerate(includes):
        line = line_of(includes, i) or line_of(doc, "include")
        if not isinstance(inc, str) or not inc:
            raise PolicyFileError(where, line, "an include must be a bundled list name or a file path")
        out.append((inc, line))
    return out


#: Why an included file (not a bundled list) may not be used, or None: (path, exact bytes read).
IncludeCheck = Callable[[Path, bytes], "str | None"]


class _Reader:
    """The files of one policy: each read once, includes bounded, file includes vetted by `check`."""

    def __init__(self, checks: Checks, check: IncludeCheck | None = None) -> None:
        self.checks, self.check = checks, check
        self.done: set[Path] = set()

    def load(
        self,
        path: Path,
        data: bytes | None = None,
        stack: tuple[Path, ...] = (),
        ref: tuple[str, int | None, str] | None = None,
    ) -> list[_Sections]:
        """Sections of `path` and of everything it includes, depth first, includes before the file itself."""
        where = _display(path)
        real = path.resolve()
        if real in stack:
            raise PolicyFileError(where, None, f"include cycle: {' -> '.join(_display(p) for p in (*stack, real))}")
        if len(stack) >= MAX_INCLUDE_DEPTH:
            raise PolicyFileError(where, None, f"includes nested deeper than {MAX_INCLUDE_DEPTH}")
        if real in self.done:
            return []  # included twice (a diamond): its rules are already in
        if len(self.done) >= MAX_FILES:
            raise PolicyFileError(where, None, f"more than {MAX_FILES} files in one policy; include fewer")
        self.done.add(real)
        doc = _doc(_read(path, where) if data is None else data, where, ref)
        out: list[_Sections] = []
        for inc, line in _includes(doc, where):
            out.extend(self._include(inc, line, path, where, (*stack, real)))
        sections = _sections(doc, where)
        _check_writes(doc, sections.filesystem, where, self.checks)
        return [*out, sections]

    def _include(self, ref: str, line: int | None, path: Path, where: str, stack: tuple[Path, ...]) -> list[_Sections]:
        if "/" in ref or ref.endswith((".yaml", ".yml")):
            target = Path(ref).expanduser()
            target = target if target.is_absolute() else path.parent / target
        elif (bundled := bundled_path(ref)) is not None:
            return self.load(bundled, None, stack)
        else:
            raise PolicyFileError(
                where,
                line,
                f"unknown allowlist '{ref}' (bundled: {', '.join(bundled_names())}); a file path needs a '/' or '.yaml'",
            )
        try:
            data = trust.read_file(target, MAX_BYTES)
        except trust.Unreadable as e:
            raise PolicyFileError(where, line, f"include '{ref}' cannot be used: {e}") from None
        why = self.check(target, data) if self.check is not None else None
        if why:
            raise PolicyFileError(where, line, f"include '{ref}' {why}")
        return self.load(target, data, stack, (where, line, ref))


def load_policy_file(path: Path) -> list[_Sections]:
    """Sections of a file named by the user (or bundled) and of everything it includes."""
    return _Reader(Checks()).load(path)


def trust_chain(path: Path) -> list[tuple[Path, bytes]]:
    """What `sandgate trust FILE` records: FILE and every file it includes, each as read (and validated) now."""
    data = _read(path, _display(path))
    chain = [(path, data)]

    def collect(target: Path, content: bytes) -> None:
        chain.append((target, content))

    _Reader(Checks(), collect).load(path, data)
    return chain


# ---- checks every policy is held to (pure) --------------------------------------------------


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def write_root_problem(entry: str, checks: Checks) -> str | None:
    """Why `entry` may not be a writable root (it is a home directory or holds one), or None."""
    if entry == "~" or entry.startswith("~/"):
        paths = [posixpath.normpath(h + entry[1:]) for h in checks.homes]
    else:
        paths = [posixpath.normpath(posixpath.join(checks.cwd, entry))]
    for p in (*paths, *(checks.realpath(p) for p in paths)):
        for home in checks.homes:
            if _under(home, p):
                what = "your home directory" if home == p else "a directory that holds your home"
                return (
                    f"'filesystem.write' entry '{entry}' is {what} ({home}): a command could plant files that "
                    "run outside the sandbox (~/.bashrc, ~/.ssh/authorized_keys); name the directories it "
                    "must write instead, e.g. '~/.cache/pip'"
                )
    return None


def _check_writes(doc: LocDict, fs: fspolicy.FsPolicy, where: str, checks: Checks) -> None:
    entries = (doc.get("filesystem") or {}).get("write")
    for i, entry in enumerate(fs.write or ()):
        if (problem := write_root_problem(entry, checks)) is not None:
            raise PolicyFileError(where, line_of(entries, i), problem)


def _covered(nets: list[netpolicy.Network]) -> int:
    """How many addresses the union of `nets` (one IP version) holds."""
    total, end = 0, -1
    for lo, hi in sorted((int(n.network_address), int(n.broadcast_address)) for n in nets):
        if hi > end:
            total += hi - max(lo, end + 1) + 1
            end = hi
    return total


def wide_cidr_problem(net: netpolicy.NetworkPolicy) -> tuple[netpolicy.Rule, str] | None:
    """The first allow/ask cidr that is too wide alone, or that takes all of them past four such blocks."""
    rules = [
        (name, r, r.value)
        for name, rs in (("allow", net.allow), ("ask", net.ask))
        for r in rs
        if not isinstance(r.value, str)
    ]
    how = "list the ranges the task needs, or pass --allow-wide-cidr to sandgate if you mean it"
    for name, r, n in rules:
        if n.prefixlen < WIDE_PREFIX[n.version]:
            return r, (
                f"network.{name}: cidr {n} covers 1/{2**n.prefixlen} of all IPv{n.version} addresses "
                f"(one rule may cover at most a /{WIDE_PREFIX[n.version]}); {how}"
            )
    for version, bits in ((4, 32), (6, 128)):
        same = [x for x in rules if x[2].version == version]
        limit = 4 << (bits - WIDE_PREFIX[version])
        if _covered([n for _, _, n in same]) <= limit:
            continue
        lo, hi = 1, len(same)  # the first k whose union passes the limit: the union only grows with k
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _covered([n for _, _, n in same[:mid]]) > limit else (mid + 1, hi)
        name, r, n = same[lo - 1]
        share = 2**bits // _covered([x[2] for x in same[:lo]])
        return r, (
            f"network.{name}: with cidr {n}, the cidr rules cover 1/{share} of all IPv{version} addresses, "
            f"more than four /{WIDE_PREFIX[version]}s; {how}"
        )
    return None


def _at(origin: str) -> tuple[str, int | None]:
    head, _, tail = origin.rpartition(":")
    return (head, int(tail)) if head and tail.isdigit() else (origin, None)


def check_network(net: netpolicy.NetworkPolicy, checks: Checks) -> None:
    """The merged network rules: not too many, and no absurd share of the address space unless the flag says so."""
    rules = (*net.allow, *net.deny, *net.ask)
    if len(rules) > MAX_RULES:
        raise PolicyFileError(
            *_at(rules[MAX_RULES].origin),
            f"more than {MAX_RULES} network rules in all; allow wildcards or cidrs instead of listing every host",
        )
    if not checks.allow_wide_cidr and (found := wide_cidr_problem(net)) is not None:
        raise PolicyFileError(*_at(found[0].origin), found[1])


# ---- the effective policy --------------------------------------------------------------------


def _workspace(path: Path, store: trust.Store | None, checks: Checks) -> tuple[list[_Sections], trust.Narrowed | None]:
    """./.sandgate.yaml picked up implicitly: in full once trusted (and its file includes too), else narrowed."""
    where = _display(path)
    data = _read(path, where)
    problem = store.problem((Path.cwd(),)) if store is not None else None
    status, unreadable = store.status(path, data) if store is not None and problem is None else ("unknown", None)
    if status == "trusted" and store is not None:

        def check(target: Path, content: bytes) -> str | None:
            st, _ = store.status(target, content)
            return (
                None
                if st == "trusted"
                else (
                    f"{'changed since it was trusted' if st == 'changed' else 'is not trusted'}; "
                    f"review it, then run: sandgate trust {where}"
                )
            )

        return _Reader(checks, check).load(path, data), None
    doc = _doc(data, where, None)
    s = _sections(doc, where)
    net, fs, env, ignored = trust.narrow(s.network, s.filesystem, s.env, doc.get("include") is not None)
    return [_Sections(net, fs, env)], trust.Narrowed(where, status, ignored, problem or unreadable)


def build_policy(
    files: list[Path],
    allow: list[str],
    deny: list[str],
    *,
    workspace: Path | None = None,
    store: trust.Store | None = None,
    checks: Checks | None = None,
) -> Policy:
    """The effective policy from --policy files (trusted: the user named them), an implicit workspace
    file (narrowed unless `store` trusts it) and --allow/--deny entries (each NAME, HOST or HOST:PORT)."""
    checks = checks if checks is not None else Checks.current()
    reader = _Reader(checks)
    parts: list[_Sections] = []
    sources: list[str] = []
    full: list[Path] = []
    for f in files:
        parts.extend(reader.load(f))
        sources.append(_display(f))
        full.append(f.resolve())
    narrowed = None
    if workspace is not None:
        got, narrowed = _workspace(workspace, store, checks)
        parts.extend(got)
        sources.append(_display(workspace) + (" (untrusted: narrowing only)" if narrowed else ""))
        full.extend([] if narrowed else [workspace.resolve()])
    for ref in allow:
        if (p := bundled_path(ref)) is not None:
            parts.extend(reader.load(p))
            sources.append(_display(p))
        else:
            parts.append(_Sections(flag_entry(ref, "allow"), fspolicy.FsPolicy(), EnvPolicy()))
    for ref in deny:
        parts.append(_Sections(flag_entry(ref, "deny"), fspolicy.FsPolicy(), EnvPolicy()))
    if allow or deny:
        sources.append("command line")
    try:
        network = netpolicy.merge([p.network for p in parts])
    except PolicyError as e:
        raise PolicyFileError("policy", None, str(e)) from None
    check_network(network, checks)
    return Policy(
        network,
        tuple(sources),
        fspolicy.merge_fs([p.filesystem for p in parts]),
        fspolicy.merge_env([p.env for p in parts]),
        tuple(full),
        narrowed,
    )


_SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "git": 9418, "ssh": 22, "ftp": 21}


def _url_host_port(url: str, where: str) -> str:
    """`https://pypi.org/simple` -> `pypi.org:443`; a path, query or user part is dropped."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        port = u.port or _SCHEME_PORTS.get(u.scheme.lower())
    except ValueError as e:
        raise PolicyFileError(where, None, f"not a usable URL ({e}); use HOST or HOST:PORT") from None
    if not u.hostname or port is None:
        raise PolicyFileError(
            where, None, "a URL needs a host and a known scheme or an explicit port; use HOST or HOST:PORT"
        )
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{host}:{port}"


def flag_entry(ref: str, which: str) -> netpolicy.NetworkPolicy:
    """`--allow HOST[:PORT]` / `--deny HOST[:PORT]` as a one-entry network section."""
    where = f"--{which} {ref}"
    if "://" in ref:  # a URL (what people paste): its host, and its port or the scheme's
        ref = _url_host_port(ref, where)
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
            where,
            None,
            f"'{ref}' is neither a bundled allowlist ({', '.join(bundled_names())}) nor a host name with a dot",
        )
    try:
        return netpolicy.parse_network({which: [entry]}, "command line")
    except PolicyError as e:
        raise PolicyFileError(where, None, str(e)) from None
