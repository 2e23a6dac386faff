r"""Issue 28, H3: setup denies the sandbox SID WMI method execution (root, root\cimv2) and DCOM
launch/activation/access machine-wide, and `setup --remove` takes exactly those ACEs out again,
judged by the fake's access check (servicesdfake.py, the documented contracts enforced)."""

from __future__ import annotations

import pytest

from fsguard.windows import sddl, servicedeny
from fsguard.windows.servicedeny import (
    COM_ACCESS_DENIED,
    WBEM_ENABLE,
    WBEM_METHOD_EXECUTE,
)
from launcher.run.windows import setup
from selftest.windows import probenet
from sgbase.windows.api import WinApiError
from tests.support import winfake
from tests.support.servicesdfake import DEFAULT_SDS
from tests.support.winfake import FakeWinApi

LAUNCH_LOCAL = (
    servicedeny.COM_RIGHTS_EXECUTE | servicedeny.COM_RIGHTS_EXECUTE_LOCAL | servicedeny.COM_RIGHTS_ACTIVATE_LOCAL
)
CIMV2 = "root\\cimv2"
OTHER = "S-1-5-21-1111111111-2222222222-3333333333-1234"  # another local user: must keep its access


def _set_up() -> tuple[FakeWinApi, str]:
    api = FakeWinApi()
    setup.setup(api, lambda _line: None)
    return api, winfake.sandbox_sid(api)


def test_before_setup_any_user_may_create_processes_through_wmi_and_launch_com() -> None:
    api = FakeWinApi()  # the fake's access check grants what Windows grants a user by default
    assert api.wmi_allows(OTHER, CIMV2, WBEM_ENABLE | WBEM_METHOD_EXECUTE)
    assert api.com_allows(OTHER, "MachineLaunchRestriction", LAUNCH_LOCAL)


def test_setup_denies_the_sandbox_sid_wmi_methods_and_com_but_nobody_else() -> None:
    api, sid = _set_up()
    for ns in ("root", CIMV2):
        assert not api.wmi_allows(sid, ns, WBEM_METHOD_EXECUTE)  # Win32_Process.Create refused
        assert not api.wmi_allows(sid, ns, WBEM_ENABLE)
        assert api.wmi_allows(OTHER, ns, WBEM_ENABLE | WBEM_METHOD_EXECUTE)  # the permitted twin
    assert not api.com_allows(sid, "MachineLaunchRestriction", LAUNCH_LOCAL)  # incl. RunAs interactive user
    assert not api.com_allows(sid, "MachineAccessRestriction", COM_ACCESS_DENIED & 0x3)
    assert api.com_allows(OTHER, "MachineLaunchRestriction", LAUNCH_LOCAL)
    assert api.com_allows(OTHER, "MachineAccessRestriction", 0x3)


def test_the_child_namespace_gets_its_own_deny_an_explicit_allow_there_would_beat_an_inherited_one() -> None:
    api = FakeWinApi()
    # a monitoring tool once granted Authenticated Users Execute Methods on root\cimv2 explicitly
    api.m.sds["wmi:" + CIMV2] = "O:BAG:BAD:(A;CI;CCDC;;;AU)"
    setup.setup(api, lambda _line: None)
    sid = winfake.sandbox_sid(api)
    assert not api.wmi_allows(sid, CIMV2, WBEM_METHOD_EXECUTE)
    root_only = api.m.sds["wmi:" + CIMV2].replace(f"(D;CI;0x23;;;{sid})", "")
    api.m.sds["wmi:" + CIMV2] = root_only  # what a root-only deny would have left
    assert api.wmi_allows(sid, CIMV2, WBEM_METHOD_EXECUTE)  # ... and why it is not enough


def test_setup_twice_changes_nothing_and_remove_restores_every_descriptor() -> None:
    api, _sid = _set_up()
    after, before = dict(api.m.sds), len(api.calls)
    setup.setup(api, lambda _line: None)
    assert api.m.sds == after
    second = api.names()[before:]
    assert "wmi_namespace_sd" in second  # looked...
    assert "set_wmi_namespace_sd" not in second and "set_com_restriction_sd" not in second  # ...wrote nothing
    setup.remove(api, lambda _line: None)
    for key, sd in DEFAULT_SDS.items():
        assert api.m.sds[key].replace("O:BAG:BAD:", "") == sd.replace("O:BAG:BAD:", "")


def test_remove_keeps_an_ace_somebody_else_added_for_another_user() -> None:
    api, sid = _set_up()
    sd = api.com_restriction_sd("MachineLaunchRestriction")
    assert sd is not None
    api.m.sds["com:MachineLaunchRestriction"] = sd.replace("D:", f"D:(D;;0x1f;;;{OTHER})", 1)
    setup.remove(api, lambda _line: None)
    left = api.m.sds["com:MachineLaunchRestriction"]
    assert OTHER in left and sid not in left


def test_fake_refuses_a_deny_after_an_allow_and_a_writer_without_admin() -> None:
    api = FakeWinApi()
    late = DEFAULT_SDS["com:MachineLaunchRestriction"] + f"(D;;0x1f;;;{OTHER})"
    with pytest.raises(WinApiError, match="canonical order"):
        api.set_com_restriction_sd("MachineLaunchRestriction", late)
    with pytest.raises(WinApiError, match="WBEM_E_INVALID_PARAMETER"):
        api.set_wmi_namespace_sd("root", f"D:(D;CI;0x23;;;{OTHER})")  # no owner and group
    with pytest.raises(WinApiError, match="WBEM_E_INVALID_PARAMETER"):
        api.set_wmi_namespace_sd("root", f"O:BAG:BAD:(D;IO;0x23;;;{OTHER})")  # inherit-only without CI
    with pytest.raises(WinApiError, match="WRITE_DAC"):
        FakeWinApi(admin=False).set_wmi_namespace_sd("root", DEFAULT_SDS["wmi:root"])


