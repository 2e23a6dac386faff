"""Tests for netguard.hosts: every spelling of a destination must normalise to one value.

Table-driven examples pin each rule; hypothesis properties check that the rules hold for
generated names and addresses.  Hypothesis runs derandomized and without a database so the
suite is deterministic.
"""

from __future__ import annotations

import re
import socket
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from netguard.hosts import (
    Address,
    HostError,
    is_subdomain,
    normalise,
    normalise_name,
    parents,
    parse_ip,
    split_host_port,
)

PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

V4 = IPv4Address
V6 = IPv6Address
LOOPBACK = V4("127.0.0.1")
CANONICAL_LABEL = re.compile(r"[a-z0-9_-]{1,63}")


# --- names -----------------------------------------------------------------------------------

NAME_CASES = [
    ("pypi.org", "pypi.org"),
    ("PyPI.ORG", "pypi.org"),
    ("pypi.org.", "pypi.org"),
    ("PYPI.ORG.", "pypi.org"),
    ("localhost", "localhost"),
    ("localhost.", "localhost"),
    ("a", "a"),
    ("_dmarc.example.com", "_dmarc.example.com"),
    ("_acme-challenge.Example.com", "_acme-challenge.example.com"),
    ("a-b.c_d.e", "a-b.c_d.e"),
    ("-leading.example", "-leading.example"),  # only [a-z0-9_-]{1,63} is required
    ("ab--cd.example", "ab--cd.example"),  # reserved-LDH but not xn--: plain ASCII label
    ("r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com"),
    ("123.example", "123.example"),  # numeric labels are fine unless last
    ("0x7f.example", "0x7f.example"),
    ("foo.0x1g", "foo.0x1g"),  # last label not a valid hex number: a name
    ("0x0x", "0x0x"),
    ("0x0x1", "0x0x1"),
    ("1.0xg", "1.0xg"),  # not a valid hex number, so not IPv4 (inet_aton agrees)
    ("-1", "-1"),
    ("1.2.3.-4", "1.2.3.-4"),
    ("1.2.3.1_0", "1.2.3.1_0"),  # int() would accept "1_0"; IPv4 parsing must not
    ("foo.1a", "foo.1a"),
    ("foo.a1", "foo.a1"),
    ("x" * 63 + ".com", "x" * 63 + ".com"),
    (".".join(["a" * 63] * 3 + ["b" * 61]), ".".join(["a" * 63] * 3 + ["b" * 61])),  # 253
    (".".join(["a" * 63] * 3 + ["b" * 61]) + ".", ".".join(["a" * 63] * 3 + ["b" * 61])),
]


@pytest.mark.parametrize(("host", "expected"), NAME_CASES)
def test_names(host: str, expected: str) -> None:
    result = normalise(host)
    assert type(result) is str
    assert result == expected
    assert normalise_name(host) == expected
    assert parse_ip(host) is None


IDNA_CASES = [
    ("bücher.example", "xn--bcher-kva.example"),
    ("BÜCHER.example", "xn--bcher-kva.example"),
    ("Bücher.Example.", "xn--bcher-kva.example"),
    ("ｂüｃｈｅｒ.example", "xn--bcher-kva.example"),  # fullwidth letters
    ("ＢÜＣＨＥＲ．ＥＸＡＭＰＬＥ", "xn--bcher-kva.example"),  # fullwidth upper + fullwidth dot
    ("bücher。example", "xn--bcher-kva.example"),  # ideographic full stop
    ("bücher｡example", "xn--bcher-kva.example"),  # halfwidth ideographic full stop
    ("bücher.example。", "xn--bcher-kva.example"),  # mapped trailing dot
    ("bu\u0308cher.example", "xn--bcher-kva.example"),  # decomposed ü -> NFC
    ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("XN--BCHER-KVA.EXAMPLE", "xn--bcher-kva.example"),
    ("ｐｙｐｉ.org", "pypi.org"),  # fullwidth ASCII maps to plain ASCII
    ("pypi\u00ad.org", "pypi.org"),  # soft hyphen is ignored by UTS #46
    ("straße.de", "xn--strae-oqa.de"),  # non-transitional: ß is kept, not mapped to ss
    ("xn--strae-oqa.de", "xn--strae-oqa.de"),
    ("_dmarc.bücher.example", "_dmarc.xn--bcher-kva.example"),  # ASCII labels judged alone
    ("ab--cd.bücher.example", "ab--cd.xn--bcher-kva.example"),
    ("münchen.de", "xn--mnchen-3ya.de"),
    ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
]


