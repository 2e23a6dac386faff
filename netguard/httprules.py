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

Paths are matched in their one canonical form (netguard.canonpath): a path some upstream could read
differently from us (escaped dots or separators, `;` parameters, `\\`, double escapes, bad UTF-8,
dot segments) is refused before any rule looks at it; an escaped `/` (npm's `/@scope%2fname`) passes
only where the rules allow every way a server may read it. `*` matches within one segment, `**`
across segments. Methods are compared exactly: HTTP methods are case-sensitive, so `post` is not
`POST` and is refused unless listed.

On every inspected host, two ways of sending another request than the one judged are refused: a
method-override header (OVERRIDE_HEADERS, any case, `_` read as `-`) or `_method` query parameter
in any spelling PHP reads as one (`.method`, `+method`, `_method[]`), which frameworks honour to
turn a permitted POST into a DELETE (refused, not stripped: stripping would send a POST the client never meant, which
the server may take as a create), and a protocol upgrade. After an upgrade no rule reads what
flows, so it needs a rule that says so, for WebSocket only (one `Upgrade` header, naming only it):

    - methods: [GET]
      paths: ["/v1/realtime"]
      websocket: true          # this rule's GETs may upgrade to WebSocket; its frames are not judged

On a host with `inspect: true` and no `http:` every method is allowed, yet an override header is
refused there too: the host may carry a brokered credential, whose holder never meant the request
the header asks for, and one rule everywhere is what a reader of the policy can predict (a client
that sends `X-HTTP-Method-Override: GET` for long URLs, as Google's do, must send the method
itself). An upgrade is refused there as well (no rule says so).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from netguard import canonpath
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError, line_of

#: The `read-only` shorthand: methods that by HTTP's definition change nothing on the server.
READ_ONLY: frozenset[str] = frozenset({"GET", "HEAD", "OPTIONS"})
HTTP_RULE_KEYS = ("methods", "paths", "websocket")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: what a method may be
#: Headers through which frameworks (Rails, Express method-override, Symfony, ASP.NET and OData,
#: Google APIs; `X-Original-Method` and `X-Forwarded-Method`, which auth subrequests and
#: forward-auth services read as the request's method) take another method than the request
#: line's: a permitted POST would act as a DELETE. Compared after `_` -> `-`, in lower case
#: (CGI, PHP and WSGI read `X_HTTP_METHOD_OVERRIDE` as HTTP_X_HTTP_METHOD_OVERRIDE too).
OVERRIDE_HEADERS = frozenset(
    {"x-http-method-override", "x-http-method", "x-method-override", "x-original-method", "x-forwarded-method"}
)
Headers = Sequence[tuple[str, str]]
#: Methods whose body no server is bound to read (RFC 9110 9.3.1-2): one sent with a body on a host with rules
#: is refused, since an endpoint that ignores the length leaves the body to be parsed as the next request.
BODILESS = frozenset({"GET", "HEAD"})
_PHP_NAME = str.maketrans(" .[", "___")  # what PHP turns into '_' in a parameter name


@dataclass(frozen=True)
class HttpRule:
    """Requests one rule allows: `methods`/`paths` None means any.

    Checked when made, whoever makes it (the parser, the daemon's decoder): a method in another case would
    never match, a path pattern in a spelling canonpath never produces would never match either.
    """

    methods: frozenset[str] | None
    paths: tuple[str, ...] | None
    origin: Origin
    websocket: bool = False  # its GETs may upgrade to WebSocket (whose frames no rule reads)

    def __post_init__(self) -> None:
        if (why := _rule_problem(self)) is not None:
            raise PolicyError(why, origin=self.origin if type(self.origin) is Origin else None)

    def describe(self) -> str:
        if self.methods == READ_ONLY and self.paths is None and not self.websocket:
            return "read-only"
        m = ",".join(sorted(self.methods)) if self.methods is not None else "any method"
        text = f"{m} {' '.join(self.paths)}" if self.paths is not None else m
        return text + (" websocket" if self.websocket else "")


@dataclass(frozen=True)
class RequestDecision:
    """A request rule's verdict on one HTTP request."""

    allowed: bool
    rule: str | None  # origin of the deciding rule, as the audit prints it; None when nothing allowed it
    reason: str


def _rule_problem(r: HttpRule) -> str | None:
    if type(r.origin) is not Origin:
        return f"an http rule's origin is an Origin record, not {type(r.origin).__name__}"
    if r.methods is not None and (
        type(r.methods) is not frozenset
        or not r.methods
        or not all(isinstance(m, str) and _TOKEN.fullmatch(m) and m == m.upper() for m in r.methods)
    ):
        return "methods must be null or a non-empty set of upper-case methods"
    if r.paths is not None and (type(r.paths) is not tuple or not r.paths or not all(map(_is_pattern, r.paths))):
        return "paths must be null or a non-empty tuple of canonical path patterns"
    websocket: object = r.websocket  # whoever built it may not have been type-checked
    if type(websocket) is not bool:
        return "websocket must be true or false"
    if r.websocket and r.methods is not None and "GET" not in r.methods:
        return "websocket needs GET among the methods: an upgrade is a GET"
    return None


def _is_pattern(p: object) -> bool:
    """A path pattern as rules hold it: from '/', no query, canonical with `*` read as a letter."""
    return isinstance(p, str) and p.startswith("/") and canonical_path(p.replace("*", "x")) == p.replace("*", "x")


# ---- parsing ------------------------------------------------------------------------------------


def parse_http(value: Any, source: str, line: int | None) -> tuple[HttpRule, ...]:
    """An entry's `http:` value: `read-only`, one rule mapping, or a list of either; `source` names the file."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PolicyError("'http' is empty: that would refuse every request; list rules or use read-only", line)
    return tuple(_parse_one(item, source, line_of(items, i) or line) for i, item in enumerate(items))


def _parse_one(item: Any, source: str, line: int | None) -> HttpRule:
    where = Origin(source, line)
    if item == "read-only":
        return HttpRule(READ_ONLY, None, where)
    if not isinstance(item, dict):
        raise PolicyError(f"an 'http' rule is read-only or a mapping with methods and paths, not {item!r}", line)
    for key in item:
        if key not in HTTP_RULE_KEYS:
            raise PolicyError(
                f"unknown key '{key}' in an http rule (expected methods, paths, websocket)", line_of(item, key)
            )
    if "methods" not in item and "paths" not in item:
        raise PolicyError("an http rule needs methods, paths or both", line)
    methods = _parse_methods(item["methods"], line_of(item, "methods") or line) if "methods" in item else None
    paths = _parse_paths(item["paths"], line_of(item, "paths") or line) if "paths" in item else None
    websocket = item.get("websocket", False)
    if not isinstance(websocket, bool):
        raise PolicyError("'websocket' is true or false", line_of(item, "websocket") or line)
    if websocket and methods is not None and "GET" not in methods:
        raise PolicyError("'websocket: true' needs GET among the methods: an upgrade is a GET", line)
    return HttpRule(methods, paths, where, websocket)


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
                f"path {p!r} is not canonical: no dot segments, ';' or backslashes; letters, digits and"
                " -._~!$&'()*+,=:@ as they are, anything else escaped in upper case (%20, %2F, %C3%A9)",
                where,
            )
        out.append(p)
    if not out:
        raise PolicyError("'paths' is empty; leave it out for any path", line)
    return tuple(out)


# ---- matching -----------------------------------------------------------------------------------


def canonical_path(target: str) -> str | None:
    """The path part of a request target as rules see it, or None when it is refused (netguard.canonpath)."""
    c = canonpath.canonical(target)
    return c.path if isinstance(c, canonpath.Canonical) else None


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*)", pattern)
    body = "".join("[^/]*" if p == "*" else ".*" if p == "**" else re.escape(p) for p in parts)
    return re.compile(body)


def path_matches(pattern: str, path: str) -> bool:
    """`*` within one segment, `**` across segments, everything else literal (after canonical_path)."""
    return _glob(pattern).fullmatch(path) is not None


def covers(rule: HttpRule, method: str, path: str, read: canonpath.Transform = canonpath.same) -> bool:
    """Whether `rule` covers `method` on `path` (one reading of a canonical path; its patterns read alike)."""
    if rule.methods is not None and method not in rule.methods:
        return False
    return rule.paths is None or any(path_matches(read(p), path) for p in rule.paths)


def _covering(rules: tuple[HttpRule, ...], method: str, c: canonpath.Canonical) -> HttpRule | None:
    """The rule covering the path as read, when every reading of it is covered by some rule; else None."""
    found = None
    for read, path in zip(c.transforms, c.readings, strict=True):
        hit = next((r for r in rules if covers(r, method, path, read)), None)
        if hit is None:
            return None
        found = found or hit
    return found


def _upgrade(headers: Headers) -> str | None:
    """The protocol an HTTP/1 request asks to switch to (lower case), or None.

    Every `Upgrade` header counts: with two (`websocket`, then `h2c`) an upstream may take the one a
    check that read the first did not judge, so several headers, like a list, are the whole value. An
    empty one is an upgrade too (to nothing a rule names): a server may switch on the field alone.
    """
    values = [v.strip().lower() for n, v in headers if n.lower() == "upgrade"]
    if not values:
        return None
    return ", ".join(values) if any(values) else "(empty)"  # an empty field still makes some servers switch


def _has_body(headers: Headers) -> bool:
    """The request says it carries a body: a Transfer-Encoding, or a Content-Length other than 0."""
    for n, v in headers:
        name = n.lower()
        if name == "transfer-encoding" or (name == "content-length" and v.strip() not in ("", "0")):
            return True
    return False


def _param_names(name: str) -> set[str]:
    """The names a server may give a query parameter: PHP decodes it, drops leading spaces, turns space
    and '.' into '_' and reads `_method[]` as `_method` (or an unclosed '[' as '_'); others keep them."""
    decoded = unquote_plus(name).lower()
    bases = {decoded, decoded.lstrip(" ")}
    bases |= {b.split("[", 1)[0] for b in bases}
    return bases | {b.translate(_PHP_NAME) for b in bases}


def _override(headers: Headers, target: str) -> str | None:
    """Why the request names another method than its own (a header or `_method` parameter), or None."""
    for name, _ in headers:
        if name.replace("_", "-").lower() in OVERRIDE_HEADERS:
            return f"a method-override header ({name}) is refused: send the method itself"
    query = target.split("?", 1)[1] if "?" in target else ""
    if any("_method" in _param_names(kv.split("=", 1)[0]) for kv in re.split("[&;]", query)):
        return "a '_method' query parameter (a method override) is refused: send the method itself"
    return None


def decide_request(
    rules: tuple[HttpRule, ...] | None, host: str, method: str, target: str, headers: Headers = ()
) -> RequestDecision:
    """Whether an inspected host takes this request; `rules` None: every request (inspect without http)."""
    c = canonpath.canonical(target)
    shown = target.split("?", 1)[0]
    if isinstance(c, canonpath.Refused):
        return RequestDecision(False, None, f"{method} {shown}: path is not canonical: {c.reason}")
    upgrade = _upgrade(headers)
    if upgrade is not None and upgrade != "websocket":
        return RequestDecision(
            False,
            None,
            f"{method} {shown}: an upgrade to {upgrade!r}: no rule reads that protocol"
            " (one Upgrade header, exactly websocket, is all a rule may allow)",
        )
    if upgrade is not None and rules is None:
        return RequestDecision(
            False, None, f"{method} {shown}: a WebSocket upgrade needs an http rule with websocket: true"
        )
    if (why := _override(headers, target)) is not None:  # on every inspected host: a credential rides it
        return RequestDecision(False, None, f"{method} {shown}: {why}")
    if rules is None:
        return RequestDecision(True, None, "inspected, every request allowed")
    if method in BODILESS and _has_body(headers):
        return RequestDecision(
            False,
            None,
            f"{method} {shown}: a {method} with a body is refused: an upstream that ignores its length would"
            " read the body as a request no rule judged (CL.0 request smuggling)",
        )
    r = _covering(tuple(r for r in rules if r.websocket) if upgrade else rules, method, c)
    if r is not None:
        return RequestDecision(True, str(r.origin), f"allowed by http rule {r.describe()}")
    allowed = "; ".join(r.describe() for r in rules)
    what = "a WebSocket upgrade of " if upgrade else ""
    return RequestDecision(False, None, f"{what}{method} {shown} not allowed on {host} (allowed: {allowed})")
