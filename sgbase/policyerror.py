"""The one error type of every policy section, and the one way to find the line a value came from.

A leaf (stdlib only, nothing of sandgate): both guards' policy sections raise PolicyError, and the
launcher wraps it once into `sandgate: error: FILE:LINE: ...`. It lives below both guards (sgbase) so
that neither imports the other.
"""

from __future__ import annotations

from typing import Any

from sgbase.origin import Origin


class PolicyError(ValueError):
    """A user mistake in a policy; `line` (1-based, or None) points at it for the one-line error.

    `origin`: the whole FILE:LINE when the raiser knows it (a rule's constructor refusing a rule that
    came from another file than the one being read, a hosts file); else the reader adds its file.
    """

    def __init__(self, message: str, line: int | None = None, *, origin: Origin | None = None) -> None:
        super().__init__(message)
        self.line = origin.line if origin is not None else line
        self.origin = origin


def line_of(container: Any, key: Any) -> int | None:
    """Line of `container[key]` when the loader recorded it; plain dicts (tests, CLI) have none."""
    lines = getattr(container, "lines", None)
    if lines is not None and key in lines:
        found: int | None = lines[key]
        return found
    line: int | None = getattr(container, "line", None)
    return line
