"""Logged text made safe for a terminal or a YAML file, and the small words of the reports.

Log contents are untrusted (the sandboxed task chose the names it asked for), so every
logged string that reaches a terminal or a YAML comment goes through `escape`: a host name
must never be able to inject a line or drive the terminal.
"""

from __future__ import annotations

import re

import yaml


def escape(text: str) -> str:
    """Printable ASCII stays; everything else (newlines, NEL, U+2028, ESC, non-ASCII) becomes a YAML-style escape."""
    out = []
    for ch in text:
        o = ord(ch)
        if 0x20 <= o < 0x7F:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)


def comment(text: str) -> str:
    """Logged text inside a `#` comment: one line, whatever the log contained."""
    return escape(text)


def quoted(text: str) -> str:
    """A YAML double-quoted scalar; the escapes above are YAML's own, so it loads back to `text`."""
    return '"' + escape(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


_PLAIN = re.compile(r"[a-z0-9][a-z0-9._/-]*")


def scalar(text: str) -> str:
    """Plain when YAML reads it back as the same string (hosts, v4 cidrs), else double-quoted."""
    if _PLAIN.fullmatch(text):
        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    return quoted(text)


def bracket(host: str) -> str:
    """`[v6]` so a port can follow an IPv6 address."""
    return f"[{host}]" if ":" in host else host


def name_key(host: str) -> tuple[str, ...]:
    """Sort names by their labels from the right, so a domain's hosts stay together."""
    return tuple(reversed(host.split(".")))


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def times(n: int) -> str:
    return "1 time" if n == 1 else f"{n} times"
