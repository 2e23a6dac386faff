"""ACL plans from fsguard's own lists (no copy), Windows path mapping, and the DACL journal."""

from __future__ import annotations

import pytest

from fsguard import policy as fspolicy
from fsguard.windows import acl, acljournal, sddl, winpath
from sgbase.policyerror import PolicyError

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"
WS, HOME = r"C:\src\proj", r"C:\Users\me"


def _existing(*paths: str) -> frozenset[str]:
    return frozenset(winpath.key(p) for p in paths)


def _plan(fs: fspolicy.FsPolicy | None = None, *existing: str) -> acl.AclPlan:
    fs = fs or fspolicy.FsPolicy()
    return acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=_existing(*existing))


def _paths(plan: acl.AclPlan, why: str) -> list[str]:
    return [s.path for s in plan.steps if s.why == why]


def test_path_mapping_round_trips_and_refuses_what_it_cannot_plan() -> None:
    assert winpath.to_posix(r"c:\Users\me\.ssh") == "/C:/Users/me/.ssh"
    assert winpath.to_windows("/C:/Users/me/.ssh") == r"C:\Users\me\.ssh"
    assert winpath.to_windows(winpath.to_posix("D:\\")) == "D:\\"
    for bad in (r"\\server\share\x", r"\\?\C:\x", "C:relative", r"C:\a\..\b", "relative"):
        with pytest.raises(winpath.WinPathError):
            winpath.to_posix(bad)


def test_the_workspace_gets_modify_and_nothing_else_is_granted() -> None:
    plan = _plan()
    grants = [s for s in plan.steps if s.ace.kind == "allow" and s.ace.sid != acl.OWNER_RIGHTS]  # r2-fixes F2: RC only
    assert [(s.path, s.ace.mask, s.ace.inherit) for s in grants] == [(WS, acl.MODIFY, "OICI")]
    assert not acl.MODIFY & 0x40  # no FILE_DELETE_CHILD: it would override every child's deny
    assert "/tmp" in plan.not_applicable  # the private /tmp is the sandbox user's own %TEMP% here


def test_denies_come_before_grants() -> None:
    kinds = [s.ace.kind for s in _plan().steps]
    assert kinds == sorted(kinds, key=lambda k: k != "deny")


def test_protected_names_are_fsguards_and_missing_ones_get_placeholders() -> None:
    plan = _plan(fspolicy.FsPolicy(), WS + r"\.git", WS + r"\.git\HEAD", WS + r"\.git\config", WS + r"\.vscode")
    protect = {s.path: s for s in plan.steps if s.why == "protect"}
    for name in (".vscode", ".idea", ".claude", ".sandgate", ".sandgate.yaml", ".envrc", ".mcp.json"):
        assert WS + "\\" + name in protect, name
    for name in fspolicy.GIT_DIR_PROTECT:  # every git indirection, from fsguard's list
        assert WS + "\\.git\\" + name.rstrip("/").replace("/", "\\") in protect, name
    assert not protect[WS + r"\.vscode"].placeholder and protect[WS + r"\.idea"].placeholder
    assert not protect[WS + r"\.git\config"].placeholder and protect[WS + r"\.git\hooks"].placeholder
    assert protect[WS + r"\.git\config"].ace.inherit == ""  # an existing file: no inheritance
    assert all(s.ace == acl.Ace("deny", acl.DENY_WRITE, SID, s.ace.inherit) for s in protect.values())
    assert acl.DENY_WRITE & 0x10000 and acl.DENY_WRITE & 0x2 and acl.DENY_WRITE & 0x40000  # delete, write, re-ACL


def test_no_git_placeholder_without_a_repository() -> None:
    protect = _paths(_plan(), "protect")
    assert not any(r"\.git" in p for p in protect)
    assert WS + r"\.vscode" in protect


