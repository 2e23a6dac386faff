"""YAML mappings and lists that remember the line of themselves and of each item (1-based).

What sgbase.policyerror.line_of reads, so every mistake can name FILE:LINE.
"""

from __future__ import annotations

from typing import Any


class LocDict(dict[Any, Any]):
    """A mapping that remembers the line of itself and of each key (1-based)."""

    line: int | None = None
    lines: dict[Any, int]


class LocList(list[Any]):
    """A list that remembers the line of itself and of each item (1-based)."""

    line: int | None = None
    lines: dict[int, int]
