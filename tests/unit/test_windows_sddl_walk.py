"""sddl.same_inheritable: when a DACL may be written to the object alone (SetFileSecurityW, no walk).

SetNamedSecurityInfo "imposes the current inheritance model on the ACLs of all objects in the hierarchy
below the target object" (learn.microsoft.com/windows/win32/secauthz/automatic-propagation-of-inheritable-aces):
a guard on C:\\hostedtoolcache rewrote the whole tool cache (r4-setup R3). Only a change that no child
inherits may skip that walk; the fake WinApi refuses any other (tests/support/winfake.set_dacl).
"""

from __future__ import annotations

import pytest

from fsguard.windows import sddl

SID = "S-1-5-21-1-2-3-1001"
BASE = "D:AI(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)"


@pytest.mark.parametrize(
    "after, here",
    [
        (f"D:AI(D;;0xd0000;;;{SID})(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)", True),  # a guard
        ("D:AI(A;;0x20000;;;S-1-3-4)(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)", True),  # no OI/CI
        (f"D:AI(D;OICI;0xd0156;;;{SID})(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)", False),
        (f"D:AI(D;CI;0xd0156;;;{SID})(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)", False),
        ("D:AI(A;OICIIO;0x20000;;;S-1-3-4)(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)", False),
        ("D:PAI(A;OICIID;FA;;;SY)(A;OICIID;FA;;;BA)(A;OICIID;0x1301bf;;;AU)", False),  # inheritance blocked
        (BASE, True),
    ],
)
def test_only_a_change_no_child_inherits_skips_the_walk(after: str, here: bool) -> None:
    assert sddl.same_inheritable(BASE, after) is here
    assert sddl.same_inheritable(after, BASE) is here  # taking it out again: the same answer


def test_a_run_walks_only_where_an_inheritable_ace_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `sandgate run` on the fake: the workspace's grant walks its tree (in and out), `.git`'s guard
    (that object only) does not, and everything is restored."""
    from launcher import cli
    from tests.support import winfake

    api = winfake.installed(monkeypatch)
    before = dict(api.m.dacls)
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == api.exit_code
    writes = [(name, str(args[0])) for name, args in api.calls if name.startswith("set_dacl")]
    walked = {p for n, p in writes if n == "set_dacl"}
    here = {p for n, p in writes if n == "set_dacl_here"}
    assert winfake.WS in walked and winfake.WS not in here  # Modify (OICI) on the root: the walk, twice
    assert winfake.WS + r"\.git" in here and winfake.WS + r"\.git" not in walked  # the guard: no walk
    assert api.m.dacls == before
