"""The DACL journal: every ACL sandgate changes is recorded before the change and restored after
the run, also after a crash (the next run or `sandgate cleanup` replays what a killed run left).

Threat answered: a sandbox user keeping rights on the workspace, or a protected path staying
unwritable for the real user, because sandgate died between applying and removing an ACE.
Write-ahead: the entry is on disk before SetNamedSecurityInfo runs, so every change has a record.
Pure: the record format and the restore decision; the journal file and the calls are win32.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from fsguard.windows import sddl

RestoreAction = Literal["set_before", "remove_sid_aces", "remove_placeholder", "remove_placeholder_file", "nothing"]


class JournalError(ValueError):
    """A journal line that is not one of ours: never guess how to restore an ACL."""


@dataclass(frozen=True)
class JournalEntry:
    path: str
    before_sddl: str  # the DACL as it was (SDDL "D:..."), "" for a placeholder sandgate created
    after_sddl: str  # the DACL sandgate set
    sid: str  # the sandbox user's SID: the ACEs that are ours
    placeholder: bool = False
    #: a placeholder's kind (issue 28 W8: `.git\commondir` must stay a file) and, for a file, the
    #: text sandgate wrote: removed at teardown only while it still holds exactly that
    kind: Literal["dir", "file"] = "dir"
    text: str = ""


def encode(entry: JournalEntry) -> str:
    return json.dumps(
        {
            "path": entry.path,
            "before": entry.before_sddl,
            "after": entry.after_sddl,
            "sid": entry.sid,
            "placeholder": entry.placeholder,
            "kind": entry.kind,
            "text": entry.text,
        },
        sort_keys=True,
    )


def decode(line: str) -> JournalEntry:
    try:
        raw = json.loads(line)
        kind, text = raw.get("kind", "dir"), raw.get("text", "")  # journals before issue 28: directories
        entry = JournalEntry(raw["path"], raw["before"], raw["after"], raw["sid"], raw["placeholder"], kind, text)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise JournalError(f"unreadable ACL journal line ({type(e).__name__})") from None
    if not all(isinstance(v, str) for v in (entry.path, entry.before_sddl, entry.after_sddl, entry.sid)):
        raise JournalError("ACL journal line with a non-text field")
    if not isinstance(entry.placeholder, bool):
        raise JournalError("ACL journal line with a non-boolean placeholder")
    if entry.kind not in ("dir", "file") or not isinstance(entry.text, str):
        raise JournalError("ACL journal line with an unknown placeholder kind")
    return entry


def entry_for(path: str, ace_sddl: str, before_sddl: str, sid: str, *, placeholder: bool = False) -> JournalEntry:
    """The record written BEFORE an ACE is applied: the DACL as it is and as it will be."""
    return JournalEntry(path, before_sddl, sddl.with_ace(before_sddl, ace_sddl), sid, placeholder)


def restore_action(entry: JournalEntry, current_sddl: str | None) -> RestoreAction:
    """What undoes one entry, given the DACL the path has now (None: the path is gone).

    The recorded DACL goes back only if nobody changed it since; otherwise only the sandbox SID's
    ACEs are taken out, so a change the real user made during the run survives."""
    if current_sddl is None:
        return "nothing"
    if entry.placeholder:
        return "remove_placeholder_file" if entry.kind == "file" else "remove_placeholder"
    try:  # by meaning, not text: Windows respells what it stores (issue 28 M4)
        if sddl.same_dacl(current_sddl, entry.after_sddl):
            return "set_before"
        ours = sddl.without_sid(current_sddl, entry.sid) != current_sddl
    except sddl.SddlError:
        return "nothing"  # not a DACL we can read: leave it to a human rather than guess
    return "remove_sid_aces" if ours else "nothing"


def restore_order(entries: list[JournalEntry]) -> list[JournalEntry]:
    """Newest first: a path changed twice returns to its first recorded state, not its second."""
    return list(reversed(entries))
