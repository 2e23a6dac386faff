"""The one form of a request path that every server reads the same way; anything else is refused. Pure.

The threat: a request rule matches the path as sandgate reads it, the upstream acts on the path as
*it* reads it, and servers disagree. nginx decodes `%2F` and then resolves `..`; Tomcat and Spring
drop `;parameters` so `..;` is `..`; IIS reads `\\` as `/`, decodes twice and folds look-alike
characters (U+FF0E) to ASCII; Apache's rewrite cuts at a decoded `%3F`. With `GET /v1/**`,
`/v1/..%2fadmin` reached `/admin` on such an upstream, with the brokered credential attached.

So a path is not decoded into a guess of what the upstream means: it must *already* be in a form
on which those decodings change nothing, or it is refused before any rule looks at it:

- only RFC 3986 path characters appear as they are: letters, digits, `-._~!$&'()*+,=:@/`; no `;`
  (path parameters), no `\\`, no control byte, no `#`, space or raw non-ASCII byte;
- a percent-escape never spells `.`, `\\`, `;`, `%` (an escape of an escape: a second decoding
  reads another path) or a control byte; escaped non-ASCII is valid, shortest-form UTF-8 (no
  `%C0%AE`) and no character whose compatibility form holds `.` `/` `\\` `;` `%` `?` `#`;
- no segment is all dots (`.`, `..`, `...`), however the path is read (below), also once blanks a
  server may trim or drop are left out (`..%20`, `..%C2%A0`, `.%E2%80%8B.`, `..%EF%BB%BF`).

Three escapes keep a meaning some servers give them and others do not: `%2F` (a `/` inside a
segment: npm's `/@scope%2fname`), `%3F` and `%23`. A path holding one has several *readings*:
the escape as data in its segment, `%2F` read as `/`, and the path cut at a decoded `?`/`#`; each
also with runs of `/` merged into one (nginx's merge_slashes). netguard.httprules allows such a
request only when the rules allow every reading (each pattern read the same way), so an escaped
slash passes where the rules do not depend on where segments end (`read-only`, `/-/npm/v1/**`) and
is refused where they do (`/*/*/git-upload-pack`).

The canonical path (`readings[0]`, what rules match) is the path in one normal form: escapes of
the characters above decoded (`%41` is `A`, `%40` is `@`), every other escape in upper case
(`%20`, `%2F`, `%C3%A9`). Rule patterns are written in that form.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

#: Characters a path may hold as they are (RFC 3986 pchar and '/', less ';').
_LITERAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,=:@/")
_HEX = frozenset("0123456789abcdefABCDEF")
#: Escapes that some servers read as structure and others as data: each gives readings (module docstring).
KEPT = ("%2F", "%3F", "%23")
#: Escaped ASCII that is refused, with why.
_REFUSED_ESCAPE = {
    0x2E: "an escaped '.' (%2E): servers decode it before resolving '..'; send dots as they are",
    0x5C: "an escaped backslash (%5C): IIS and others read '\\' as '/'",
    0x3B: "an escaped ';' (%3B): Tomcat and Spring strip ';' path parameters, some after decoding",
    0x25: "an escaped '%' (%25): a server that decodes twice reads another path",
}
#: What a character may not turn into under Unicode compatibility folding (IIS best-fit, NFKC).
_STRUCTURAL = frozenset("./\\;%?#")
#: Look-alikes Windows' best-fit conversion to an ANSI code page folds to a separator, though NFKC
#: keeps them (division and fraction slash, set minus, and the yen and won signs, which cp932 and
#: cp949 show as '\\').
_BEST_FIT = frozenset("\u2215\u2044\u2216\u29f5\u00a5\u20a9")
Transform = Callable[[str], str]  # one reading of a path, applied alike to rule patterns
_SLASHES = re.compile(r"/{2,}")
_CUT = re.compile(r"%3F|%23")


@dataclass(frozen=True)
class Canonical:
    """An accepted path: the canonical form and every reading a server may make of it (readings[0] is it)."""

    path: str
    readings: tuple[str, ...]
    transforms: tuple[Transform, ...]  # reading i = transforms[i](path): patterns are read alike


@dataclass(frozen=True)
class Refused:
    """A request target refused before any rule matches, and why."""

    reason: str


def canonical(target: str) -> Canonical | Refused:
    """The path part of a request target (query cut at the first raw '?') checked and read, or why not."""
    path = target.split("?", 1)[0]
    if not path.startswith("/"):
        return Refused("it does not start with '/'")
    decoded = _decode(path)
    if isinstance(decoded, Refused):
        return decoded
    transforms = _transforms(decoded)
    readings = tuple(t(decoded) for t in transforms)
    for r in readings:
        if any(_dots(seg) for seg in r.split("/")):
            return Refused(_dots_reason(r, decoded))
    return Canonical(decoded, readings, transforms)


def _dots(segment: str) -> bool:
    """A segment of dots only ('.', '..', '...'), also padded with blanks anywhere: Windows trims '..%20',
    and servers that trim Unicode spaces or drop invisible characters read '..%C2%A0', '.%E2%80%8B.'
    or '..%EF%BB%BF' as '..'."""
    if "." not in segment:
        return False
    rest = [c for c in unquote(segment) if not _blank(c)]  # canonical: escapes here are valid UTF-8
    return set(rest) == {"."}


def _blank(c: str) -> bool:
    """A character some server ignores or trims: white space once folded (NBSP, U+3000), a space
    separator, a format character (zero-width space, BOM) or a control character."""
    return unicodedata.category(c) in ("Zs", "Cf", "Cc") or unicodedata.normalize("NFKC", c).isspace()


def _dots_reason(reading: str, path: str) -> str:
    if reading == path:
        return "a segment of dots only ('.', '..', also padded with blanks): the upstream resolves it to another path"
    return f"a segment of dots only once read as {reading!r} (an escaped '/', '?' or '#' decoded, '//' merged)"


def _decode(path: str) -> str | Refused:
    """`path` in its normal form (escapes of path characters decoded, every other escape in upper case),
    or why it is not canonical."""
    out: list[str] = []
    pending = bytearray()  # escaped bytes >= 0x80: one UTF-8 sequence, checked whole
    i = 0
    while i < len(path):
        ch = path[i]
        if ch != "%":
            if pending and (why := _flush(pending, out)):
                return Refused(why)
            if ch not in _LITERAL:
                return Refused(_literal_reason(ch))
            out.append(ch)
            i += 1
            continue
        code = path[i + 1 : i + 3]
        if len(code) < 2 or not set(code) <= _HEX:
            return Refused(f"a bad percent-escape {path[i : i + 3]!r}")
        b = int(code, 16)
        i += 3
        if b >= 0x80:
            pending.append(b)
            continue
        if pending and (why := _flush(pending, out)):
            return Refused(why)
        if b in _REFUSED_ESCAPE:
            return Refused(_REFUSED_ESCAPE[b])
        if b < 0x20 or b == 0x7F:
            return Refused(f"an escaped control byte (%{b:02X})")
        out.append(chr(b) if chr(b) in _LITERAL and b != 0x2F else f"%{b:02X}")  # %41 is A; %20 stays
    if pending and (why := _flush(pending, out)):
        return Refused(why)
    return "".join(out)


def _flush(pending: bytearray, out: list[str]) -> str:
    """Decode the escaped non-ASCII bytes into `out`; why they are refused, or "" when they are fine."""
    raw = bytes(pending)
    pending.clear()
    try:
        text = raw.decode("utf-8")  # strict: overlong forms (%C0%AE), surrogates, > U+10FFFF are errors
    except UnicodeDecodeError:
        return f"invalid or overlong UTF-8 {''.join(f'%{b:02X}' for b in raw)}: some servers read it as '.' or '/'"
    for c in text:
        if unicodedata.category(c) == "Cc":
            return f"an escaped control character U+{ord(c):04X}"
        folded = unicodedata.normalize("NFKC", c)
        if set(folded) & _STRUCTURAL or c in _BEST_FIT:
            return (
                f"U+{ord(c):04X} ({unicodedata.name(c, '?')}) may be read as a separator or a dot (IIS best-fit, NFKC)"
            )
    out.append("".join(f"%{b:02X}" for b in raw))
    return ""


def _literal_reason(ch: str) -> str:
    if ch == ";":
        return "a ';' path parameter: Tomcat and Spring read '..;' as '..'"
    if ch == "\\":
        return "a backslash: IIS and others read it as '/'"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"a control byte (0x{ord(ch):02X})"
    if ch == "#":
        return "a '#' in the request target (a fragment is never sent)"
    if ord(ch) > 0x7F:
        return "a raw non-ASCII character: percent-encode it as UTF-8"
    return f"a raw {ch!r}: percent-encode it"


# ---- readings --------------------------------------------------------------------------------------


def same(p: str) -> str:
    """The path as it is: the canonical reading."""
    return p


def _slashed(p: str) -> str:
    """nginx, IIS, Apache with AllowEncodedSlashes: %2F is a separator."""
    return p.replace("%2F", "/")


def _cut(p: str) -> str:
    """A server that decodes, then finds the query or fragment (Apache rewrite confusion); %2F stays data."""
    return _CUT.split(p, maxsplit=1)[0]


def _slashed_cut(p: str) -> str:
    """The same server decoding %2F too."""
    return _cut(_slashed(p))


def _merged(t: Transform) -> Transform:
    def merged(p: str) -> str:
        return _SLASHES.sub("/", t(p))

    return merged


_ALL = (same, _slashed, _cut, _slashed_cut)
_MERGED = tuple(_merged(t) for t in _ALL)


def _transforms(path: str) -> tuple[Transform, ...]:
    """The readings that can differ for this path: only `same` for the common path (no kept escape, no '//')."""
    kept = any(k in path for k in KEPT)
    if not kept and "//" not in path:
        return (same,)
    return (*(_ALL if kept else (same,)), *(_MERGED if kept else (_MERGED[0],)))