def test_unprotect_opens_only_what_fsguard_allows() -> None:
    opened = fspolicy.FsPolicy(unprotect=(fspolicy.check_unprotect(".vscode/", None),))
    assert WS + r"\.vscode" not in _paths(_plan(opened), "protect")
    with pytest.raises(PolicyError):
        fspolicy.check_unprotect(".git/hooks/", None)


def test_secrets_are_denied_read_where_they_exist() -> None:
    plan = _plan(fspolicy.FsPolicy(), HOME + r"\.ssh", HOME + r"\.aws")
    assert _paths(plan, "read_deny") == [HOME + r"\.ssh", HOME + r"\.aws"]
    step = next(s for s in plan.steps if s.why == "read_deny")
    assert step.ace == acl.Ace("deny", acl.DENY_READ, SID, "OICI")


def test_policy_paths_in_windows_form_and_extra_roots() -> None:
    fs = fspolicy.FsPolicy(write=(".", r"D:\cache"), protect=(r"D:\cache\keep",), read_deny=(r"C:\secrets",))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=_existing(r"D:\cache\keep", r"C:\secrets"))
    assert _paths(plan, "write") == [WS, r"D:\cache"]
    assert r"D:\cache\keep" in _paths(plan, "protect")
    assert r"D:\cache\.vscode" not in _paths(plan, "protect")  # defaults in extra roots: only where they exist
    assert r"C:\secrets" in _paths(plan, "read_deny")


def test_case_variants_are_one_path() -> None:
    fs = fspolicy.FsPolicy(protect=(".VSCode/",))
    assert [p.casefold() for p in _paths(_plan(fs), "protect")].count((WS + r"\.vscode").casefold()) == 1


def test_journal_round_trip_and_restore_decisions() -> None:
    e = acljournal.JournalEntry(WS, "D:(A;OICI;FA;;;BA)", f"D:(A;OICI;0x1301bf;;;{SID})(A;OICI;FA;;;BA)", SID)
    assert acljournal.decode(acljournal.encode(e)) == e
    assert acljournal.restore_action(e, e.after_sddl) == "set_before"
    changed = e.after_sddl + "(A;;FR;;;S-1-5-21-9-9-9-500)"  # the real user changed it meanwhile
    assert acljournal.restore_action(e, changed) == "remove_sid_aces"
    assert sddl.without_sid(changed, SID) == "D:(A;OICI;FA;;;BA)(A;;FR;;;S-1-5-21-9-9-9-500)"
    assert acljournal.restore_action(e, e.before_sddl) == "nothing"  # crashed before the change
    assert acljournal.restore_action(e, None) == "nothing"
    ph = acljournal.JournalEntry(WS + r"\.idea", "", "D:(D;OICI;0xd0156;;;x)", SID, placeholder=True)
    assert acljournal.restore_action(ph, ph.after_sddl) == "remove_placeholder"
    assert acljournal.restore_order([e, ph]) == [ph, e]


@pytest.mark.parametrize(
    "line",
    [
        "",
        "{}",
        "[1]",
        '{"path": 1, "before": "", "after": "", "sid": "", "placeholder": false}',
        '{"path": "", "before": "", "after": "", "sid": "", "placeholder": "yes"}',
    ],
)
def test_unreadable_journal_lines_are_refused(line: str) -> None:
    with pytest.raises(acljournal.JournalError):
        acljournal.decode(line)


def test_aces_go_where_canonical_order_puts_them() -> None:
    base = "D:AI(A;;FA;;;BA)(D;OICIID;WD;;;S-1-5-21-9-9-9-7)(A;OICIID;FA;;;SY)"
    deny = acl.Ace("deny", acl.DENY_WRITE, SID, "OICI").sddl()
    allow = acl.Ace("allow", acl.MODIFY, SID, "OICI").sddl()
    with_deny = sddl.with_ace(base, deny)
    assert sddl.split_dacl(with_deny)[1][0] == deny  # before every allow, explicit or inherited
    both = sddl.with_ace(with_deny, allow)
    assert sddl.split_dacl(both)[1][:3] == [deny, allow, "(A;;FA;;;BA)"]  # after the explicit denies
    assert sddl.with_ace(both, allow) == both  # idempotent
    assert sddl.without_sid(both, SID) == base


