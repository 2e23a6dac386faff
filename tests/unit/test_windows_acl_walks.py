"""win-acl A4: one SetNamedSecurityInfo per path and run at apply, one at undo.

Each call on a directory rewrites the security descriptor of every object below it ("the system
automatically propagates any inheritable access control entries (ACEs) to existing child objects",
https://learn.microsoft.com/en-us/windows/win32/api/aclapi/nf-aclapi-setnamedsecurityinfow): Microsoft
reports about two minutes for 50,000 files (https://devblogs.microsoft.com/oldnewthing/20151007-00/?p=91421).
The workspace root carries two ACEs (the guard and the Modify grant); as two calls they were four
walks of the whole workspace per run (a node_modules of 100k files: a quarter of an hour). Fake
evidence only: the count of calls, which is what costs on Windows.
"""

from __future__ import annotations

from collections import Counter

from fsguard import policy as fspolicy
from fsguard.windows import acl, aclapply, sddl, winpath
from tests.support.winfake import APPDATA, BASE_DACL, HOME, WS, FakeWinApi, workspace

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"


def _sets(api: FakeWinApi) -> Counter[str]:
    return Counter(winpath.key(str(args[0])) for name, args in api.calls if name == "set_dacl")


def test_each_path_is_set_once_at_apply_and_once_at_undo_with_all_its_aces() -> None:
    api = FakeWinApi(workspace())
    fs = fspolicy.FsPolicy()
    existing = frozenset(winpath.key(p) for p in acl.candidates(fs, cwd=WS, home=HOME) if api.exists(p))
    plan = acl.plan_acls(fs, sid=SID, cwd=WS, home=HOME, existing=existing)
    assert sum(winpath.key(s.path) == winpath.key(WS) for s in plan.steps) == 2  # the guard and the grant
    applied = aclapply.Applied(APPDATA + r"\sandgate-walks.jsonl")
    aclapply.apply(api, plan, SID, applied)
    sets = _sets(api)
    assert sets[winpath.key(WS)] == 1 and max(sets.values()) == 1, sets
    aces = {sddl.parse_ace(a) for a in sddl.split_dacl(api.m.dacls[WS])[1]}
    want = {sddl.parse_ace(acl.Ace("deny", acl.GUARD_SELF, SID, "").sddl())}
    want.add(sddl.parse_ace(acl.Ace("allow", acl.MODIFY, SID, acl.OICI).sddl()))
    assert want <= aces  # both ACEs, in one DACL
    heads = [sddl.parse_ace(a) for a in sddl.split_dacl(api.m.dacls[WS])[1]]
    assert heads[0].kind == "D" and heads[1].kind == "A"  # canonical: the explicit deny first
    api.calls.clear()
    aclapply.finish(api, applied, lambda line: None)
    assert _sets(api) == Counter({k: 1 for k in sets}), _sets(api)  # one restore per path
    assert sddl.same_dacl(api.m.dacls[WS], BASE_DACL) and applied.finished
