"""Applying an ACL plan under the write-ahead journal, undoing it, and replaying what a crash left.

First the owners: a denied object the sandbox user owns gets an OWNER RIGHTS ACE (owner_rights). Then, in the
plan's order (acl.plan_acls puts denies first): [placeholder: journal it, create it as the kind the
plan names, a directory or a file] and, at a path's last step, all of its ACEs at once: read the
DACL -> journal the entry (before and after) -> set the DACL. The journal line is durable before
the change it records, so a killed sandgate leaves a record for every ACE it set (threat: a
sandbox user keeping rights, or a protected path staying unwritable for the real user). Undo walks
the entries newest first with acljournal.restore_action; a step that fails is reported and the
journal is kept, so `sandgate cleanup` can finish the job later.
"""

from __future__ import annotations

import dataclasses
import ntpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from fsguard.windows import acljournal, sddl, winpath
from fsguard.windows.acl import OICI, OWNER_RIGHTS, READ_CONTROL, Ace, AclPlan, AclStep
from fsguard.windows.acljournal import JournalEntry
from sgbase.windows import state
from sgbase.windows.api import FileApi, WinApiError


@dataclass
class Applied:
    """What one run changed, in order: undo() takes it back."""

    journal: str  # the journal file
    entries: list[JournalEntry] = field(default_factory=list)
    finished: bool = False  # undone and the journal removed: a second teardown does nothing


def apply(api: FileApi, plan: AclPlan, sid: str, applied: Applied) -> None:
    """Every step of the plan, recorded into `applied` as it goes (the caller holds it, so its
    teardown undoes exactly what was done when a step fails half-way).

    All ACEs of one path go in with ONE SetNamedSecurityInfo, at that path's last step (win-acl A4):
    each call rewrites the security descriptor of every object below a directory ("the system
    automatically propagates any inheritable ACEs to existing child objects", SetNamedSecurityInfoW
    docs), so the root's guard and grant as two calls were two walks of the whole workspace at
    apply and two more at undo. The denies of other paths still come before the grants."""
    plan, owned = owner_rights(api, plan, sid)
    last = {winpath.key(s.path): i for i, s in enumerate(plan.steps)}
    due: dict[str, list[AclStep]] = {}
    for i, step in enumerate(plan.steps):
        if step.placeholder:
            _placeholder(api, step, sid, applied)
        due.setdefault(winpath.key(step.path), []).append(step)
        if last[winpath.key(step.path)] == i:
            try:
                _apply_path(api, due.pop(winpath.key(step.path)), sid, applied)
            except WinApiError as e:  # the sandbox user, as owner, may have shut the real user out
                if winpath.key(step.path) in owned:
                    raise _owned_refusal(step.path, e) from None
                raise


def owner_rights(api: FileApi, plan: AclPlan, sid: str) -> tuple[AclPlan, frozenset[str]]:
    r"""The plan with one more ACE on every object it denies that the sandbox user owns (a repository
    cloned or `git init`ed inside an earlier run), and those objects' keys. "An object's owner implicitly
    has WRITE_DAC access to the object" (learn.microsoft.com/windows/win32/secauthz/owner-of-a-new-object),
    which no deny ACE takes away (win-acl A3); an OWNER RIGHTS ACE replaces the owner's implicit rights
    with its own (learn.microsoft.com/previous-versions/windows/it-pro/windows-vista/cc749445(v=ws.10)),
    so one granting READ_CONTROL alone leaves the owner no way to drop the deny. Added to the object itself
    (and inherited below a directory), journalled and taken out at teardown with the rest.

    Why not take the object back (make the real user its owner): git trusts a repository by its owner
    (safe.directory, CVE-2022-24765); a `.git` the sandbox user made, its config and hooks written from
    inside, must stay the sandbox user's, so the real user's git keeps refusing it until the user takes
    it on purpose (`takeown`), instead of running its fsmonitor at their next `git status` (r3-new)."""
    owned = {winpath.key(s.path) for s in plan.steps if s.ace.kind == "deny" and not s.placeholder}
    owned = {k for k in owned if _sandbox_owned(api, _path_of(plan, k), sid)}
    steps: list[AclStep] = []
    added: set[str] = set()
    for step in plan.steps:
        steps.append(step)
        key = winpath.key(step.path)
        if key in owned and key not in added and step.ace.kind == "deny":
            inherit: Literal["OICI", ""] = "OICI" if step.ace.inherit == OICI else ""
            steps.append(AclStep(step.path, Ace("allow", READ_CONTROL, OWNER_RIGHTS, inherit), "owner"))
            added.add(key)
    # those objects first: where the owner shut the real user out, the run is refused before anything else changed
    steps.sort(key=lambda s: winpath.key(s.path) not in owned)
    return dataclasses.replace(plan, steps=tuple(steps)), frozenset(owned)


def _path_of(plan: AclPlan, key: str) -> str:
    return next(s.path for s in plan.steps if winpath.key(s.path) == key)


def _owned_refusal(path: str, e: WinApiError) -> WinApiError:
    return WinApiError(
        f"{path} belongs to the sandbox user (made inside an earlier run) and its ACL cannot be changed ({e}); "
        f'check what is in it, then take it as administrator: takeown /F "{path}" /R, and run again'
    )


def _sandbox_owned(api: FileApi, path: str, sid: str) -> bool:
    who = api.owner(path)
    return who is not None and sddl.sid_of(who) == sddl.sid_of(sid)