@pytest.mark.parametrize(("host", "expected"), IDNA_CASES)
def test_idna(host: str, expected: str) -> None:
    assert normalise(host) == expected
    assert normalise(expected) == expected


# --- IPv6 ------------------------------------------------------------------------------------

IPV6_CASES: list[tuple[str, Address]] = [
    ("::1", V6("::1")),
    ("[::1]", V6("::1")),
    ("0:0:0:0:0:0:0:1", V6("::1")),
    ("[0000:0000:0000:0000:0000:0000:0000:0001]", V6("::1")),
    ("::", V6("::")),
    ("[::]", V6("::")),
    ("2001:DB8::1", V6("2001:db8::1")),
    ("[2001:db8:0:0:0:0:0:1]", V6("2001:db8::1")),
    ("2001:0db8:85a3:0000:0000:8a2e:0370:7334", V6("2001:db8:85a3::8a2e:370:7334")),
    ("FE80::1", V6("fe80::1")),
    # IPv4-mapped: the IPv4 address, so IPv4 rules and guards apply.
    ("::ffff:1.2.3.4", V4("1.2.3.4")),
    ("::ffff:0102:0304", V4("1.2.3.4")),
    ("::FFFF:102:304", V4("1.2.3.4")),
    ("[::FFFF:1.2.3.4]", V4("1.2.3.4")),
    ("[::ffff:127.0.0.1]", LOOPBACK),
    ("0:0:0:0:0:ffff:7f00:1", LOOPBACK),
    ("[0000:0000:0000:0000:0000:FFFF:7F00:0001]", LOOPBACK),
    # Deprecated IPv4-compatible and other embeddings stay IPv6.
    ("::1.2.3.4", V6("::102:304")),
    ("[::1.2.3.4]", V6("::102:304")),
    ("64:ff9b::1.2.3.4", V6("64:ff9b::102:304")),
    ("::ffff:0:1.2.3.4", V6("::ffff:0:102:304")),
]


@pytest.mark.parametrize(("host", "expected"), IPV6_CASES)
def test_ipv6(host: str, expected: Address) -> None:
    result = normalise(host)
    assert result == expected
    assert type(result) is type(expected)
    assert parse_ip(host) == expected


# --- IPv4 ------------------------------------------------------------------------------------

IPV4_CASES: list[tuple[str, IPv4Address]] = [
    ("127.0.0.1", LOOPBACK),
    ("127.0.0.1.", LOOPBACK),
    ("2130706433", LOOPBACK),
    ("2130706433.", LOOPBACK),
    ("0x7f000001", LOOPBACK),
    ("0X7F000001", LOOPBACK),
    ("0x00000000007f000001", LOOPBACK),
    ("017700000001", LOOPBACK),
    ("0177.0.0.1", LOOPBACK),
    ("0177.0000.00.01", LOOPBACK),
    ("0x7f.0x0.0x0.0x1", LOOPBACK),
    ("0x7F.0X0.0.1", LOOPBACK),
    ("127.1", LOOPBACK),
    ("127.0.1", LOOPBACK),
    ("0x7f.1", LOOPBACK),
    ("0177.1", LOOPBACK),
    ("127.0x1", LOOPBACK),
    ("127.000001", LOOPBACK),
    ("127.0.0x1", LOOPBACK),
    ("0x7f.0.0.1.", LOOPBACK),
    ("１２７.０.０.１", LOOPBACK),  # fullwidth digits map to ASCII first
    ("１２７。０。０。１", LOOPBACK),
    ("０ｘ７ｆ.１", LOOPBACK),
    ("0", V4("0.0.0.0")),
    ("0x", V4("0.0.0.0")),  # WHATWG: empty hex is 0
    ("0X", V4("0.0.0.0")),
    ("0x.0x.0x.0x", V4("0.0.0.0")),
    ("00", V4("0.0.0.0")),
    ("1", V4("0.0.0.1")),
    ("4294967295", V4("255.255.255.255")),
    ("0xffffffff", V4("255.255.255.255")),
    ("037777777777", V4("255.255.255.255")),
    ("255.255.255.255", V4("255.255.255.255")),
    ("1.16777215", V4("1.255.255.255")),
    ("1.2.65535", V4("1.2.255.255")),
    ("1.2.3.", V4("1.2.0.3")),
    ("1.2.3.255", V4("1.2.3.255")),
    ("10.1", V4("10.0.0.1")),
    ("192.168.257", V4("192.168.1.1")),
    ("169.254.169.254", V4("169.254.169.254")),
    ("0xa9fea9fe", V4("169.254.169.254")),
    ("2852039166", V4("169.254.169.254")),
]


