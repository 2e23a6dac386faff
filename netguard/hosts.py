"""Canonical forms of destination hosts, so that policy compares what the network will reach.

An allowlisting proxy that compares host strings verbatim can be bypassed by spelling the
same destination differently: ``PyPI.org.``, ``ｐｙｐｉ.org``, ``0x7f.1`` or
``[::ffff:127.0.0.1]``.  Everything here maps each such spelling to one canonical value, or
refuses it with :class:`HostError`; refusing is always safe for an allowlist, equating two
different destinations never is.

The rules follow the WHATWG URL standard's host parser (which is also what ``inet_aton`` and
``getaddrinfo`` accept for IPv4), with IDNA 2008 + UTS #46 for internationalised names.

This module is pure: no DNS, no sockets, no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from ipaddress import AddressValueError, IPv4Address, IPv6Address
from types import ModuleType

__all__ = [
    "Address",
    "HostError",
    "is_subdomain",
    "normalise",
    "normalise_name",
    "parents",
    "parse_ip",
    "split_host_port",
]

Address = IPv4Address | IPv6Address

# Refuse absurd input before doing any work on it: far above the longest valid spelling of
# any host (253 characters), so only garbage is refused, and it bounds the cost of hostile
# input (and keeps int() well below its digit limit).
_MAX_INPUT = 1024
# RFC 1035 limits, as presentation text without the trailing dot.
_MAX_NAME = 253
# One DNS label after IDNA: letters, digits, hyphen, and underscore (real names use
# _dmarc, _acme-challenge, ...).
_LABEL_RE = re.compile(r"[a-z0-9_-]{1,63}")
_ACE_PREFIX = "xn--"
_DIGITS = {
    8: frozenset("01234567"),
    10: frozenset("0123456789"),
    16: frozenset("0123456789abcdef"),
}
_MAX_SHOWN = 80


class HostError(ValueError):
    """A host string that cannot be a destination; the message is one short user-facing phrase, e.g. 'empty label in "a..b"'."""


def split_host_port(text: str) -> tuple[str, str | None]:
    """`host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address -> (host, port text or None).

    The one place a "host:port" string is taken apart (CLI flags, policy entries, Host headers):
    the port stays text so each caller can say what it expected; brackets are removed.
    """
    if text.startswith("["):
        inner, _, rest = text[1:].partition("]")
        return inner, (rest[1:] if rest.startswith(":") else None)
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, None  # a name, or an IPv6 address without brackets (several colons): no port


def normalise(host: str) -> str | Address:
    """Canonical form of a destination host: an IP address object, or a lowercase ASCII (punycode) DNS name without trailing dot.

    Policy must compare these values, never raw strings, because the network treats every
    spelling that maps to the same value as the same destination.
    """
    if isinstance(host, str) and _is_canonical_name(host):
        return host  # already canonical: the answer the full parse below would give, ~10x cheaper
    parsed = _split(host)
    if not isinstance(parsed, list):
        return parsed
    return _name_from_labels(parsed, host)


def normalise_name(host: str) -> str:
    """Like normalise but refuses IP literals (HostError); for policy entries that must be names.

    A wildcard or suffix rule written as an address is a policy mistake, and silently
    treating it as a name would never match anything.
    """
    result = normalise(host)
    if not isinstance(result, str):
        raise HostError(f"IP address where a name is required: {_show(host)}")
    return result


def is_canonical_name(host: str) -> bool:
    """Whether `host` is a name exactly as normalise_name returns it; cheap for the common lowercase ASCII
    names (a rule checks its name with this each time one is made: 10^5 of a hosts file)."""
    if _is_canonical_name(host):
        return True
    try:
        return normalise_name(host) == host
    except HostError:
        return False


def all_canonical_names(names: Sequence[str]) -> bool:
    """True when every name passes is_canonical_name's shortcut: one pass in C loops for the 10^5 names of a
    hosts file. False says only that some name needs the full check (or fails it), not which."""
    if not all(type(n) is str for n in names) or max(map(len, names), default=0) > _MAX_NAME:
        return False
    return "xn--" not in "\n".join(names) and all(map(_canonical_re().fullmatch, names))


def parse_ip(host: str) -> Address | None:
    """The address an IP literal in any spelling denotes, or None if `host` is not an IP literal.

    Answers only "is this an address, and which?": a string that looks like an IP literal but
    is not a valid one (``1.2.3.4.5``, ``fe80::1%eth0``, ``256.0.0.1``) raises HostError rather
    than returning None, so a caller can never send it to DNS as if it were a name; so does a
    string that cannot be a host at all (empty, whitespace).  None does not mean the string is
    a valid name: use normalise_name for that.
    """
    parsed = _split(host)
    if isinstance(parsed, list):
        return None
    return parsed


def is_subdomain(name: str, suffix: str) -> bool:
    """True if normalised `name` is a strict subdomain of normalised `suffix` (label-wise: 'evilpypi.org' is NOT under 'pypi.org'; the apex itself is not a subdomain).

    `suffix` must be a name (HostError otherwise, it is policy); an IP-literal `name` is never
    under any suffix.  Either argument that is not a valid host raises HostError.
    """
    canonical_suffix = normalise_name(suffix)
    canonical_name = normalise(name)
    if not isinstance(canonical_name, str):
        return False
    return canonical_name.endswith("." + canonical_suffix)


def parents(name: str) -> list[str]:
    """The strict parent suffixes of a normalised name, nearest first: 'a.b.c.d' -> ['b.c.d', 'c.d', 'd']; used for O(labels) wildcard lookups.

    The argument is normalised again (idempotent for canonical names) so a caller cannot look
    up parents of a non-canonical spelling; IP literals raise HostError.
    """
    labels = normalise_name(name).split(".")
    return [".".join(labels[i:]) for i in range(1, len(labels))]


# --- internals -------------------------------------------------------------------------------


def _split(host: str) -> Address | list[str]:
    """An IP address, or the UTS #46-mapped labels of a would-be name (not yet validated).

    This is the part of host parsing that decides IP-ness, shared by normalise and parse_ip.
    """
    if not isinstance(host, str):
        raise TypeError(f"host must be str, not {type(host).__name__}")
    if not host:
        raise HostError("empty host")
    if len(host) > _MAX_INPUT:
        raise HostError(f"host too long ({len(host)} characters)")
    for char in host:
        if char.isspace():
            raise HostError(f"whitespace in {_show(host)}")
        if _is_control(char):
            raise HostError(f"control character in {_show(host)}")

    # Brackets only ever enclose an IPv6 literal (URL syntax); no trailing dot after them.
    if host.startswith("["):
        if not host.endswith("]"):
            raise HostError(f"invalid IPv6 literal {_show(host)}")
        return _parse_ipv6(host[1:-1], host)
    # A colon can never appear in a name, so the string is an IPv6 literal or nothing.
    if ":" in host:
        return _parse_ipv6(host, host)

    mapped = host.lower() if host.isascii() else _uts46_map(host)
    labels = mapped.split(".")
    # Exactly one trailing dot is the fully-qualified spelling of the same host.
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()
    # WHATWG: a host whose last label is a number is an IPv4 address or invalid, never a name
    # (browsers and inet_aton would read "1.2.3.4.5" or "foo.123" as a broken address).
    if _is_ipv4_number_label(labels[-1]):
        return _parse_ipv4(labels, host)
    return labels


def _idna() -> ModuleType:
    """The idna package, loaded on the first non-ASCII or punycode name (~3 ms: most runs name none)."""
    import idna

    return idna


def _uts46_map(host: str) -> str:
    """UTS #46 (non-transitional) mapping of a non-ASCII host: case folding, fullwidth forms, ideographic dots."""
    try:
        return str(_idna().uts46_remap(host, std3_rules=False))
    except UnicodeError:  # idna.IDNAError and InvalidCodepoint derive from it
        raise HostError(f"invalid character in {_show(host)}") from None


def _parse_ipv6(text: str, host: str) -> Address:
    """The address an IPv6 literal denotes, IPv4-mapped addresses returned as IPv4 so IPv4 rules apply."""
    if "%" in text:
        raise HostError(f"IPv6 zone id not allowed in {_show(host)}")
    if not text.isascii():
        raise HostError(f"invalid IPv6 address {_show(host)}")
    try:
        address = IPv6Address(text)
    except AddressValueError:
        raise HostError(f"invalid IPv6 address {_show(host)}") from None
    mapped = address.ipv4_mapped
    return mapped if mapped is not None else address


def _ipv4_number(part: str) -> int | None:
    """WHATWG 'IPv4 number parser': decimal, 0x-hex (empty means 0) or 0-prefixed octal; None if invalid."""
    if not part:
        return None
    radix = 10
    if part.startswith(("0x", "0X")):
        radix, part = 16, part[2:]
    elif len(part) >= 2 and part[0] == "0":
        radix, part = 8, part[1:]
    if not part:
        return 0
    digits = _DIGITS[radix]
    # Checked before int(), which would also accept "_", "+", whitespace and non-ASCII digits.
    if not all(char in digits for char in part.lower()):
        return None
    return int(part, radix)


def _is_ipv4_number_label(label: str) -> bool:
    """WHATWG 'ends in a number' test for the last label: all ASCII digits, or a valid IPv4 number."""
    if label and all(char in _DIGITS[10] for char in label):
        return True
    return _ipv4_number(label) is not None


def _parse_ipv4(parts: list[str], host: str) -> IPv4Address:
    """WHATWG IPv4 parser (same forms inet_aton accepts): 1 to 4 parts, the last one filling the remaining bytes."""
    if len(parts) > 4:
        raise HostError(f"too many parts in IPv4 address {_show(host)}")
    numbers: list[int] = []
    for part in parts:
        number = _ipv4_number(part)
        if number is None:
            raise HostError(f"invalid IPv4 address {_show(host)}")
        numbers.append(number)
    *leading, last = numbers
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(numbers)):
        raise HostError(f"IPv4 part out of range in {_show(host)}")
    value = last
    for index, number in enumerate(leading):
        value += number << (8 * (3 - index))
    return IPv4Address(value)


def _name_from_labels(labels: list[str], host: str) -> str:
    """Validate mapped labels and join their ASCII forms into the canonical name."""
    ascii_labels: list[str] = []
    for label in labels:
        if not label:
            raise HostError(f"empty label in {_show(host)}")
        if label.isascii():
            if label.startswith(_ACE_PREFIX):
                _check_a_label(label, host)
            ascii_label = label
        else:
            ascii_label = _to_a_label(label, host)
        if not _LABEL_RE.fullmatch(ascii_label):
            if len(ascii_label) > 63:
                raise HostError(f"label longer than 63 characters in {_show(host)}")
            raise HostError(f"invalid character in label {_show(label)} of {_show(host)}")
        ascii_labels.append(ascii_label)
    name = ".".join(ascii_labels)
    if len(name) > _MAX_NAME:
        raise HostError(f"name longer than {_MAX_NAME} characters: {_show(host)}")
    return name


def _to_a_label(label: str, host: str) -> str:
    """IDNA 2008 A-label of one mapped non-ASCII label (what idna.encode(uts46=True) gives it)."""
    try:
        return str(_idna().alabel(label).decode("ascii"))
    except UnicodeError:
        raise HostError(f"invalid internationalised label {_show(label)} in {_show(host)}") from None


def _check_a_label(label: str, host: str) -> None:
    """Refuse an xn-- label unless it is the one canonical punycode of a valid, already-mapped U-label.

    Otherwise two different ASCII strings could denote the same name, or a name the
    resolver reads differently from the rule.
    """
    try:
        idna = _idna()
        u_label = idna.ulabel(label)
        canonical = idna.alabel(u_label).decode("ascii")
        stable = idna.uts46_remap(u_label, std3_rules=False) == u_label
    except UnicodeError:
        canonical, stable = "", False
    if not stable or canonical != label:
        raise HostError(f"invalid punycode label {_show(label)} in {_show(host)}")


def _is_canonical_name(host: str) -> bool:
    """True for a name normalise would return unchanged without needing IDNA: lowercase ASCII labels.

    A shortcut for policies of 10^5 names, never a second rule: it accepts only strings the full
    parse maps to themselves (no "xn--" label to check, a last label that starts with a letter, hence
    no IPv4 number), so two spellings can never be equated here that the full parse keeps apart.
    """
    return len(host) <= _MAX_NAME and "xn--" not in host and _canonical_re().fullmatch(host) is not None


@functools.cache
def _canonical_re() -> re.Pattern[str]:
    """Compiled on first use: importing this module stays cheap for the launcher's warm start."""
    return re.compile(r"(?:[a-z0-9_-]{1,63}\.)*[a-z_-][a-z0-9_-]{0,62}")


def _is_control(char: str) -> bool:
    """C0/C1 controls and DEL: never part of a host, and dangerous to echo in messages."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F


def _show(text: str) -> str:
    """Quote user input for a message: short, with unprintable characters escaped (no log injection or bidi spoofing)."""
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 1] + "…"
    escaped = "".join(char if char.isprintable() and char not in '"\\' else _escape(char) for char in text)
    return f'"{escaped}"'


def _escape(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
