"""The one error of policy files, phrased for the one-line `sandgate: error: FILE:LINE: ...`.

The guards raise sgbase.policyerror.PolicyError (a message and a line); only here does it learn
which file it came from.
"""

from __future__ import annotations

import unicodedata

from sgbase.origin import Origin
from sgbase.policyerror import PolicyError


class PolicyFileError(Exception):
    """A policy mistake, already phrased for the one-line `sandgate: error:` message."""

    def __init__(self, where: str, line: int | None, message: str) -> None:
        self.where, self.line, self.message = where, line, message
        super().__init__(_printable(f"{Origin(where, line or None)}: {message}"))

    @classmethod
    def at(cls, origin: Origin, message: str) -> PolicyFileError:
        """A mistake at a rule's (or credential's) own origin."""
        return cls(origin.path, origin.line, message)

    @classmethod
    def of(cls, where: str, error: PolicyError) -> PolicyFileError:
        """A guard's PolicyError, now naming the file (or flag) it came from (its own origin when it has one)."""
        if error.origin is not None:
            return cls.at(error.origin, str(error))
        return cls(where, error.line, str(error))


def _printable(text: str, limit: int = 600) -> str:
    """One line of plain text: no newline or terminal escape from a file reaches the user's terminal."""

    def plain(c: str) -> str:
        if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp"):
            return c
        return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"

    out = "".join(map(plain, text))
    return out if len(out) <= limit else out[: limit - 1] + "…"