@pytest.mark.parametrize(("host", "expected"), IPV4_CASES)
def test_ipv4(host: str, expected: IPv4Address) -> None:
    result = normalise(host)
    assert type(result) is IPv4Address
    assert result == expected
    assert parse_ip(host) == expected


# --- errors ----------------------------------------------------------------------------------

ERROR_CASES = [
    # emptiness and dots
    "",
    ".",
    "..",
    "a..b",
    ".a",
    ".a.",
    "pypi.org..",
    "pypi..org.",
    "。",
    "pypi.org.。",
    "\u00ad",  # maps to nothing
    # whitespace and control characters, anywhere
    " pypi.org",
    "pypi.org ",
    "pypi .org",
    "\tpypi.org",
    "pypi.org\n",
    "pypi.org\r\n",
    "pypi.org\x00",
    "pypi\x7f.org",
    "pypi\x85.org",
    "pypi\u00a0.org",
    "pypi\u3000.org",
    "pypi\u2028.org",
    " 127.0.0.1",
    "127.0.0.1 ",
    "[::1] ",
    # characters that are never in a label
    "pypi.org/",
    "user@pypi.org",
    "pypi.org%2e",
    "pypi%2eorg",
    "pypi!.org",
    "pypi*.org",
    "*.pypi.org",
    "pypi\\.org",
    "pypi.org]",
    "a]b",
    "pypi\u202e.org",  # bidi override
    "pypi\ud800.org",  # lone surrogate
    "\U0001f600.com",  # emoji: not IDNA 2008
    "ａ／ｂ.com",  # fullwidth solidus maps to "/"
    "a\u00a8b.com",  # maps to a space + combining mark
    "［::1］",  # fullwidth brackets are not brackets
    "fe80：：1",
    # length
    "x" * 64 + ".com",
    "com." + "x" * 64,
    ".".join(["a" * 63] * 3 + ["b" * 62]),  # 254
    ".".join(["a" * 63] * 4),
    "a." * 127 + "a",  # 255
    "a" * 2000,
    "ü" * 64 + ".com",  # A-label too long
    # punycode
    "xn--zz",
    "xn--zz.com",
    "www.xn--zz.com",
    "xn--",
    "xn--.com",
    "xn--abc-",  # decodes to ASCII
    "xn--bcher-kva-",
    "xn--a-ecp.com",  # decodes to a disallowed character
    "xn--bcher-2pa.example",  # decodes to "bÜcher": not a mapped (lowercase) form
    "xn--ls8h.com",  # emoji A-label
    # IPv6
    "[]",
    "[",
    "]",
    "[::1",
    "::1]",
    "[::1]:80",
    "[::1].",
    "::1.",
    "[[::1]]",
    "[1.2.3.4]",
    "[pypi.org]",
    "[v1.abc]",
    "[::g]",
    ":",
    ":::",
    "1:2:3:4:5:6:7:8:9",
    "12345::1",
    "::ffff:1.2.3",
    "::ffff:01.2.3.4",
    "::ffff:0x7f.1",
    "::ffff:256.1.1.1",
    "1::2::3",
    "fe80::1%eth0",
    "fe80::1%25eth0",
    "[fe80::1%eth0]",
    "[fe80::1%25eth0]",
    "[::1%1]",
    "pypi.org:443",
    "127.0.0.1:80",
    "::１",
    # IPv4: numeric last label means IPv4 or nothing
    "1.2.3.4.5",
    "1.2.3.4.5.",
    "0.0.0.0.0",
    "foo.123",
    "pypi.org.1",
    "foo.0x",
    "foo.0x7f",
    "foo.09",
    "bücher.123",
    "1.2.3.4..",
    "256.0.0.1",
    "1.256.0.1",
    "1.2.256.1",
    "1.2.3.256",
    "1.2.65536",
    "1.16777216",
    "4294967296",
    "0x100000000",
    "040000000000",
    "0x1.0x100.0.0",
    "08",
    "09.1.2.3",
    "1.2.3.08",
    "0128.0.0.1",
    "0xg.1",
    "00x7f.1",
    "1.2.3.+4",
    "1_0.0.0.1",
    "1..2.3",
    "..1",
    "1.2.3.٤",  # Arabic-Indic digit is not an ASCII digit
]