def test_setup_refuses_in_one_line_when_dcom_has_no_limits_value() -> None:
    api = FakeWinApi()
    del api.m.sds["com:MachineAccessRestriction"]
    with pytest.raises(WinApiError, match="dcomcnfg") as e:
        setup.setup(api, lambda _line: None)
    assert "\n" not in str(e.value)
    assert f"(D;CI;0x23;;;{winfake.sandbox_sid(api)})" in api.m.sds["wmi:root"]  # applied before the stop
    setup.remove(api, lambda _line: None)  # no setup record yet: found by the user's name, undone all the same
    assert api.m.sds["wmi:root"] == DEFAULT_SDS["wmi:root"] and api.m.sds["wmi:root\\cimv2"] == "O:BAG:BAD:"


def test_plan_and_edit_are_pure_and_idempotent() -> None:
    edits = servicedeny.plan("S-1-5-21-9-9-9-1001")
    assert [(e.kind, e.target) for e in edits] == [
        ("wmi", "root"),
        ("wmi", CIMV2),
        ("com", "MachineLaunchRestriction"),
        ("com", "MachineAccessRestriction"),
    ]
    sd = "O:BAG:BAD:(A;;CCDCSW;;;WD)S:(AU;FA;0x1;;;WD)"
    once = servicedeny.applied(sd, edits[2])
    assert once.startswith("O:BAG:BAD:(D;;0x1f;;;S-1-5-21-9-9-9-1001)(A;") and once.endswith("S:(AU;FA;0x1;;;WD)")
    assert servicedeny.applied(once, edits[2]) == once
    assert servicedeny.undone(once, edits[2]) == sd


def test_wmi_row_passes_only_on_access_denied_for_both_wmi_and_com() -> None:
    j = probenet.judge_wmi
    wmi_denied = [0, "Invoke-CimMethod : Access denied \r\n HRESULT 0x80041003"]
    com_denied = [1, "Retrieving the COM class factory ... failed: 80070005 Access is denied."]
    base = {"control_in_job": True, "pid": 0, "outside_job": None}
    assert j(0, {**base, "created": wmi_denied, "com": com_denied}).ok
    assert not j(0, {**base, "created": [1, "powershell: not found"], "com": com_denied}).ok  # wrong reason
    assert not j(0, {**base, "created": wmi_denied, "com": [0, "SANDGATE-COM-MADE"]}).ok  # the real user's COM
    assert not j(0, {**base, "created": wmi_denied, "com": [1, "0x80080005 server execution failed"]}).ok
    assert not j(0, {**base, "created": wmi_denied}).ok  # COM never attempted: proves nothing


@pytest.mark.parametrize("step", ["set_wmi_namespace_sd#2", "set_com_restriction_sd#1", "set_com_restriction_sd#2"])
def test_a_setup_failing_midway_through_the_denies_is_removed_whole(step: str) -> None:
    api = FakeWinApi()
    name, n = step.split("#")
    api.fail = (name, int(n))
    with pytest.raises(WinApiError, match="fake failure"):
        setup.setup(api, lambda _line: None)
    api.fail = None
    setup.remove(api, lambda _line: None)
    assert api.m.sds == DEFAULT_SDS  # every deny ACE that went in came out; nobody else's touched
    assert api.m.users == {}


OLD_FORMAT = "O:BAG:BAD:(A;;CC;;;BA)(A;;CC;;;WD)"  # before XP SP2: every ACE COM_RIGHTS_EXECUTE alone


def test_setup_never_writes_a_mixed_format_com_acl() -> None:
    """S4 (session 38): our deny is in the new format; added to an old-format limit it would make the
    machine-wide descriptor invalid ("you must not mix the old format and the new format"), and every
    COM server with it. Refused in one line, the value untouched, removable as usual."""
    api = FakeWinApi()
    api.m.sds["com:MachineLaunchRestriction"] = OLD_FORMAT
    with pytest.raises(WinApiError, match="old COM ACL format") as e:
        setup.setup(api, lambda _line: None)
    assert "\n" not in str(e.value) and api.m.sds["com:MachineLaunchRestriction"] == OLD_FORMAT
    setup.remove(api, lambda _line: None)
    assert api.m.sds == {**DEFAULT_SDS, "com:MachineLaunchRestriction": OLD_FORMAT}


def test_fake_refuses_an_invalid_com_acl() -> None:
    api = FakeWinApi()
    sid = "S-1-5-21-9-9-9-1001"
    with pytest.raises(WinApiError, match="mixed"):
        api.set_com_restriction_sd("MachineLaunchRestriction", f"O:BAG:BAD:(D;;0x1f;;;{sid})(A;;CC;;;WD)")
    with pytest.raises(WinApiError, match="COM_RIGHTS_EXECUTE"):
        api.set_com_restriction_sd("MachineAccessRestriction", f"O:BAG:BAD:(D;;0x6;;;{sid})(A;;CCDC;;;WD)")
    assert servicedeny.com_format_ok(DEFAULT_SDS["com:MachineLaunchRestriction"])
    assert servicedeny.com_format_ok(DEFAULT_SDS["com:MachineAccessRestriction"])
    assert not servicedeny.com_format_ok(OLD_FORMAT)
    for edit in servicedeny.plan(sid)[2:]:  # our own ACEs are the new format, EXECUTE included
        mask = sddl.parse_ace(edit.ace).mask
        assert mask & servicedeny.COM_RIGHTS_EXECUTE and mask != servicedeny.COM_RIGHTS_EXECUTE
