"""The environment block CreateProcessWithLogonW takes (CREATE_UNICODE_ENVIRONMENT), built purely.

Why its own module: the block is where the filtered environment (fsguard/env.py decides what is
dropped) becomes the one the sandbox sees, so nothing may slip in or be lost on the way: a name
with "=" or a NUL would smuggle a second variable into the block (`A=x\\0SECRET=...`), and an
unsorted block is not what Windows documents (sorted by name, case-insensitively).
"""

from __future__ import annotations

from collections.abc import Mapping


class EnvBlockError(ValueError):
    """A name or value that would change the block's meaning."""


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
    entries = sorted(env.items(), key=lambda kv: kv[0].casefold())
    return "".join(f"{k}={v}\0" for k, v in entries) + "\0"
