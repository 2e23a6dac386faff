"""netguard/canonpath.py: a path passes only in the one form every server reads the same way (issue 24).

The servers are modelled here, independently of the code under test, by what they are known to do
to a path before routing it: nginx decodes every escape (`%2F` too), merges `//` and resolves dot
segments; Tomcat and Spring strip `;parameters` before and after decoding; IIS decodes twice, reads
`\\` as `/`, folds look-alike characters (NFKC, best-fit) and trims trailing spaces; Apache's rewrite
cuts at a decoded `?`; lenient decoders take overlong UTF-8. The property, checked exhaustively over
short paths and by hypothesis over long ones: whatever a model makes of an accepted path is exactly
one of its readings, decoded. So the model's normalising steps (dots, parameters, backslashes,
folding, double decoding) change nothing, and the rules, which judge every reading, judged what
the server acts on.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netguard.canonpath import Canonical, Refused, canonical

from ..support.spellings import ISSUE_SPELLINGS

# ---- server models ------------------------------------------------------------------------------

#: Best-fit folds of Windows ANSI code pages that NFKC does not make (cp932 shows U+00A5 as '\\').
BEST_FIT = {"\u2215": "/", "\u2044": "/", "\u2216": "\\", "\u29f5": "\\", "\u00a5": "\\", "\u20a9": "\\"}


def lenient_utf8(data: bytes) -> str:
    """A decoder that accepts overlong forms (old IIS, some Java): %C0%AE is '.'; else latin-1 per byte."""
    out, i = [], 0
    while i < len(data):
        b = data[i]
        if 0xC0 <= b <= 0xDF and i + 1 < len(data) and data[i + 1] & 0xC0 == 0x80:
            out.append(chr(((b & 0x1F) << 6) | (data[i + 1] & 0x3F)))
            i += 2
        elif 0xE0 <= b <= 0xEF and i + 2 < len(data) and data[i + 1] & 0xC0 == 0x80 and data[i + 2] & 0xC0 == 0x80:
            out.append(chr(((b & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)))
            i += 3
        else:
            out.append(chr(b))
            i += 1
    return "".join(out)


def decode(text: str) -> str:
    """Every valid %XX decoded (invalid ones left), bytes read leniently."""
    raw = re.sub(rb"%([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8", "surrogateescape"))
    return lenient_utf8(raw)


def invisible_trim(seg: str) -> str:
    """What a server that trims Unicode white space (Java's strip, .NET's Trim) and drops invisible
    format characters (zero-width space, BOM, as text normalisers do) compares to '..'."""
    return "".join(c for c in seg if unicodedata.category(c) != "Cf").strip()


def resolve(path: str, windows: bool = False, trim: Callable[[str], str] | None = None) -> str:
    """RFC 3986 remove_dot_segments; Windows also trims trailing spaces and reads '...' as '..';
    `trim`: what the server compares to '.' and '..' (the segment it keeps is the untrimmed one)."""
    out: list[str] = []
    segs = path.split("/")
    for i, seg in enumerate(segs):
        s = seg.rstrip(" ") if windows else trim(seg) if trim else seg
        last = i == len(segs) - 1
        if s == "." or (windows and s and not s.strip(".") and s != ".."):
            if last:
                out.append("")
            continue
        if s == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
            continue
        out.append(seg)
    return "/".join(out) if out and out[0] == "" else "/" + "/".join(out)


def nginx(t: str) -> str:
    return resolve(re.sub("/{2,}", "/", decode(t).replace("\\", "/")))


def tomcat(t: str) -> str:
    def strip_params(p: str) -> str:
        return "/".join(seg.split(";", 1)[0] for seg in p.split("/"))

    return resolve(strip_params(decode(strip_params(t))))  # Tomcat before decoding, Spring after


def iis(t: str) -> str:
    once = decode(t)
    twice = decode(once)
    folded = "".join(BEST_FIT.get(c, unicodedata.normalize("NFKC", c)) for c in twice)
    return resolve(folded.replace("\\", "/"), windows=True)


def apache_rewrite(t: str) -> str:
    return resolve(re.split("[?#]", decode(t), maxsplit=1)[0])


def trimming(t: str) -> str:
    return resolve(decode(t), trim=invisible_trim)


SERVERS: dict[str, Callable[[str], str]] = {
    "nginx": nginx,
    "tomcat": tomcat,
    "iis": iis,
    "apache": apache_rewrite,
    "trimming": trimming,
}


def views(c: Canonical) -> set[str]:
    """The readings as a server sees them (every escape decoded): what rules were checked against."""
    return {decode(r) for r in c.readings} | {unicodedata.normalize("NFKC", decode(r)) for r in c.readings}


def assert_read_alike(target: str) -> None:
    c = canonical(target)
    if isinstance(c, Refused):
        assert c.reason
        return
    assert c.readings[0] == c.path and canonical(c.path) == c  # the canonical form is a fixed point
    seen = views(c)
    path = target.split("?", 1)[0]  # every server finds the query first, at the first raw '?'
    for name, server in SERVERS.items():
        got = server(path)
        assert got in seen, (target, name, got, seen)


# ---- exhaustive over short paths, hypothesis over long ones ----------------------------------------

TOKENS = (
    "/", ".", "..", "a", "%2f", "%2F", "%2e", "%5c", "%25", "%3b", ";", "\\", "%41", "%c0%ae", "%c3%a9",
    "%ef%bc%8e", "%3f", "%23", "%20", "%e2%88%95", "%00", "#", "~",
)  # fmt: skip


#: Blanks a server may trim or drop around dots: spaces (NBSP, EN QUAD, ideographic), format
#: characters (zero-width space, BOM, word joiner, Mongolian vowel separator), controls (NEL).
BLANKS = (
    "%20", "%c2%a0", "%e2%80%80", "%e3%80%80", "%e2%80%8b", "%ef%bb%bf", "%e2%81%a0", "%e1%a0%8e", "%c2%85",
    "%e2%80%a8", "%e2%80%af",
)  # fmt: skip


def test_every_short_path_is_refused_or_read_alike_by_every_server() -> None:
    n = 0
    for k in range(5):
        for parts in itertools.product(TOKENS, repeat=k):
            assert_read_alike("/" + "".join(parts))
            n += 1
    assert n == sum(len(TOKENS) ** k for k in range(5))


def test_every_short_segment_of_dots_and_blanks_is_refused_or_read_alike() -> None:
    """Issue 24's review: '..%C2%A0' reached the upstream; a server trimming it read '..'."""
    alphabet = (".", "a", "/", *BLANKS)
    n = 0
    for k in range(1, 5):
        for parts in itertools.product(alphabet, repeat=k):
            target = "/v1/" + "".join(parts) + "/admin"
            assert_read_alike(target)
            c = canonical(target)
            if isinstance(c, Canonical):  # an accepted path never holds a segment of dots and blanks
                assert not any("." in seg and not invisible_trim(decode(seg)).strip(".") for seg in c.path.split("/"))
            n += 1
    assert n == sum(len(alphabet) ** k for k in range(1, 5))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS + BLANKS), max_size=12).map("".join))