@pytest.mark.parametrize("host", ERROR_CASES)
def test_errors(host: str) -> None:
    with pytest.raises(HostError) as info:
        normalise(host)
    message = str(info.value)
    assert message
    assert "\n" not in message and "\r" not in message
    assert len(message) < 250
    with pytest.raises(HostError):
        normalise_name(host)


@pytest.mark.parametrize(
    ("host", "phrase"),
    [
        ("", "empty host"),
        ("a..b", 'empty label in "a..b"'),
        ("pypi.org..", "empty label"),
        ("a b", "whitespace"),
        ("a\x00b", "control character"),
        ("fe80::1%eth0", "zone id"),
        ("1.2.3.4.5", "IPv4"),
        ("256.0.0.1", "out of range"),
        ("xn--zz.com", "punycode"),
        ("x" * 64, "63"),
        ("a." * 127 + "a", "253"),
        ("IP.where.a.name.1.2", "IPv4"),
    ],
)
def test_error_messages(host: str, phrase: str) -> None:
    with pytest.raises(HostError, match=re.escape(phrase)):
        normalise(host)


def test_error_message_escapes_unprintable_input() -> None:
    with pytest.raises(HostError) as info:
        normalise("a\x1b[31mb")
    assert "\x1b" not in str(info.value)
    with pytest.raises(HostError) as info:
        normalise("a\u202eb.com")
    assert "\u202e" not in str(info.value)


def test_error_message_truncates_long_input() -> None:
    with pytest.raises(HostError) as info:
        normalise("a" * 300)
    assert len(str(info.value)) < 200


def test_host_error_is_value_error() -> None:
    assert issubclass(HostError, ValueError)


@pytest.mark.parametrize("value", [None, b"pypi.org", 127, ["pypi.org"]])
def test_non_string_is_type_error(value: object) -> None:
    with pytest.raises(TypeError):
        normalise(value)  # type: ignore[arg-type]


# --- normalise_name / parse_ip ---------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "0x7f.1", "2130706433", "::1", "[::1]", "::ffff:1.2.3.4", "0x"])
def test_normalise_name_refuses_ip_literals(host: str) -> None:
    with pytest.raises(HostError, match="IP address"):
        normalise_name(host)


@pytest.mark.parametrize("host", ["pypi.org", "a..b", "pypi.org..", "xn--zz.com", "x" * 64, "pypi.org/", "foo.0x1g"])
def test_parse_ip_none_for_non_literals(host: str) -> None:
    assert parse_ip(host) is None


@pytest.mark.parametrize(
    "host", ["1.2.3.4.5", "foo.123", "256.0.0.1", "fe80::1%eth0", "[1.2.3.4]", "::g", "", " 1.2.3.4"]
)
def test_parse_ip_raises_for_invalid_literals(host: str) -> None:
    with pytest.raises(HostError):
        parse_ip(host)


# --- is_subdomain / parents ------------------------------------------------------------------

SUBDOMAIN_CASES = [
    ("files.pypi.org", "pypi.org", True),
    ("a.b.pypi.org", "pypi.org", True),
    ("FILES.PyPI.org.", "pypi.org.", True),
    ("files.pypi.org", "PYPI.ORG", True),
    ("pypi.org", "pypi.org", False),  # apex is not a strict subdomain
    ("pypi.org.", "PYPI.org", False),
    ("evilpypi.org", "pypi.org", False),  # label-wise, not string-wise
    ("pypi.org.evil.com", "pypi.org", False),
    ("org", "pypi.org", False),
    ("pypi.org", "org", True),
    ("x.bücher.example", "xn--bcher-kva.example", True),
    ("x.xn--bcher-kva.example", "BÜCHER.example", True),
    ("x.ｐｙｐｉ．ｏｒｇ", "pypi.org", True),
]


