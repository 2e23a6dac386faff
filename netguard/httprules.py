"""Request-level rules for inspected hosts: which methods and paths a task may send. Pure: no I/O.

An allow entry opts into TLS inspection with `inspect: true` or an `http:` list (which implies it):

    - host: github.com
      http:
        - read-only                           # GET, HEAD, OPTIONS on every path
        - methods: [POST]
          paths: ["/*/*/git-upload-pack"]     # clone and fetch; git-receive-pack (push) is refused

Hosts without either stay untouched TLS passthrough. A request is allowed when one rule of one
inspecting entry covers both its method and its path; nothing else widens an inspected host (an
entry for the same host without `http:` does not reopen what the inspecting entry leaves out).

Paths are matched on a canonical form (`canonical_path`): the query is cut off, percent-escapes of
ordinary characters are decoded, and a path the upstream could read differently from us (dot
segments, a backslash, a bad escape, not starting with "/") is refused outright. `*` matches within
one segment, `**` across segments. Methods are compared exactly: HTTP methods are case-sensitive,
so `post` is not `POST` and is refused unless listed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from netguard.policyerror import PolicyError, line_of

#: The `read-only` shorthand: methods that by HTTP's definition change nothing on the server.
READ_ONLY: frozenset[str] = frozenset({"GET", "HEAD", "OPTIONS"})
HTTP_RULE_KEYS = ("methods", "paths")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: what a method may be
#: Escapes that stay escaped in the canonical path: decoding them would change where segments end
#: (%2F, %5C), where the path ends (%3F, %23) or make an escape of an escape (%25).
_KEEP_ESCAPED = frozenset({"2F", "5C", "25", "3F", "23"})


@dataclass(frozen=True)
class HttpRule:
    """Requests one rule allows: `methods`/`paths` None means any."""

    methods: frozenset[str] | None
    paths: tuple[str, ...] | None
    origin: str

    def describe(self) -> str:
        if self.methods == READ_ONLY and self.paths is None:
            return "read-only"
        m = ",".join(sorted(self.methods)) if self.methods is not None else "any method"
        return f"{m} {' '.join(self.paths)}" if self.paths is not None else m


@dataclass(frozen=True)
class RequestDecision:
    allowed: bool
    rule: str | None  # origin of the deciding rule ("FILE:LINE"); None when nothing allowed it
    reason: str


# ---- parsing ------------------------------------------------------------------------------------


def parse_http(value: Any, source: str, line: int | None) -> tuple[HttpRule, ...]:
    """An entry's `http:` value: `read-only`, one rule mapping, or a list of either; `source` names the file."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PolicyError("'http' is empty: that would refuse every request; list rules or use read-only", line)
    return tuple(_parse_one(item, source, line_of(items, i) or line) for i, item in enumerate(items))


def _parse_one(item: Any, source: str, line: int | None) -> HttpRule:
    where = f"{source}:{line}" if line is not None else source
    if item == "read-only":
        return HttpRule(READ_ONLY, None, where)
    if not isinstance(item, dict):
        raise PolicyError(f"an 'http' rule is read-only or a mapping with methods and paths, not {item!r}", line)
    for key in item:
        if key not in HTTP_RULE_KEYS:
            raise PolicyError(f"unknown key '{key}' in an http rule (expected methods, paths)", line_of(item, key))
    if not item:
        raise PolicyError("an http rule needs methods, paths or both", line)
    methods = _parse_methods(item["methods"], line_of(item, "methods") or line) if "methods" in item else None
    paths = _parse_paths(item["paths"], line_of(item, "paths") or line) if "paths" in item else None
    return HttpRule(methods, paths, where)


def _parse_methods(value: Any, line: int | None) -> frozenset[str]:
    items = value if isinstance(value, list) else [value]
    out: set[str] = set()
    for i, m in enumerate(items):
        if not isinstance(m, str) or not _TOKEN.fullmatch(m):
            raise PolicyError(f"invalid method {m!r}: write HTTP methods like GET or POST", line_of(items, i) or line)
        out.add(m.upper())
    if not out:
        raise PolicyError("'methods' is empty; leave it out for any method", line)
    return frozenset(out)


def _parse_paths(value: Any, line: int | None) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for i, p in enumerate(items):
        where = line_of(items, i) or line
        if not isinstance(p, str) or not p.startswith("/"):
            raise PolicyError(f"invalid path {p!r}: a path pattern starts with '/' ('/*/*/info/refs')", where)
        if "?" in p or "#" in p:
            raise PolicyError(f"path {p!r}: patterns match the path only, without a query", where)
        if canonical_path(p.replace("*", "x")) != p.replace("*", "x"):
            raise PolicyError(
                f"path {p!r} is not canonical: no dot segments or backslashes, and escapes only for '/', '\\', '%',"
                " '?', '#' and control characters, in upper case (%2F)",
                where,
            )
        out.append(p)
    if not out:
        raise PolicyError("'paths' is empty; leave it out for any path", line)
    return tuple(out)


# ---- matching -----------------------------------------------------------------------------------


def canonical_path(target: str) -> str | None:
    """The path part of a request target as rules see it, or None when it is ambiguous (refused).

    The threat: a path that our glob reads as allowed while the upstream reads it as another one
    (`/o/r/git-upload-pack/../../x/git-receive-pack`, `%2e%2e`, a backslash some servers take for '/').
    """
    path = target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/") or "\\" in path:
        return None
    if "%" in path:
        out = []
        parts = path.split("%")
        out.append(parts[0])
        for part in parts[1:]:
            code = part[:2].upper()
            if len(code) < 2 or any(c not in "0123456789ABCDEF" for c in code):
                return None
            ch = chr(int(code, 16))
            out.append(("%" + code if code in _KEEP_ESCAPED or int(code, 16) < 0x21 else ch) + part[2:])
        path = "".join(out)
    if any(seg in (".", "..") for seg in path.split("/")):
        return None
    return path


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*)", pattern)
    body = "".join("[^/]*" if p == "*" else ".*" if p == "**" else re.escape(p) for p in parts)
    return re.compile(body)


def path_matches(pattern: str, path: str) -> bool:
    """`*` within one segment, `**` across segments, everything else literal (after canonical_path)."""
    return _glob(pattern).fullmatch(path) is not None


def covers(rule: HttpRule, method: str, path: str) -> bool:
    if rule.methods is not None and method not in rule.methods:
        return False
    return rule.paths is None or any(path_matches(p, path) for p in rule.paths)


def decide_request(rules: tuple[HttpRule, ...] | None, host: str, method: str, target: str) -> RequestDecision:
    """Whether an inspected host takes this request; `rules` None: every request (inspect without http)."""
    path = canonical_path(target)
    shown = target.split("?", 1)[0]
    if path is None:
        return RequestDecision(
            False, None, f"{method} {shown}: path is not canonical (dot segments, backslash or bad escape)"
        )
    if rules is None:
        return RequestDecision(True, None, "inspected, every request allowed")
    for r in rules:
        if covers(r, method, path):
            return RequestDecision(True, r.origin, f"allowed by http rule {r.describe()}")
    allowed = "; ".join(r.describe() for r in rules)
    return RequestDecision(False, None, f"{method} {shown} not allowed on {host} (allowed: {allowed})")
