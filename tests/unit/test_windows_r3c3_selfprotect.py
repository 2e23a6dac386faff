"""r3-c3 (r2-ci C3): the pure plan of the denies on sandgate's own code folders, their SDDL edit
and undo by meaning, the run's overlap rule, the setup record, and the interpreter's folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fsguard.windows import acl, sddl, selfprotect, win32selfprotect
from sgbase.windows import state
from tests.support import ntfsmodel

SID = "S-1-5-21-9-9-9-1001"
HOME = r"C:\Users\me"
PY = r"C:\hostedtoolcache\windows\Python\3.12.8\x64"
SITE = PY + r"\Lib\site-packages"
CHECKOUT = r"D:\a\sandgate\sandgate"
SYSTEM = (r"C:\Windows", r"C:\Program Files", r"C:\Program Files (x86)")


def _plan(*dirs: str) -> selfprotect.SelfPlan:
    return selfprotect.plan(dirs, HOME, SYSTEM)


def test_code_folders_get_the_inherited_deny_and_their_ancestors_a_guard() -> None:
    p = _plan(PY, SITE, PY + r"\Scripts", CHECKOUT, PY)
    code = [e.path for e in p.edits if e.kind == "code"]
    guards = [e.path for e in p.edits if e.kind == "guard"]
    assert code == [PY, SITE, PY + r"\Scripts", CHECKOUT]  # deduplicated, in order
    assert guards == [
        r"C:\hostedtoolcache\windows\Python\3.12.8",
        r"C:\hostedtoolcache\windows\Python",
        r"C:\hostedtoolcache\windows",
        r"C:\hostedtoolcache",
        r"D:\a\sandgate",
        r"D:\a",
    ]  # never a drive root; PY\Lib lies inside PY, whose inherited deny covers its DELETE
    assert p.skipped == ()


def test_profile_windows_and_network_folders_are_skipped_and_said() -> None:
    profile = HOME + r"\AppData\Roaming\Python\Python312\site-packages"
    p = _plan(
        profile, r"C:\Windows\System32", r"\\server\share\py", "/usr/lib/python3.12", r"C:\Program Files\Python312"
    )
    assert [e.path for e in p.edits] == [r"C:\Program Files\Python312"]  # no guard on Program Files or above
    why = dict(p.skipped)
    assert "profile" in why[profile] and "Windows folder" in why[r"C:\Windows\System32"]
    assert "network" in why[r"\\server\share\py"] and "/usr/lib/python3.12" not in why  # not a Windows path
    assert selfprotect.code_folders(p) == (r"C:\Program Files\Python312", profile, r"C:\Windows\System32")


def test_the_deny_names_every_right_that_plants_or_unplants_code() -> None:
    (code,) = [e for e in _plan(PY).edits if e.kind == "code"]
    ace = sddl.parse_ace(code.ace(SID))
    assert ace.kind == "D" and ace.flags == frozenset({"OI", "CI"}) and ace.sid == SID
    for right in (0x2, 0x4, 0x10, 0x40, 0x100, 0x10000, 0x40000, 0x80000):  # write, append, EA, delete-child,
        assert ace.mask & right  # attributes, DELETE, WRITE_DAC, WRITE_OWNER (winnt.h)
    assert ace.mask == acl.DENY_WRITE
    guard = sddl.parse_ace(selfprotect.Edit(r"C:\hostedtoolcache", "guard").ace(SID))
    assert guard.flags == frozenset() and guard.mask == acl.GUARD_SELF  # that folder only: siblings untouched


def test_add_and_undo_by_meaning_through_windows_spelling() -> None:
    before = f"D:AI(A;OICI;0x1200a9;;;{SID})(A;OICIID;FA;;;SY)(A;OICIIO;SDGRGWGX;;;AU)"
    edit = selfprotect.Edit(SITE, "code")
    added = ntfsmodel.windows_spelling(selfprotect.applied(before, edit, SID))  # how Windows reads it back
    assert sddl.split_dacl(added)[1][0].startswith("(D;")  # explicit deny first: before every allow
    assert selfprotect.has(added, edit, SID) and not selfprotect.has(before, edit, SID)
    assert selfprotect.applied(added, edit, SID) == added  # idempotent
    back = selfprotect.undone(added, edit, SID)
    assert sddl.same_dacl(back, before)  # the sandbox SID's own allow and everyone else's kept


def test_missing_names_a_folder_setup_never_saw() -> None:
    recorded = _plan(PY, SITE).edits
    assert selfprotect.missing(_plan(PY.upper(), SITE), recorded) == ()  # NTFS compares case-insensitively
    venv = r"C:\tools\venv\Lib\site-packages"
    assert next(e.path for e in selfprotect.missing(_plan(PY, SITE, venv), recorded)) == venv


def test_overlap_refuses_a_workspace_that_is_or_lies_in_code_or_holds_undenied_code() -> None:
    p = _plan(CHECKOUT, SITE, HOME + r"\src\tool\.venv\Lib\site-packages")
    code, denied = selfprotect.code_folders(p), p.edits
    assert selfprotect.overlap((CHECKOUT,), code, denied)  # the CI checkout as workspace
    assert selfprotect.overlap((CHECKOUT + r"\launcher",), code, denied)  # inside: its grant beats the inherited deny
    assert selfprotect.overlap((HOME + r"\src\tool",), code, denied)  # holds a venv that carries no deny
    assert selfprotect.overlap((r"D:\a\sandgate",), code, denied) is None  # holds the checkout, which has its deny
    assert selfprotect.overlap((r"D:\a\_temp", HOME + r"\src\other"), code, denied) is None


def test_the_record_keeps_the_denies_and_reads_an_older_one() -> None:
    rec = state.SetupRecord("sandgate-x", SID, 3128, ((PY, "code"), (r"C:\hostedtoolcache", "guard")))
    assert state.decode(state.encode(rec)) == rec
    old = state.encode(state.SetupRecord("sandgate-x", SID, 3128))
    assert b"protected" not in old and state.decode(old).protected == ()
    for bad in (b'"x"', b'[["C:\\\\a", "everything"]]', b'[["C:\\\\a"]]'):
        raw = old[:-1] + b', "protected": ' + bad + b"}"
        with pytest.raises(state.StateError):
            state.decode(raw)  # never guess which ACEs --remove takes out
    assert selfprotect.from_record(selfprotect.to_record(_plan(PY).edits)) == _plan(PY).edits


def test_sources_are_this_interpreters_folders_not_where_the_user_stands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])  # `python -m`: the working directory first
    found = win32selfprotect.sources()
    repo = str(Path(__file__).resolve().parents[2])  # the folder holding `launcher` (an editable install)
    assert str(tmp_path) not in found and repo in found
    assert sys.prefix in found and all(os.path.isdir(d) for d in found)
    assert win32selfprotect.system_dirs({"SYSTEMROOT": r"C:\Windows", "ProgramFiles": r"C:\PF"}) == (
        r"C:\Windows",
        r"C:\PF",
        "",
    )