def _placeholder(api: FileApi, step: AclStep, sid: str, applied: Applied) -> None:
    r"""The placeholder as the kind its definition names (issue 28 W8: `.git\commondir` made as a
    directory broke every git command, the real user's too), and any missing parent directory
    (`.git\objects\info` in a fresh repository), each journalled before it is made: a crash right
    after the mkdir still removes it, child first."""
    missing: list[str] = []
    path = step.path
    while not api.exists(path) and ntpath.dirname(path) != path:
        missing.append(path)
        path = ntpath.dirname(path)
    for made in reversed(missing):
        leaf = made == step.path and step.kind == "file"
        kind: Literal["dir", "file"] = "file" if leaf else "dir"
        text = step.text if leaf else ""
        _journal(api, applied, JournalEntry(made, "", "", sid, placeholder=True, kind=kind, text=text))
        if leaf:
            api.write_file(made, text.encode())
        else:
            api.make_dir(made)


def _apply_path(api: FileApi, steps: list[AclStep], sid: str, applied: Applied) -> None:
    path = steps[0].path
    before = api.dacl(path)
    if before is None:  # a writable root or grant that is not there: say so rather than run without it
        raise WinApiError(f"{path} does not exist; create it or take it out of the policy's filesystem section")
    try:
        entry = acljournal.entry_for(path, steps[0].ace.sddl(), before, sid)
        for step in steps[1:]:
            entry = dataclasses.replace(entry, after_sddl=sddl.with_ace(entry.after_sddl, step.ace.sddl()))
    except sddl.SddlError as e:
        raise WinApiError(f"{path}: its ACL cannot be changed safely ({e})") from None
    if entry.after_sddl == before:
        return  # the ACEs are there already: nothing to journal or undo
    _journal(api, applied, entry)  # write-ahead: on disk before the DACL changes
    try:  # the walk below a directory only when something inheritable changed (sddl.same_inheritable)
        api.set_dacl(path, entry.after_sddl, walk=not sddl.same_inheritable(before, entry.after_sddl))
    except WinApiError:
        applied.entries.pop()  # refused: nothing changed, nothing for teardown to undo here
        raise


def _journal(api: FileApi, applied: Applied, entry: JournalEntry) -> None:
    api.append_line(applied.journal, acljournal.encode(entry))
    applied.entries.append(entry)


def undo(api: FileApi, entries: list[JournalEntry], on_error: Callable[[str], None]) -> bool:
    """Restore every entry, newest first; True if all of them were undone."""
    ok = True
    for entry in acljournal.restore_order(entries):
        try:
            _restore(api, entry)
        except WinApiError as e:
            ok = False
            on_error(f"{entry.path}: {e}")
    return ok


def _restore(api: FileApi, entry: JournalEntry) -> None:
    current = api.dacl(entry.path)
    action = acljournal.restore_action(entry, current)
    if action == "set_before" and current is not None:
        api.set_dacl(entry.path, entry.before_sddl, walk=not sddl.same_inheritable(current, entry.before_sddl))
    elif action == "remove_sid_aces" and current is not None:
        after = _without_ours(current, entry.sid)
        api.set_dacl(entry.path, after, walk=not sddl.same_inheritable(current, after))
    elif action == "remove_placeholder":
        api.remove_empty_dir(entry.path)  # not empty: the real user put something there; kept
    elif action == "remove_placeholder_file" and api.read_file(entry.path) == entry.text.encode():
        api.remove_file(entry.path)  # still exactly what sandgate wrote; anything else is the real user's


def _without_ours(current: str, sid: str) -> str:
    """The sandbox SID's ACEs and the plan's OWNER RIGHTS ACEs (acl.OWNER_RIGHTS: r2-fixes F2's inherit-only
    one, owner_rights' on the object) taken out; whatever else the real user changed during the run stays."""
    head, aces = sddl.split_dacl(sddl.without_sid(current, sid))
    ours = [Ace("allow", READ_CONTROL, OWNER_RIGHTS, how).sddl() for how in ("OICIIO", "OICI", "")]
    return head + "".join(a for a in aces if not any(sddl.same_ace(a, o) for o in ours))


def finish(api: FileApi, applied: Applied, on_error: Callable[[str], None]) -> None:
    """Teardown's ACL half: undo, then drop the journal only if everything was undone."""
    if applied.finished:
        return
    if undo(api, applied.entries, on_error):
        api.remove_file(applied.journal)
        applied.entries.clear()
        applied.finished = True


def read_journal(api: FileApi, path: str) -> list[JournalEntry]:
    """The entries of a left journal. A torn LAST line is a write that never completed (its DACL
    change came after it, so never happened) and is dropped; any other bad line refuses the file."""
    data = api.read_file(path)
    if data is None:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(acljournal.decode(line))
        except acljournal.JournalError:
            if i == len(lines) - 1:
                break
            raise WinApiError(f"{path}:{i + 1}: not an ACL journal line; restore that path's ACL by hand") from None
    return out


def replay_left(api: FileApi, appdata: str, on_error: Callable[[str], None]) -> list[str]:
    """Every journal of a run that is no longer alive, undone and removed; returns what was restored."""
    folder = state.journal_dir(appdata)
    done: list[str] = []
    for name in sorted(api.list_dir(folder)):
        pid = state.journal_pid(name)
        if pid is None or pid == api.own_pid() or api.pid_alive(pid):
            continue  # not ours, or a live run's: replaying it would strip that run's boundary
        path = f"{folder}\\{name}"
        try:
            entries = read_journal(api, path)
        except WinApiError as e:
            on_error(str(e))
            continue
        if undo(api, entries, on_error):
            api.remove_file(path)
            done.append(f"ACL journal {path} ({len(entries)} change(s) undone)")
    return done