@pytest.mark.parametrize(("name", "suffix", "expected"), SUBDOMAIN_CASES)
def test_is_subdomain(name: str, suffix: str, expected: bool) -> None:
    assert is_subdomain(name, suffix) is expected


@pytest.mark.parametrize("name", ["127.0.0.1", "0x7f.1", "::1", "[::ffff:1.2.3.4]"])
def test_is_subdomain_ip_name_is_never_under_a_suffix(name: str) -> None:
    assert is_subdomain(name, "org") is False
    assert is_subdomain(name, "0.1.a") is False


@pytest.mark.parametrize("suffix", ["0.0.1", "1.2.3.4", "::1", "0x7f"])
def test_is_subdomain_refuses_ip_suffix(suffix: str) -> None:
    with pytest.raises(HostError):
        is_subdomain("a.example", suffix)


@pytest.mark.parametrize(("name", "suffix"), [("a..b.org", "org"), ("a.org", "a..org"), ("a.org", "")])
def test_is_subdomain_refuses_invalid_hosts(name: str, suffix: str) -> None:
    with pytest.raises(HostError):
        is_subdomain(name, suffix)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.b.c.d", ["b.c.d", "c.d", "d"]),
        ("A.B.C.D.", ["b.c.d", "c.d", "d"]),
        ("files.pypi.org", ["pypi.org", "org"]),
        ("pypi.org", ["org"]),
        ("org", []),
        ("x.bücher.example", ["xn--bcher-kva.example", "example"]),
    ],
)
def test_parents(name: str, expected: list[str]) -> None:
    assert parents(name) == expected


@pytest.mark.parametrize("name", ["1.2.3.4", "::1", "a..b", ""])
def test_parents_refuses_non_names(name: str) -> None:
    with pytest.raises(HostError):
        parents(name)


# --- strategies ------------------------------------------------------------------------------

_LABEL_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_"


def _numeric_last_label(label: str) -> bool:
    """Labels the WHATWG parser would read as an IPv4 number when last (spec-level oracle)."""
    return bool(re.fullmatch(r"[0-9]+|0x[0-9a-f]*", label))


labels = st.text(_LABEL_CHARS, min_size=1, max_size=63).filter(lambda s: not s.startswith("xn--"))
short_labels = st.text(_LABEL_CHARS, min_size=1, max_size=8).filter(lambda s: not s.startswith("xn--"))


@st.composite
def valid_names(draw: st.DrawFn, label: st.SearchStrategy[str] = labels) -> str:
    """Canonical DNS names: valid labels, the last one not IPv4-number-like, <= 253 chars."""
    parts = draw(st.lists(label, min_size=1, max_size=6))
    assume(not _numeric_last_label(parts[-1]))
    name = ".".join(parts)
    assume(len(name) <= 253)
    return name


@st.composite
def case_variants(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c for c, flip in zip(text, flips, strict=True))


def _part(draw: st.DrawFn, value: int) -> str:
    """One IPv4 part spelled in a random radix, with random zero padding and hex-prefix case."""
    radix = draw(st.sampled_from(["dec", "hex", "oct"]))
    if radix == "dec":
        return str(value)  # leading zeros would make it octal
    if radix == "hex":
        digits = format(value, draw(st.sampled_from(["x", "X"])))
        if value == 0:
            digits = draw(st.sampled_from(["", "0"]))
        pad = "0" * draw(st.integers(0, 3))
        return draw(st.sampled_from(["0x", "0X"])) + pad + digits
    pad = "0" * draw(st.integers(0, 3))
    return "0" + pad + format(value, "o")


