"""win32wfp against a fake BFE that enforces WFP's documented contract (tests/support/bfefake.py):
the real ctypes structures go in, so these tests catch what the fake WinApi cannot (issue 28:
W2 read access, M1 void restype, M7 removal errors, M8 leaked descriptors, dynamic sessions)."""

from __future__ import annotations

import pytest

from launcher.run.windows.realapi import RealWinApi
from netguard.windows import wfp, wfpwire, win32wfp
from sgbase.windows import win32calls
from sgbase.windows.win32 import Win32Error
from tests.support.bfefake import Engine

REAL = "S-1-5-21-1111111111-2222222222-3333333333-1000"
SANDBOX = "S-1-5-21-1111111111-2222222222-3333333333-1001"


@pytest.fixture
def bfe(monkeypatch: pytest.MonkeyPatch) -> Engine:
    engine = Engine(caller=REAL, elevated=True)
    monkeypatch.setattr(win32wfp, "fn", engine.fn)
    return engine


def _plan() -> wfp.WfpPlan:
    return wfp.plan_filters(SANDBOX, (3128,), owner=REAL)


def test_an_unelevated_run_can_read_the_filters_setup_installed(bfe: Engine) -> None:
    """W2: every run (unelevated) checks the filters; it needs FWPM_ACTRL_READ, which only the
    filter's own descriptor can grant it."""
    win32wfp.install(_plan())
    bfe.elevated = False
    assert win32wfp.installed(_plan())
    for f in bfe.filters.values():  # read only: the real user may not delete or change them
        assert f.sddl is not None and f"(A;;0x20080;;;{REAL})" in f.sddl and "GA;;;BA" in f.sddl


def test_a_filter_without_the_read_grant_is_an_error_not_missing(bfe: Engine) -> None:
    """The old slip: installed without the grant, every unelevated check said "not installed"."""
    win32wfp.install(wfp.plan_filters(SANDBOX, (3128,)))  # no owner: no reader
    bfe.elevated = False
    with pytest.raises(win32wfp.ReadDenied):
        win32wfp.installed(wfp.plan_filters(SANDBOX, (3128,)))
    bfe.caller = SANDBOX  # the sandbox user may not read them either
    bfe.elevated = True
    win32wfp.remove(wfp.plan_filters(SANDBOX, (3128,)))
    win32wfp.install(_plan())
    bfe.elevated = False
    with pytest.raises(win32wfp.ReadDenied):
        win32wfp.installed(_plan())


def test_a_missing_filter_is_not_installed(bfe: Engine) -> None:
    win32wfp.install(_plan())
    del bfe.filters[str(_plan().filters[3].key)]
    assert not win32wfp.installed(_plan())


def test_free_memory_is_declared_void() -> None:
    """M1: FwpmFreeMemory0 returns void; a DWORD restype reads whatever RAX holds."""
    assert win32calls.BY_NAME["FwpmFreeMemory0"].restype is None


def test_removal_reports_what_it_could_not_delete(bfe: Engine) -> None:
    """M7: an ignored failure left filters behind, and the next setup failed with ALREADY_EXISTS."""
    win32wfp.install(_plan())
    bfe.elevated = False
    with pytest.raises(Win32Error):
        win32wfp.remove(_plan())
    assert bfe.filters  # nothing claimed removed
    bfe.elevated = True
    win32wfp.remove(_plan())
    assert not bfe.filters and not bfe.sublayers and not bfe.providers
    win32wfp.remove(_plan())  # a second removal: everything missing is fine
    win32wfp.install(_plan())  # and setup works again


def test_removal_refuses_a_sublayer_still_in_use(bfe: Engine) -> None:
    win32wfp.install(wfp.plan_filters(SANDBOX, (3128, 3129), owner=REAL))
    with pytest.raises(Win32Error, match="0x8032000a"):  # FWP_E_IN_USE: the 3129 filters remain
        win32wfp.remove(_plan())


@pytest.mark.parametrize("fail_at", [1, 5, 12])
def test_descriptors_are_freed_when_an_add_fails(bfe: Engine, fail_at: int) -> None:
    """M8: every descriptor made for a filter is freed, also when FwpmFilterAdd0 fails."""
    bfe.fail_add = fail_at
    with pytest.raises(Win32Error):
        win32wfp.install(_plan())
    assert bfe.live_sds == {}
    assert "FwpmTransactionAbort0" in bfe.calls
    bfe.fail_add = None
    win32wfp.install(_plan())
    assert bfe.live_sds == {} and len(bfe.filters) == len(_plan().filters)


def test_dynamic_permits_vanish_with_their_session(bfe: Engine) -> None:
    """open_dynamic's fail-closed claim: closing the session (or the process dying) removes the permits."""
    win32wfp.install(_plan())
    h = win32wfp.open_dynamic(_plan(), wfp.transparent_permits(SANDBOX))
    dyn = [f for f in bfe.filters.values() if f.session == h]
    assert len(dyn) == 2 and all(f.flags & 1 == 0 for f in dyn)  # not persistent
    win32wfp.close_dynamic(h)
    assert not [f for f in bfe.filters.values() if f.session == h]
    assert len(bfe.filters) == len(_plan().filters)  # the persistent block is still there
    with pytest.raises(wfp.WfpPlanError):
        win32wfp.open_dynamic(_plan(), _plan().filters[:1])


