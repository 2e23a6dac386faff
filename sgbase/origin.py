"""Where a rule (or a mistake) was written: a typed FILE:LINE, and the one way to print it.

Rules, credentials and errors carry it as a record, never as "FILE:LINE" text to be split again: a
file name may itself hold a colon, and a split in two places was two places to get it wrong.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Origin:
    """`path`: a policy file, a hosts file, a bundled list or a flag ("command line"); `line`: 1-based, or None."""

    path: str
    line: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str):
            raise TypeError(f"an origin's path is text, not {type(self.path).__name__}")
        if self.line is not None and (type(self.line) is not int or self.line < 1):
            raise ValueError(f"an origin's line is a whole number from 1, not {self.line!r}")

    def __str__(self) -> str:
        return self.path if self.line is None else f"{self.path}:{self.line}"