def test_sddl_edits_keep_conditional_aces_and_other_trustees_whole() -> None:
    cond = '(XA;;FX;;;S-1-1-0;(@User.Title == "PM" && (@User.Division == "Finance")))'
    near = f"(A;;FA;;;{SID}0)"  # a SID that merely starts like ours
    obj = f"(OA;;RP;bf967aba-0de6-11d0-a285-00aa003049e2;;{SID})"
    text = "D:P" + cond + near + obj
    assert sddl.split_dacl(text) == ("D:P", [cond, near, obj])
    assert sddl.without_sid(text, SID) == "D:P" + cond + near
    assert sddl.split_dacl("D:P") == ("D:P", [])
    with pytest.raises(sddl.SddlError):  # a NULL DACL: one ACE would lock everyone else out
        sddl.with_ace("D:NO_ACCESS_CONTROL", near)


@pytest.mark.parametrize("bad", ["O:BA", "D:(A;;FA;;;SY", "D:(A;;FA;;;SY))", "D:x(A;;FA;;;SY)", "D:(A;;FA)"])
def test_unreadable_dacls_are_refused(bad: str) -> None:
    with pytest.raises(sddl.SddlError):
        sddl.without_sid(bad, SID)


def test_a_journal_entry_records_before_and_after_and_restores_exactly() -> None:
    before = "D:AI(A;OICIID;FA;;;SY)"
    step = _plan().steps[-1]  # the workspace grant
    e = acljournal.entry_for(step.path, step.ace.sddl(), before, SID)
    assert e.after_sddl == "D:AI" + step.ace.sddl() + "(A;OICIID;FA;;;SY)"
    assert acljournal.restore_action(e, e.after_sddl) == "set_before"
    assert sddl.without_sid(e.after_sddl, SID) == before


# issue 28 M4: restore decisions by meaning, not by SDDL text


def test_a_dacl_windows_respelled_is_still_the_one_we_set() -> None:
    from tests.support import ntfsmodel

    before = "D:(A;OICI;0x1f01ff;;;S-1-5-18)(A;OICI;0x1200a9;;;s-1-5-21-9-9-9-500)"
    e = acljournal.entry_for(WS, acl.Ace("deny", 0x10000, SID, "").sddl(), before, SID)
    current = ntfsmodel.windows_spelling(e.after_sddl)  # what the fake (and Windows) reads back
    assert current != e.after_sddl and current.startswith("D:AI(D;;SD;;;" + SID + ")(A;OICI;FA;;;SY)")
    assert acljournal.restore_action(e, current) == "set_before"
    parent_changed = current + "(A;OICIID;FR;;;BU)"  # inherited ACEs follow the parent: not a change here
    assert acljournal.restore_action(e, parent_changed) == "set_before"
    user_changed = current.replace("(A;OICI;FA;;;SY)", "(A;OICI;FA;;;SY)(A;;FR;;;BU)")
    assert acljournal.restore_action(e, user_changed) == "remove_sid_aces"
    assert acljournal.restore_action(e, current.replace("D:AI", "D:PAI")) == "remove_sid_aces"  # now protected
    assert sddl.with_ace(current, e.after_sddl[len("D:") : e.after_sddl.index(")") + 1]) == current  # no twin