@st.composite
def ipv4_spellings(draw: st.DrawFn) -> tuple[IPv4Address, str]:
    """An address and one of the many strings a network stack or URL parser reads as it."""
    address = draw(st.ip_addresses(v=4))
    assert isinstance(address, IPv4Address)  # v=4: hypothesis types it as either family
    value = int(address)
    a, b, c, d = address.packed
    form = draw(st.sampled_from(["1", "2", "3", "4", "v6", "v6hex", "v6full"]))
    if form == "1":
        text = _part(draw, value)
    elif form == "2":
        text = f"{_part(draw, a)}.{_part(draw, value & 0xFFFFFF)}"
    elif form == "3":
        text = f"{_part(draw, a)}.{_part(draw, b)}.{_part(draw, value & 0xFFFF)}"
    elif form == "4":
        text = ".".join(_part(draw, octet) for octet in (a, b, c, d))
    elif form == "v6":
        text = f"::ffff:{address}"
    elif form == "v6hex":
        text = f"::ffff:{value >> 16:x}:{value & 0xFFFF:04x}"
    else:
        text = f"0:0:0:0:0:ffff:{value >> 16:04X}:{value & 0xFFFF:x}"
    if form.startswith("v6"):
        text = draw(case_variants(text))
        if draw(st.booleans()):
            text = f"[{text}]"
    elif draw(st.booleans()):
        text += "."
    return address, text


# --- properties ------------------------------------------------------------------------------


@PROPERTY
@given(valid_names())
def test_valid_names_are_fixed_points(name: str) -> None:
    assert normalise(name) == name
    assert normalise_name(name) == name
    assert parse_ip(name) is None


@PROPERTY
@given(st.data())
def test_case_and_trailing_dot_variants_agree(data: st.DataObject) -> None:
    name = data.draw(valid_names())
    variant = data.draw(case_variants(name))
    if data.draw(st.booleans()):
        variant += "."
    assert normalise(variant) == name
    with pytest.raises(HostError):
        normalise(variant + ("." if variant.endswith(".") else ".."))


_UNICODE_LETTERS = "abcxyzäöüßéñçøåæ" + "ÄÖÜÉÑ" + "αβγδ" + "абвгд" + "ａｂｃ" + "-"


@PROPERTY
@given(
    st.lists(st.text(_UNICODE_LETTERS, min_size=1, max_size=10), min_size=1, max_size=4),
    st.sampled_from([".", "。", "．", "｡"]),
)
def test_unicode_names_idempotent_and_ascii(parts: list[str], dot: str) -> None:
    host = dot.join(parts)
    try:
        result = normalise(host)
    except HostError:
        return
    assert isinstance(result, str)
    assert result.isascii()
    assert all(CANONICAL_LABEL.fullmatch(label) for label in result.split("."))
    assert normalise(result) == result
    assert normalise(host.upper()) == result or _upper_changes_mapping(host)
    assert normalise(host + dot) == result


def _upper_changes_mapping(host: str) -> bool:
    """str.upper is not UTS #46's inverse for ß (-> 'SS'); everything else here round-trips."""
    return "ß" in host


@PROPERTY
@given(st.ip_addresses(v=4))
def test_ipv4_idempotent(address: IPv4Address) -> None:
    assert normalise(str(address)) == address
    assert normalise(str(normalise(str(address)))) == address
    with pytest.raises(HostError):
        normalise_name(str(address))


@PROPERTY
@given(st.ip_addresses(v=6), st.booleans(), st.booleans(), st.booleans())
def test_ipv6_spellings_and_idempotence(address: IPv6Address, exploded: bool, upper: bool, bracket: bool) -> None:
    expected: Address = address.ipv4_mapped or address
    text = address.exploded if exploded else address.compressed
    if upper:
        text = text.upper()
    if bracket:
        text = f"[{text}]"
    result = normalise(text)
    assert result == expected
    assert type(result) is type(expected)
    assert normalise(str(result)) == result
    assert parse_ip(text) == expected


@PROPERTY
@given(ipv4_spellings())
@example((LOOPBACK, "0x7f.1"))
@example((LOOPBACK, "0177.0.0.01"))
@example((V4("0.0.0.0"), "0x"))
def test_every_ipv4_spelling_denotes_the_address(case: tuple[IPv4Address, str]) -> None:
    address, text = case
    result = normalise(text)
    assert type(result) is IPv4Address
    assert result == address
    assert parse_ip(text) == address
    assert normalise(str(result)) == result


