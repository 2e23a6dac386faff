"""The one YAML reader of policy files: line numbers on every value, and limits for hostile input.

A policy file is hostile input (a checkout brings its own): only regular files up to 1 MiB are
read, YAML nesting and size are bounded (aliases counted each time they are used), and until a
file says `version: 1` no message quotes anything from it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fsguard import policy as fspolicy
from launcher.config import hostilefile, parsecache
from launcher.config.errors import PolicyFileError
from launcher.config.locs import LocDict, LocList
from netguard import policy as netpolicy
from sgbase.policyerror import line_of

TOP_KEYS = ("version", "description", "include", "network", "filesystem", "env")
MAX_BYTES = 16 << 20  # a real policy is a few kilobytes; 100,000 `- host:` entries ~4 MiB (a hosts_file is leaner)
MAX_DEPTH = 32  # YAML nesting; a policy needs 6 levels
MAX_VALUES = 1_000_000  # YAML values in one file, an alias counted each time it is used (3 per `- host:` entry)
#: Keys a message may name even before the file shows `version: 1`: sandgate's own words, not the file's.
VOCABULARY = frozenset(
    (*TOP_KEYS, *netpolicy.SECTION_KEYS, *netpolicy.ENTRY_KEYS, *fspolicy.FS_KEYS, *fspolicy.ENV_KEYS)
)


class NotPolicy(Exception):
    """Why a text is not a sandgate policy: `message` for the file itself, `short` when another file includes it."""

    def __init__(self, message: str, short: str, line: int | None) -> None:
        super().__init__(message)
        self.message, self.short, self.line = message, short, line


def read(path: Path, where: str) -> bytes:
    """The bytes of a policy file: a regular file of at most MAX_BYTES, never a FIFO or a device."""
    try:
        return hostilefile.read_file(path, MAX_BYTES)
    except hostilefile.Unreadable as e:
        raise PolicyFileError(where, None, str(e)) from None


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
            raise NotPolicy("invalid YAML: a mapping key must be a plain value", "invalid YAML", line) from None
        if key in d:
            name = f" '{key}'" if key in VOCABULARY else ""
            raise NotPolicy(f"duplicate key{name}; each key may appear once in a mapping", "duplicate key", line)
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
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]  # untyped in the stubs
                if self.depth > MAX_DEPTH:
                    raise NotPolicy(
                        f"nested deeper than {MAX_DEPTH} levels; a policy needs 6", "nested too deeply", line
                    )
                if self.nodes > MAX_VALUES:
                    raise NotPolicy(f"more than {MAX_VALUES} values; use a hosts_file", "too large", line)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except (ValueError, OverflowError):  # int("9" * 5000), 2026-13-45 ...
                raise NotPolicy(
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
            raise NotPolicy(
                f"nested deeper than {MAX_DEPTH} levels (aliases included); a policy needs 6", "nested too deeply", None
            )
        children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else ()
        seen += len(children)
        if seen > MAX_VALUES:
            raise NotPolicy(f"more than {MAX_VALUES} values (an alias counts each time it is used)", "too large", None)
        stack.extend((c, depth + 1) for c in children)


def _parse(text: str) -> Any:
    cached = parsecache.get(text)
    if cached is not parsecache.MISS:
        return cached
    import yaml

    try:
        doc = yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except RecursionError:
        raise NotPolicy("nested too deeply for YAML to read", "nested too deeply", None) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise NotPolicy(
            _yaml_problem(e.problem or e.context), "invalid YAML", mark.line + 1 if mark else None
        ) from None
    except yaml.reader.ReaderError as e:
        raise NotPolicy(
            "invalid YAML: a control character YAML does not allow", "invalid YAML", text.count("\n", 0, e.position) + 1
        ) from None
    except yaml.YAMLError:
        raise NotPolicy("invalid YAML", "invalid YAML", None) from None
    _check_expanded(doc)
    return doc


def remember(data: bytes, doc: LocDict) -> None:
    """Keep `doc` in the parse cache; called only once its file validated as a policy (load.py).

    Never earlier: a hostile `include: /etc/shadow` is parsed (YAML reads almost any text) and then
    refused, and its parsed text must not outlive the refusal in a file of sandgate's."""
    try:
        parsecache.put(data.decode("utf-8"), doc)
    except UnicodeDecodeError:
        pass


def parse_yaml(text: str, where: str) -> Any:
    """A YAML document with line numbers (any document: `sandgate audit suggest` checks its own output too)."""
    try:
        return _parse(text)
    except NotPolicy as e:
        raise PolicyFileError(where, e.line, e.message) from None


def document(data: bytes, where: str) -> LocDict:
    """The top-level mapping of a policy file; NotPolicy until it shows `version: 1`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotPolicy(
            "not UTF-8 text; save the policy as UTF-8", "not UTF-8 text", data.count(b"\n", 0, e.start) + 1
        ) from None
    doc = _parse(text)
    if doc is None:
        raise NotPolicy("empty policy; it needs at least 'version: 1'", "empty", None)
    if not isinstance(doc, LocDict):
        raise NotPolicy("a policy must be a YAML mapping with 'version: 1'", "not a mapping", getattr(doc, "line", 1))
    if "version" not in doc:
        raise NotPolicy("missing 'version: 1'", "no 'version: 1'", 1)
    v = doc["version"]
    if v != 1 or isinstance(v, bool):
        said = f" {v}" if type(v) is int and 0 <= v < 1000 else ""
        raise NotPolicy(
            f"unsupported version{said}; this sandgate reads version 1", "version is not 1", line_of(doc, "version")
        )
    for key in doc:  # from here on the file says it is a sandgate policy: messages may quote it
        if key not in TOP_KEYS:
            raise PolicyFileError(
                where, line_of(doc, key), f"unknown key '{key}' (expected one of: {', '.join(TOP_KEYS)})"
            )
    return doc


def policy_document(data: bytes, where: str) -> LocDict:
    """document(), with a text that is no policy reported as the file's own error."""
    try:
        return document(data, where)
    except NotPolicy as e:
        raise PolicyFileError(where, e.line, e.message) from None
