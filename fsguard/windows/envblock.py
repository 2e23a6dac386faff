"""The environment block CreateProcessWithLogonW takes (CREATE_UNICODE_ENVIRONMENT), built purely.

Why its own module: the block is where the filtered environment (fsguard/env.py decides what is
dropped) becomes the one the sandbox sees, so nothing may slip in or be lost on the way: a name
with "=" or a NUL would smuggle a second variable into the block (`A=x\\0SECRET=...`), and an
unsorted block is not what Windows documents (sorted by name, case-insensitively).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: The block's end: the last string's NUL and one more (four zero bytes in UTF-16); an empty block
#: is these two alone (docs: CreateProcessW, lpEnvironment).
TERMINATOR = "\0\0"


class EnvBlockError(ValueError):
    """A name or value that would change the block's meaning."""


def overlay(base: Mapping[str, str], over: Iterable[tuple[str, str]]) -> dict[str, str]:
    """`base` with `over` set on top, names compared as Windows does (case-insensitively): a base
    `http_proxy` is replaced by an `HTTP_PROXY` over it, never kept beside it (issue 28, W1)."""
    out = dict(base)
    for name, value in over:
        for old in [n for n in out if n.casefold() == name.casefold()]:
            del out[old]
        out[name] = value
    return out


def sort_key(name: str) -> tuple[int, ...]:
    """The order Windows keeps the block in (M3): "sorted alphabetically by name, case-insensitive,
    Unicode order, without regard to locale" (learn.microsoft.com/en-us/windows/win32/procthread/
    changing-environment-variables), i.e. UTF-16 code units compared after upcasing each one, as
    RtlCompareUnicodeString does. Not casefold(): lower-casing puts `_` (0x5F) before letters, so
    HTTP_PROXY would sort before HTTPS_PROXY, which upper-cased Windows puts first."""
    raw = name.encode("utf-16-le", "surrogatepass")
    out: list[int] = []
    for i in range(0, len(raw), 2):
        unit = int.from_bytes(raw[i : i + 2], "little")
        up = chr(unit).upper() if not 0xD800 <= unit <= 0xDFFF else ""
        out.append(ord(up) if len(up) == 1 and ord(up) <= 0xFFFF else unit)
    return tuple(out)


def build(env: Mapping[str, str]) -> str:
    """`NAME=value\\0...\\0\\0`, sorted case-insensitively; names differing only in case are one variable
    on Windows, so two of them are refused rather than one silently chosen."""
    seen: dict[str, str] = {}
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise EnvBlockError(f"environment variable {name!r}: '=' or NUL in a name, or NUL in a value")
        if name.casefold() in seen:
            raise EnvBlockError(f"environment variables {seen[name.casefold()]!r} and {name!r} are one on Windows")
        seen[name.casefold()] = name
    entries = sorted(env.items(), key=lambda kv: sort_key(kv[0]))
    return "".join(f"{k}={v}\0" for k, v in entries) + ("\0" if entries else TERMINATOR)


def utf16(text: str) -> bytes:
    """The UTF-16LE bytes Windows reads: a character outside the BMP is two code units, so a buffer
    sized in Python characters would cut the block short (M2); a lone surrogate is refused."""
    try:
        return text.encode("utf-16-le")
    except UnicodeEncodeError:
        raise EnvBlockError("an environment variable or argument holds a lone surrogate") from None
