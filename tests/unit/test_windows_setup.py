"""`sandgate setup [--remove]` through the fake WinApi: order, idempotence, removal of partial
setups, elevation, the sealed password; on Linux the one-line refusal. Not Windows evidence."""

from __future__ import annotations

import pytest

from fsguard.windows import logonrights
from launcher import cli
from launcher.run.windows import runner, setup
from netguard.windows import firewall, wfp
from sgbase.windows import state
from sgbase.windows.api import WinApiError
from tests.support import winfake
from tests.support.winfake import APPDATA, REAL_SID, FakeWinApi

MUTATING = {"create_user", "set_password", "delete_user", "write_file", "wfp_install", "wfp_remove", "firewall_add"}


def _setup(api: FakeWinApi) -> list[str]:
    said: list[str] = []
    setup.setup(api, said.append)
    return said


def test_setup_makes_the_user_seals_its_password_then_filters_then_rules() -> None:
    api = FakeWinApi()
    _setup(api)
    name = state.sandbox_user_name(winfake.REAL_SID)
    sid, password = api.m.users[name]
    assert len(name) <= 20 and len(password) >= 32
    sealed = api.m.files[state.sealed_password(APPDATA)]
    assert password.encode() not in sealed and api.unprotect(sealed) == password.encode()  # DPAPI, never plain
    assert state.decode(api.m.files[state.setup_record(APPDATA)]) == state.SetupRecord(name, sid, 3128)
    assert api.m.filters == {str(f.key) for f in wfp.plan_filters(sid, (3128,), owner=REAL_SID).filters}
    names = api.names()
    assert names.index("create_user") < names.index("wfp_install") < names.index("firewall_add")
    added = [args[0] for n, args in api.calls if n == "firewall_add"]
    assert added == [r.name for r in firewall.plan_rules(sid, (3128,))]  # in the plan's order
    record_write = [i for i, (n, a) in enumerate(api.calls) if n == "write_file" and "json" in str(a[0])]
    assert record_write and record_write[0] < names.index("wfp_install")  # removable after a crash


def test_a_second_setup_changes_nothing() -> None:
    api = FakeWinApi()
    _setup(api)
    before, n = api.snapshot(), len(api.calls)
    said = _setup(api)
    assert api.snapshot() == before and not MUTATING & {c for c, _ in api.calls[n:]}
    assert all("present" in line for line in said)


def test_setup_repairs_what_is_missing() -> None:
    api = FakeWinApi()
    _setup(api)
    sid = winfake.sandbox_sid(api)
    api.m.filters.pop()  # a half-installed set: removed, then installed whole
    del api.m.files[state.sealed_password(APPDATA)]  # the sealed copy lost: the password is renewed
    old_password = next(iter(api.m.users.values()))[1]
    n = len(api.calls)
    _setup(api)
    assert api.m.filters == {str(f.key) for f in wfp.plan_filters(sid, (3128,), owner=REAL_SID).filters}
    assert winfake.sandbox_sid(api) == sid and next(iter(api.m.users.values()))[1] != old_password
    assert "set_password" in api.names()[n:] and "create_user" not in api.names()[n:]


def test_remove_takes_everything_out_in_reverse_and_tolerates_missing_pieces() -> None:
    api = FakeWinApi()
    clean = api.snapshot()
    _setup(api)
    sid = winfake.sandbox_sid(api)
    n = len(api.calls)
    setup.remove(api, lambda _: None)
    removed = [args[0] for c, args in api.calls[n:] if c == "firewall_remove"]
    assert removed == [r.name for r in reversed(firewall.plan_rules(sid, (3128,)))]
    names = api.names()[n:]
    assert names.index("wfp_remove") < names.index("delete_user")
    after = api.snapshot()
    assert after.users == {} and after.filters == set() and after.rules == {}
    assert state.sealed_password(APPDATA) not in after.files and state.setup_record(APPDATA) not in after.files
    kept = {p for p in after.dacls if p.startswith(state.root(APPDATA))}  # the audit logs' folders stay
    assert {p: d for p, d in after.dacls.items() if p not in kept} == clean.dacls
    said: list[str] = []
    setup.remove(api, said.append)  # a second removal: nothing there, no error
    assert said == ["nothing to remove: no sandbox user and no setup record"]


def test_remove_finds_the_filters_of_a_user_deleted_by_hand() -> None:
    api = FakeWinApi()
    _setup(api)
    api.m.users.clear()  # someone deleted the account; its filters and rules are still there
    setup.remove(api, lambda _: None)
    assert api.m.filters == set() and api.m.rules == {}