def test_the_real_winapis_transparent_permits_are_the_dynamic_session(bfe: Engine) -> None:
    """Issue 29 item 4: open_dynamic is the fail-closed guarantee only if the product reaches it. The
    run's permits go transparent.py -> WinApi.wfp_open_dynamic (test_windows_e2e_fake checks that
    order); here the real WinApi's method must open BFE's dynamic session, never persistent filters."""
    win32wfp.install(_plan())
    api = RealWinApi()
    h = api.wfp_open_dynamic(_plan(), wfp.transparent_permits(SANDBOX))
    dyn = [f for f in bfe.filters.values() if f.session == h]
    assert len(dyn) == 2 and all(f.flags & 1 == 0 for f in dyn)  # FWPM_FILTER_FLAG_PERSISTENT unset
    api.wfp_close_dynamic(h)
    assert len(bfe.filters) == len(_plan().filters)  # the permits gone, the persistent block kept


def test_filters_of_an_older_setup_without_the_grant_count_as_not_installed(bfe: Engine) -> None:
    """Elevated, setup can read any filter; it must still see that the real user cannot, else it
    says "present" while every unelevated run is refused (W2's loop)."""
    win32wfp.install(wfp.plan_filters(SANDBOX, (3128,), owner=None))  # as before the fix: no SD
    assert not win32wfp.installed(_plan())
    assert all(bfe.filters[str(f.key)].sddl is None for f in _plan().filters if str(f.key) in bfe.filters)
    win32wfp.remove(_plan())
    win32wfp.install(_plan())
    assert win32wfp.installed(_plan())  # elevated: every grant read back (as LORC tokens)
    only_grantless = _plan()
    bfe.filters[str(only_grantless.filters[0].key)].sddl = "O:BAD:(A;;GA;;;BA)"
    assert not win32wfp.installed(only_grantless)


def test_grants_read_reads_hex_and_tokens() -> None:
    assert wfp.grants_read(f"D:(A;;0x20080;;;{REAL})", REAL)
    assert wfp.grants_read(f"D:(A;;LORC;;;{REAL})", REAL)
    assert wfp.grants_read(f"D:(A;;GA;;;{REAL})", REAL)
    assert not wfp.grants_read(f"D:(A;;RC;;;{REAL})", REAL)
    assert not wfp.grants_read(f"D:(D;;LO;;;{REAL})", REAL)
    assert not wfp.grants_read(f"D:(A;;LO;;;{SANDBOX})", REAL)


ADMIN_500 = "S-1-5-21-1111111111-2222222222-3333333333-500"


def test_a_real_user_that_is_the_builtin_administrator_reads_its_grant_back_as_la(bfe: Engine) -> None:
    """S1 (session 38): the conversion writes the machine's RID-500 account as `LA`; compared as text,
    the grant was never found, so every run was refused "filters missing" and every setup reinstalled."""
    bfe.caller = ADMIN_500
    plan = wfp.plan_filters(SANDBOX, (3128,), owner=ADMIN_500)
    win32wfp.install(plan)
    bfe.elevated = False
    assert win32wfp.installed(plan)
    n = len(bfe.calls)
    bfe.elevated = True
    assert win32wfp.installed(plan)  # setup's check: present, nothing re-installed
    assert "FwpmFilterAdd0" not in bfe.calls[n:]


def test_grants_read_resolves_only_the_local_account_aliases() -> None:
    assert wfp.grants_read("D:(A;;LORC;;;LA)", ADMIN_500)
    assert wfp.grants_read("D:(A;;LORC;;;LG)", ADMIN_500[:-3] + "501")
    assert not wfp.grants_read("D:(A;;LORC;;;LA)", REAL)  # LA is RID 500, not any user
    assert not wfp.grants_read("D:(A;;LORC;;;BA)", ADMIN_500)  # a group alias is not the user


def test_an_entra_id_user_reads_the_filters_its_setup_installed(bfe: Engine) -> None:
    entra = "S-1-12-1-1111111111-2222222222-3333333333-4444444444"
    bfe.caller = entra
    plan = wfp.plan_filters(SANDBOX, (3128,), owner=entra)
    win32wfp.install(plan)
    bfe.elevated = False
    assert win32wfp.installed(plan)


def test_the_fake_refuses_a_condition_the_layer_does_not_offer(bfe: Engine) -> None:
    """The fake enforces the per-layer condition lists (filtering-conditions-available-at-each-
    filtering-layer): ALE_AUTH_LISTEN has no IP_PROTOCOL, ALE_RESOURCE_ASSIGNMENT no remote port.
    Every filter of the real plan passes (the install tests above)."""
    listen = wfp.WfpFilter(
        wfp.derived_key("x"), "x", "ALE_AUTH_LISTEN_V4", "block", 0, (wfp.Condition("protocol", wfp.IPPROTO_TCP),)
    )
    assign = wfp.WfpFilter(
        wfp.derived_key("y"), "y", "ALE_RESOURCE_ASSIGNMENT_V6", "block", 0, (wfp.Condition("remote_port", 53),)
    )
    engine = win32wfp.open_engine(dynamic=False)
    for bad in (listen, assign):
        with pytest.raises(Win32Error, match="FwpmFilterAdd0"):
            win32wfp.add_filter(engine, wfpwire.wire(bad), _plan().provider_key, _plan().sublayer_key)
    assert not bfe.filters and not bfe.live_sds  # refused, and nothing leaked