@PROPERTY
@given(st.ip_addresses(v=4), st.integers(0, 3), st.integers(256, 2**40))
def test_ipv4_out_of_range_parts_are_errors(address: IPv4Address, index: int, big: int) -> None:
    parts = [str(octet) for octet in address.packed]
    parts[index] = str(big) if index < 3 else str(max(big, 256))
    with pytest.raises(HostError):
        normalise(".".join(parts))


@PROPERTY
@given(st.integers(1, 4), st.integers(0, 2**40))
def test_ipv4_last_part_limit(count: int, last: int) -> None:
    text = ".".join(["1"] * (count - 1) + [str(last)])
    limit = 256 ** (5 - count)
    if last < limit:
        leading = sum(1 << (8 * (3 - index)) for index in range(count - 1))
        assert normalise(text) == V4(leading + last)
    else:
        with pytest.raises(HostError):
            normalise(text)


_INET_ATON_ALPHABET = "0123456789abcdefxX."


@PROPERTY
@given(st.text(_INET_ATON_ALPHABET, min_size=1, max_size=24))
@example("0x7f.1")
@example("0177.1")
@example("127.0.0.1")
def test_whatever_inet_aton_accepts_means_the_same_here(text: str) -> None:
    """Differential check against the C library (tests only; the module itself never calls it)."""
    try:
        packed = socket.inet_aton(text)
    except OSError:
        return
    assert normalise(text) == IPv4Address(packed)


@PROPERTY
@given(valid_names(short_labels), st.lists(short_labels, max_size=3), valid_names(short_labels))
def test_is_subdomain_matches_reference(suffix: str, prefix: list[str], other: str) -> None:
    for name in [".".join([*prefix, suffix]), other, other + "." + suffix if prefix else suffix]:
        assume(len(name) <= 253)
        expected = name.endswith("." + suffix)
        name_labels, suffix_labels = name.split("."), suffix.split(".")
        by_labels = len(name_labels) > len(suffix_labels) and name_labels[-len(suffix_labels) :] == suffix_labels
        assert expected == by_labels
        assert is_subdomain(name, suffix) is expected
        assert is_subdomain(name.upper() + ".", suffix.upper()) is expected


@PROPERTY
@given(valid_names())
def test_parents_properties(name: str) -> None:
    result = parents(name)
    count = name.count(".") + 1
    assert len(result) == count - 1
    for position, parent in enumerate(result):
        assert parent.count(".") == count - 2 - position
        assert is_subdomain(name, parent)
        assert normalise(parent) == parent
    assert parents(name.upper() + ".") == result
    assert not is_subdomain(name, name)


_FUZZ_ALPHABET = st.sampled_from(
    # ASCII, then look-alikes, full-width forms, invisible and bidi controls, NUL: one character each.
    list("abcxyz0179.-_:[]%xX üß。．１ｘ\u00ad\u200dİ\x00\u202eｆⅧ⒈")
)


@PROPERTY
@given(st.text(_FUZZ_ALPHABET, max_size=30) | st.text(max_size=30))
def test_arbitrary_text_normalises_canonically_or_raises_host_error(text: str) -> None:
    try:
        result = normalise(text)
    except HostError:
        with pytest.raises(HostError):
            normalise_name(text)
        return
    if isinstance(result, str):
        assert len(result) <= 253
        assert all(CANONICAL_LABEL.fullmatch(label) for label in result.split("."))
        assert parse_ip(text) is None
        assert normalise_name(text) == result
    else:
        assert isinstance(result, IPv4Address | IPv6Address)
        assert parse_ip(text) == result
        if isinstance(result, IPv6Address):
            assert result.ipv4_mapped is None
    assert normalise(str(result)) == result


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pypi.org", ("pypi.org", None)),
        ("pypi.org:443", ("pypi.org", "443")),
        ("pypi.org:", ("pypi.org", "")),
        ("[::1]:8080", ("::1", "8080")),
        ("[::1]", ("::1", None)),
        ("::1", ("::1", None)),
        ("1.2.3.4:x", ("1.2.3.4", "x")),
    ],
)
def test_split_host_port(text: str, expected: tuple[str, str | None]) -> None:
    assert split_host_port(text) == expected