@pytest.mark.parametrize("body", [setup.setup, setup.remove])
def test_setup_needs_an_administrator(body: object) -> None:
    api = FakeWinApi(admin=False)
    before = api.snapshot()
    with pytest.raises(WinApiError, match="elevated \\(administrator\\) terminal"):
        body(api, lambda _: None)  # type: ignore[operator]
    assert api.snapshot() == before


def test_setup_command_on_windows_and_its_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeWinApi(admin=False)
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: api)
    with pytest.raises(SystemExit) as e:
        cli.main(["setup"])
    err = capsys.readouterr().err
    assert e.value.code == 125 and err.count("\n") == 1 and err.startswith("sandgate: error: sandgate setup")
    api.admin = True
    assert cli.main(["setup"]) == 0 and api.m.users
    assert cli.main(["setup", "--remove"]) == 0 and not api.m.users


def test_setup_on_linux_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linux's branch, chosen explicitly: the workflow runs this module on Windows, where sys.platform is
    # "win32" and an unpatched `sandgate setup` would set up the runner for real (issue 28, r2-ci C10).
    monkeypatch.setattr("sys.platform", "linux")
    assert cli.main(["setup"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "sandgate: error: 'sandgate setup' is for Windows only; Linux needs no setup (run 'sandgate run' directly)\n"
    )


def test_passwords_are_random() -> None:
    a, b = FakeWinApi(), FakeWinApi()
    _setup(a)
    _setup(b)
    assert winfake.sandbox_sid(a) == winfake.sandbox_sid(b)  # the fake's numbering
    assert next(iter(a.m.users.values()))[1] != next(iter(b.m.users.values()))[1]


def test_state_names_and_records() -> None:
    assert state.journal_pid("123-abc.jsonl") == 123
    assert state.journal_pid("notes.txt") is None and state.journal_pid("x-1.jsonl") is None
    assert state.sandbox_user_name(winfake.REAL_SID) == state.sandbox_user_name(winfake.REAL_SID)
    assert state.sandbox_user_name("S-1-5-21-1") != state.sandbox_user_name("S-1-5-21-2")
    for bad in (b"{", b'{"name": 1, "sid": "s", "port": 3128}', b"[]"):
        with pytest.raises(state.StateError):
            state.decode(bad)


def test_firewall_commands_quote_every_value() -> None:
    sid = "S-1-5-21-1-2-3-1001"
    offhost, loop, _udp, inbound = firewall.plan_rules(sid, (3128,))
    cmd = firewall.ps_add(loop)
    assert cmd.startswith("New-NetFirewallRule -Name 'sandgate-S-1-5-21-1-2-3-1001-out-loopback'")
    assert "-Direction Outbound -Action Block -Protocol TCP -Profile Any" in cmd
    assert f"-LocalUser 'O:LSD:(A;;CC;;;{sid})'" in cmd and "-RemotePort '1-3127','3129-65535'" in cmd
    assert "-RemotePort" not in firewall.ps_add(offhost) and "-RemoteAddress" not in firewall.ps_add(inbound)
    evil = firewall.FirewallRule("x'; Remove-Item C:\\ -Recurse; '", "out", "any", ("*",), ("*",), "O:LS")
    assert "-Name 'x''; Remove-Item C:\\ -Recurse; '''" in firewall.ps_add(evil)  # one literal, nothing run
    assert (
        firewall.ps_has("a'b") == "if (Get-NetFirewallRule -Name 'a''b' -ErrorAction SilentlyContinue) { 1 } else { 0 }"
    )


def test_an_unelevated_run_passes_the_setup_check() -> None:
    """W2: runs are not elevated; the filters setup installed must be readable by the real user
    (the fake refuses FwpmFilterGetByKey0 without FWPM_ACTRL_READ, as BFE does)."""
    api = FakeWinApi()
    winfake.set_up(api)
    api.admin = False
    ready = setup.check(api)
    assert ready.record.sid == winfake.sandbox_sid(api)
    api.m.filter_readers = dict.fromkeys(api.m.filter_readers)  # a setup that granted nothing
    with pytest.raises(setup.NotSetUp, match=r"FWPM_ACTRL_READ.*run 'sandgate setup' as administrator again"):
        setup.check(api)


def test_a_failed_filter_removal_keeps_the_record_and_can_be_retried() -> None:
    """M7: removal that fails says so and keeps what is needed to finish it later."""
    api = FakeWinApi()
    winfake.set_up(api)
    api.fail = ("wfp_remove", 1)
    with pytest.raises(WinApiError):
        setup.remove(api, lambda _: None)
    assert api.m.filters and api.read_file(state.setup_record(APPDATA)) is not None
    api.fail = None
    setup.remove(api, lambda _: None)
    assert not api.m.filters and not api.m.users
    setup.setup(api, lambda _: None)  # and a new setup installs cleanly (no FWP_E_ALREADY_EXISTS)
    assert len(api.m.filters) == winfake.filter_count(winfake.sandbox_sid(api))


def test_remove_takes_the_sandbox_users_profile_too() -> None:
    """M10: NetUserDel leaves C:\\Users\\<name> and its hive; DeleteProfileW (elevated) removes them."""
    api = FakeWinApi()
    winfake.set_up(api)  # the profile exists, made at the sandbox user's first logon
    sid = winfake.sandbox_sid(api)
    assert sid in api.m.profiles
    setup.remove(api, lambda _: None)
    assert api.m.profiles == set() and not api.m.users
    names = api.names()
    assert names.index("delete_profile") < names.index("delete_user")  # by SID, while it still resolves
    setup.remove(api, lambda _: None)  # nothing left: nothing fails


def test_transparent_setup_adds_the_one_inbound_allow_and_remove_takes_it_out() -> None:
    api = FakeWinApi()
    setup.setup(api, lambda _: None)
    assert all(r.action == "block" for r in api.m.rules.values())  # not without transparent mode
    setup.setup(api, lambda _: None, transparent=True)
    (allow,) = [r for r in api.m.rules.values() if r.action == "allow"]
    assert (allow.direction, allow.protocol, allow.local_ports) == ("in", "tcp", ("3129",))
    assert allow.program == api.python() and allow.local_user_sddl == f"O:LSD:(A;;CC;;;{REAL_SID})"
    cmd = firewall.ps_add(allow)
    assert "-Action Allow" in cmd and "-LocalPort '3129'" in cmd and f"-Program '{api.python()}'" in cmd
    setup.remove(api, lambda _: None)
    assert api.m.rules == {}


def test_setup_denies_the_logon_rights_that_let_work_outlive_the_run() -> None:
    """H3: S4U / stored-password scheduled tasks start through a batch logon, services through a
    service logon; both are denied, interactive logon (every run's) is not, and remove undoes it."""
    api = FakeWinApi()
    winfake.set_up(api)
    sid = winfake.sandbox_sid(api)
    assert api.m.denied_rights[sid] >= {"SeDenyBatchLogonRight", "SeDenyServiceLogonRight"}
    assert logonrights.REQUIRED_FOR_RUNS not in api.m.denied_rights[sid]
    setup.setup(api, lambda _: None)  # idempotent
    assert api.m.denied_rights[sid] == set(logonrights.DENIED)
    setup.remove(api, lambda _: None)
    assert api.m.denied_rights == {}


def test_denying_interactive_logon_would_refuse_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake keeps CreateProcessWithLogonW's contract (an interactive logon): the right that
    must never be in logonrights.DENIED fails the run, so adding it there fails this test."""
    api = FakeWinApi()
    winfake.set_up(api)
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: api)
    argv = ["run", "--allow", "example.test", "--", "tool.exe"]
    assert cli.main(argv) == 7
    api.m.denied_rights[winfake.sandbox_sid(api)].add(logonrights.REQUIRED_FOR_RUNS)
    with pytest.raises(SystemExit):
        cli.main(argv)


def test_setup_elevated_as_another_account_is_refused() -> None:
    """M13: over-the-shoulder elevation would set sandgate up for the administrator, not for the
    person at this desktop: refused before anything is made; a session without a user is fine."""
    api = FakeWinApi()
    api.session_sid = "S-1-5-21-1111111111-2222222222-3333333333-1500"  # the desktop's owner
    before = api.snapshot()
    with pytest.raises(WinApiError, match="from your own account"):
        setup.setup(api, lambda _: None)
    assert api.snapshot() == before
    api.session_sid = None  # a CI agent's service session
    setup.setup(api, lambda _: None)
    assert api.m.users


def test_setup_over_an_older_setup_grants_the_read_access() -> None:
    """W2's upgrade trap: filters present (setup, elevated, can read them) but without the real
    user's read grant; setup must re-install them, not say "present"."""
    api = FakeWinApi()
    winfake.set_up(api)
    api.m.filter_readers = dict.fromkeys(api.m.filter_readers)  # as an older setup left them
    said: list[str] = []
    setup.setup(api, said.append)
    assert any("WFP filters" in line and "installed" in line for line in said)
    api.admin = False
    setup.check(api)  # the unelevated run passes now
