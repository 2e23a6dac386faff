"""`sandgate setup` for real users that are not a plain local account (session 38, win-setup):
an Entra ID (AzureAD\\) user, whose SID is S-1-12-1-..., through the fake WinApi. The unelevated
read of the filters by such a user is test_windows_bfe.py's (the fake BFE's access check)."""

from __future__ import annotations

from launcher.run.windows import setup
from netguard.windows import firewall, wfp
from sgbase.windows import state
from tests.support import winfake
from tests.support.winfake import APPDATA, FakeWinApi

ENTRA = "S-1-12-1-1111111111-2222222222-3333333333-4444444444"


class EntraWinApi(FakeWinApi):
    """The fake machine, its real user signed in with an Entra ID account."""

    def __init__(self) -> None:
        super().__init__()
        self.session_sid = ENTRA

    def current_user_sid(self) -> str:
        self._hit("current_user_sid")
        return ENTRA


def test_setup_for_an_entra_id_user_grants_it_the_filters_and_binds_everything_to_it() -> None:
    api = EntraWinApi()
    said: list[str] = []
    setup.setup(api, said.append, transparent=True)
    name = state.sandbox_user_name(ENTRA)
    sid = winfake.sandbox_sid(api)
    assert state.decode(api.m.files[state.setup_record(APPDATA)]) == state.SetupRecord(name, sid, 3128)
    plan = wfp.plan_filters(sid, (3128,), owner=ENTRA)
    assert api.m.filters == {str(f.key) for f in plan.filters}
    assert set(api.m.filter_readers.values()) == {ENTRA}  # the read grant names the token's user
    assert firewall.transparent_allow(ENTRA, api.python(), setup.TRANSPARENT_PORT).name in api.m.rules
    ready = setup.check(api)  # elevated (a --transparent run): the check reads the plan back
    assert ready.record.sid == sid
    setup.remove(api, lambda _line: None)
    assert api.m.filters == set() and api.m.rules == {} and api.m.users == {}
