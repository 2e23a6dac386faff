"""fsguard.userns.plan: who the command is inside its user namespace, for every way sandgate is started."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsguard import userns
from fsguard.userns import IdMap


def test_root_without_a_user_is_root_inside_with_nothing_else_mapped() -> None:
    ident = userns.plan(0, 0, None, root_inside=False)
    assert ident.uid_map == ident.gid_map == (IdMap(0, 0, 1),)
    assert ident.root_inside and not ident.switch and not ident.deny_setgroups


def test_root_for_a_sudo_caller_maps_that_user_and_switches_to_it() -> None:
    ident = userns.plan(0, 0, (1000, 1000, (1000, 27)), root_inside=False)
    assert ident.uid_map == (IdMap(0, 0), IdMap(1000, 1000))
    assert ident.gid_map == (IdMap(0, 0), IdMap(1000, 1000), IdMap(27, 27))
    assert (ident.uid, ident.gid, ident.groups, ident.switch) == (1000, 1000, (1000, 27), True)


def test_root_with_user_0_stays_root() -> None:
    assert userns.plan(0, 0, (1000, 1000, ()), root_inside=True).uid == 0


def test_an_ordinary_user_is_itself_inside_and_must_deny_setgroups() -> None:
    ident = userns.plan(1000, 1001, None, root_inside=False)
    assert ident.uid_map == (IdMap(1000, 1000),) and ident.gid_map == (IdMap(1001, 1001),)
    assert ident.deny_setgroups and not ident.switch and ident.uid == 1000 and ident.groups == ()


def test_an_ordinary_user_may_be_root_inside_mapped_to_itself() -> None:
    ident = userns.plan(1000, 1001, None, root_inside=True)
    assert ident.uid_map == (IdMap(0, 1000),) and ident.gid_map == (IdMap(0, 1001),) and ident.root_inside


def test_an_ordinary_user_cannot_become_someone_else() -> None:
    with pytest.raises(userns.UsernsError, match="without root"):
        userns.plan(1000, 1000, (1001, 1001, ()), root_inside=False)


@given(st.integers(1, 2**31 - 2), st.integers(0, 2**31 - 2), st.booleans())
def test_unprivileged_maps_only_ever_name_the_callers_own_ids(uid: int, gid: int, root: bool) -> None:
    """The kernel's rule for an unprivileged writer: one line, its own id; anything else is refused."""
    ident = userns.plan(uid, gid, None, root_inside=root)
    assert [m.outside for m in ident.uid_map] == [uid] and [m.outside for m in ident.gid_map] == [gid]
    assert all(m.count == 1 for m in (*ident.uid_map, *ident.gid_map)) and ident.deny_setgroups


def test_map_text_is_one_line_per_range() -> None:
    assert userns.map_text((IdMap(0, 0), IdMap(5, 7, 2))) == "0 0 1\n5 7 2\n"


@pytest.mark.parametrize(
    "path,value,setting",
    [
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone = 0"),
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces = 0"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "kernel.apparmor_restrict_unprivileged_userns = 1",
        ),
    ],
)
def test_a_disabled_user_namespace_names_the_setting_and_the_fix(path: str, value: str, setting: str) -> None:
    why = userns.unprivileged_userns_problem(lambda p: value if p == path else None)
    assert why is not None and why.startswith(setting) and "sysctl" in why


def test_nothing_is_blamed_when_the_settings_allow_it() -> None:
    assert userns.unprivileged_userns_problem(lambda p: {"/proc/sys/user/max_user_namespaces": "96363"}.get(p)) is None


def test_root_maps_the_accounts_root_tools_drop_to() -> None:
    ident = userns.plan(0, 0, None, root_inside=False, helpers=((42, 65534),))
    assert ident.uid_map == (IdMap(0, 0), IdMap(42, 42)) and ident.gid_map == (IdMap(0, 0), IdMap(65534, 65534))
    assert userns.plan(1000, 1000, None, root_inside=True, helpers=((42, 65534),)).uid_map == (IdMap(0, 1000),)