def test_every_long_path_is_refused_or_read_alike_by_every_server(tail: str) -> None:
    assert_read_alike("/" + tail)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=16))
def test_arbitrary_text_never_breaks_the_check(tail: str) -> None:
    assert_read_alike("/" + tail)


# ---- the issue's spellings, and what must still pass -------------------------------------------


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("/v1/..%2fadmin", "dots only once read as '/v1/../admin'"),
        ("/v1/a%2f..%2f..%2fadmin", "dots only once read as"),
        ("/v1/%2e%2e%2fadmin", "escaped '.'"),
        ("/v1/%2E%2E/admin", "escaped '.'"),
        ("/v1/a%2Eb", "escaped '.'"),  # in the middle of a segment too
        ("/v1/..%5cadmin", "backslash"),
        ("/v1/..%5Cadmin", "backslash"),
        ("/v1/..\\admin", "backslash"),
        ("/v1/..;/admin", "';' path parameter"),
        ("/v1/x;jsessionid=1", "';' path parameter"),
        ("/v1/..%3b/admin", "escaped ';'"),
        ("/v1/%252e%252e/admin", "escaped '%'"),
        ("/v1/%25", "escaped '%'"),
        ("/v1/%c0%ae%c0%ae/admin", "overlong UTF-8 %C0%AE%C0%AE"),
        ("/v1/%e0%80%ae", "overlong"),
        ("/v1/%c0%af", "overlong"),
        ("/v1/%ed%a0%80", "invalid"),  # a surrogate
        ("/v1/%ff", "invalid"),
        ("/v1/%c3", "invalid"),  # a sequence cut short
        ("/v1/%ef%bc%8e%ef%bc%8e/admin", "U+FF0E"),
        ("/v1/%e2%80%a5/admin", "U+2025"),  # TWO DOT LEADER: NFKC '..'
        ("/v1/%ef%bc%8fadmin", "U+FF0F"),
        ("/v1/%e2%88%95admin", "U+2215"),  # best-fit '/'
        ("/v1/%c2%a5admin", "U+00A5"),  # cp932 '\\'
        ("/v1/%00", "control byte"),
        ("/v1/%0d%0a", "control byte"),
        ("/v1/%c2%85", "control character U+0085"),
        ("/v1/\x00", "control byte"),
        ("/v1/\x7f", "control byte"),
        ("/v1/ok#/../../admin", "'#'"),
        ("/v1/a b", "raw ' '"),
        ("/v1/{x}", "raw '{'"),
        ("/v1/caf\u00e9", "raw non-ASCII"),
        ("/v1/%zz", "bad percent-escape"),
        ("/v1/%4", "bad percent-escape"),
        ("/v1/.", "dots only"),
        ("/v1/../admin", "dots only"),
        ("/v1/.../admin", "dots only"),
        ("/v1/..%20/admin", "dots only"),  # Windows trims the space
        ("/v1/..%C2%A0/admin", "dots only"),  # NO-BREAK SPACE: reached the upstream before
        ("/v1/..%c2%a0/admin", "dots only"),
        ("/v1/..%E2%80%80/admin", "dots only"),  # EN QUAD
        ("/v1/..%E3%80%80/admin", "dots only"),  # IDEOGRAPHIC SPACE
        ("/v1/.%E2%80%8B./admin", "dots only"),  # ZERO WIDTH SPACE between the dots
        ("/v1/..%EF%BB%BF/admin", "dots only"),  # BOM
        ("/v1/%EF%BB%BF../admin", "dots only"),  # leading
        ("/v1/%C2%A0.%E2%80%8B.%E3%80%80/admin", "dots only"),  # around and between
        ("/v1/.%E2%81%A0/admin", "dots only"),  # WORD JOINER after a single dot
        ("/v1/..%E2%80%A8/admin", "dots only"),  # LINE SEPARATOR (Zl, white space)
        ("/v1/..%E2%80%AF/admin", "dots only"),  # NARROW NO-BREAK SPACE
        ("/v1/..%E1%A0%8E/admin", "dots only"),  # MONGOLIAN VOWEL SEPARATOR (Cf)
        ("/v1/..%C2%A0%3F", "dots only"),  # cut at the decoded '?' as well
        ("/v1/x%3f/../admin", "dots only"),
        ("/v1/..%3f", "dots only once read as '/v1/..'"),  # cut at the decoded '?'
        ("/v1/..%23", "dots only once read as"),
        ("v1/ok", "start with '/'"),
        ("*", "start with '/'"),
        ("", "start with '/'"),
    ],
)
def test_ambiguous_spellings_are_refused_with_their_reason(target: str, why: str) -> None:
    c = canonical(target)
    assert isinstance(c, Refused) and why in c.reason, (target, c)


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/v1/ok", "/v1/ok"),
        ("/v1/ok?x=/../admin;a\\b#c", "/v1/ok"),  # the query is not the path
        ("/%41%62c%7e", "/Abc~"),  # escapes of path characters are decoded
        ("/%40types%2fnode", "/@types%2Fnode"),  # npm scoped names: '@' decoded, the escaped '/' kept
        ("/@types%2Fnode", "/@types%2Fnode"),
        ("/a%20b", "/a%20b"),
        ("/caf%c3%a9", "/caf%C3%A9"),  # valid UTF-8, kept escaped (upper case)
        ("/a%3fb%23c", "/a%3Fb%23c"),
        ("/name-1.0.0.tgz", "/name-1.0.0.tgz"),
        ("/.well-known/x", "/.well-known/x"),  # a dot starting a name is no dot segment
        ("/a..b/c.", "/a..b/c."),
        ("/v1/a%C2%A0b", "/v1/a%C2%A0b"),  # a blank beside other characters is no dot segment
        ("/v1/.%C2%A0a", "/v1/.%C2%A0a"),
        ("/v1/%E2%80%8B", "/v1/%E2%80%8B"),  # blanks only: no dots to resolve
        ("/v1/%20", "/v1/%20"),
        ("//x", "//x"),
        ("/", "/"),
        ("/org.couchdb.user:me/-rev/1-abc", "/org.couchdb.user:me/-rev/1-abc"),
        ("/v2/library/ubuntu/manifests/sha256:00ff", "/v2/library/ubuntu/manifests/sha256:00ff"),
        ("/github.com/!azure/x/@v/list", "/github.com/!azure/x/@v/list"),
    ],
)
def test_legitimate_paths_pass_in_their_canonical_form(target: str, path: str) -> None:
    c = canonical(target)
    assert isinstance(c, Canonical) and c.path == path, c