def test_restore_keeps_the_sandbox_users_own_earlier_ace_after_windows_respells() -> None:
    """With a text compare the respelled DACL looked changed, and the fallback stripped every ACE of
    the SID, a read grant somebody gave it before the run included."""
    from fsguard.windows import aclapply
    from tests.support.winfake import FakeWinApi

    api = FakeWinApi()
    own = f"D:(A;OICI;0x1200a9;;;{SID})(A;OICI;0x1f01ff;;;S-1-5-18)"
    api.m.dacls[WS] = own
    plan = acl.AclPlan((acl.AclStep(WS, acl.Ace("deny", acl.GUARD_SELF, SID, ""), "guard"),), ())
    applied = aclapply.Applied(r"C:\Users\me\AppData\Local\j.jsonl")
    aclapply.apply(api, plan, SID, applied)
    aclapply.finish(api, applied, pytest.fail)
    assert sddl.same_dacl(api.m.dacls[WS], own) and f"(A;OICI;0x1200a9;;;{SID})" in api.m.dacls[WS]


def test_sddl_spellings_parse_to_one_meaning() -> None:
    assert sddl.same_ace("(A;CIOI;0x1F01FF;;;sy)", "(A;OICI;FA;;;S-1-5-18)")
    assert sddl.parse_ace("(D;;SDWDWO;;;BU)").mask == 0xD0000
    assert not sddl.same_ace("(A;OICI;FA;;;SY)", "(A;OICIID;FA;;;SY)")
    for bad in ("(A;;QQ;;;SY)", "(A;XX;FA;;;SY)", "(A;;;;;SY)"):
        with pytest.raises(sddl.SddlError):
            sddl.parse_ace(bad)


def test_journal_lines_carry_the_placeholder_kind_and_old_lines_still_read() -> None:
    e = acljournal.JournalEntry(WS + r"\.git\commondir", "", "", SID, placeholder=True, kind="file", text=".\n")
    assert acljournal.decode(acljournal.encode(e)) == e
    assert acljournal.restore_action(e, "D:AI") == "remove_placeholder_file"
    old = '{"after": "", "before": "", "path": "C:\\\\x", "placeholder": true, "sid": "S-1-5-21-1"}'
    assert acljournal.decode(old).kind == "dir"
    with pytest.raises(acljournal.JournalError):
        acljournal.decode(old.replace("}", ', "kind": "socket"}'))


def test_guards_sit_on_git_its_parent_and_the_roots_only() -> None:
    plan = _plan(fspolicy.FsPolicy(), WS + r"\.git", WS + r"\.git\HEAD", WS + r"\.git\config")
    guards = {s.path: s.ace for s in plan.steps if s.why == "guard"}
    assert guards[WS] == acl.Ace("deny", acl.GUARD_SELF, SID, "")  # root: no rename, no delete-child
    assert guards[WS + r"\.git"] == acl.Ace("deny", acl.GUARD_SELF, SID, "")  # not inherited: index stays writable
    # the directories on the way to `alternates` cannot be renamed away either (win-acl A2)
    assert guards[WS + r"\.git\objects\info"].mask == acl.GUARD_PARENT | acl.GUARD_CHAIN
    assert guards[WS + r"\.git\objects"].mask == acl.GUARD_CHAIN
    assert not acl.GUARD_SELF & 0x2 and acl.GUARD_SELF & 0x10000 and acl.GUARD_SELF & 0x40
    assert HOME not in guards  # outside the writable roots: no re-ACL of the profile
    kinds = [s.ace.kind for s in plan.steps]
    assert kinds == sorted(kinds, key=lambda k: k != "deny")


def test_plan_keys_compare_as_ntfs_does_not_as_unicode_case_folding() -> None:
    """win-acl A8: NTFS upper-cases names one character at a time ($UpCase), so `.GiT` is `.git` but
    `straße` and `strasse` are two folders; str.casefold() merged them and one root lost its guard."""
    assert winpath.key(WS + r"\.GiT") == winpath.key(WS + r"\.git")
    assert winpath.key(r"C:\straße") != winpath.key(r"C:\strasse")
    fs = fspolicy.FsPolicy(write=(r"C:\straße", r"C:\strasse"))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=frozenset())
    guarded = {s.path for s in plan.steps if s.why == "guard" and s.ace.mask == acl.GUARD_SELF}
    assert {r"C:\straße", r"C:\strasse"} <= guarded
