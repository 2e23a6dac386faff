"""Guesses for a mistyped name (a bundled list, a subcommand): "did you mean ...?", one guess or none.

Pure. A wrong guess costs the user a second look, so it is offered only when it is close: difflib's
ratio of at least 0.6, or the same letters in another order (`pipy` for `pypi`: a swap difflib
scores at 0.5).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

CUTOFF = 0.6


def guess(word: str, choices: Iterable[str]) -> str | None:
    """The closest of `choices` to `word`, or None when none is close enough to be worth saying."""
    names = list(dict.fromkeys(choices))
    if word in names:
        return None
    close = difflib.get_close_matches(word, names, n=1, cutoff=CUTOFF)
    if close:
        return close[0]
    return next((n for n in names if sorted(n) == sorted(word)), None)


def phrase(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'x'?`, or "" when there is no close guess."""
    found = guess(word, choices)
    return f"; did you mean '{found}'?" if found is not None else ""


# argparse's own message for a subcommand (or any choice) that does not exist (Python 3.12).
_INVALID = re.compile(r"argument (?P<what>[^:]+): invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)$")


def invalid_choice(message: str) -> str | None:
    """argparse's "invalid choice" error, as one line with a guess; None for any other message or no guess."""
    m = _INVALID.match(message)
    if m is None:
        return None
    choices = re.findall(r"'([^']*)'", m["choices"])
    found = guess(m["word"], choices)
    if found is None:
        return None
    what = "command" if m["what"] in ("command", "audit_command", "cache_command", "daemon_command") else m["what"]
    return f"no {what} '{m['word']}'; did you mean '{found}'? (choose from {', '.join(choices)})"