def test_the_common_path_has_one_reading_an_escaped_slash_several() -> None:
    plain = canonical("/v1/items/x")
    assert isinstance(plain, Canonical) and plain.readings == ("/v1/items/x",)
    npm = canonical("/@scope%2fname")
    assert isinstance(npm, Canonical)
    assert set(npm.readings) == {"/@scope%2Fname", "/@scope/name"}
    cut = canonical("/files/a%3Fb")
    assert isinstance(cut, Canonical) and "/files/a" in cut.readings
    merged = canonical("//o/r")
    assert isinstance(merged, Canonical) and set(merged.readings) == {"//o/r", "/o/r"}


def test_a_real_server_model_would_have_been_fooled_by_each_issue_spelling() -> None:
    """The control for the refusals: the models really read each of the issue's spellings as /admin."""
    for target in ISSUE_SPELLINGS:
        assert isinstance(canonical(target), Refused), target
        assert any(server(target) == "/admin" for server in SERVERS.values()), target


@pytest.mark.parametrize(
    "target", ["/v1/..%C2%A0/admin", "/v1/..%E2%80%80/admin", "/v1/..%E3%80%80/admin", "/v1/.%E2%80%8B./admin",
               "/v1/..%EF%BB%BF/admin"],
)  # fmt: skip
def test_a_trimming_server_would_have_read_each_blank_padded_dot_segment_as_dot_dot(target: str) -> None:
    """The control for the review's blank-padded dots: a server that trims them reads /admin."""
    assert trimming(target) == "/admin" and nginx(target) != "/admin"
    assert isinstance(canonical(target), Refused)
