"""r3-c3 (r2-ci C3) through the fake WinApi and the NTFS model: `sandgate setup` denies the sandbox
user sandgate's own code folders (under a drive root with Windows' default DACL), `--remove` takes
exactly those ACEs out, each run checks them, and a run whose workspace is sandgate's code is refused."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from fsguard.windows import sddl
from launcher import cli
from launcher.run.windows import setup
from sgbase.windows import state
from sgbase.windows.api import WinApiError
from tests.support import ntfsmodel, winfake
from tests.support.winfake import APPDATA, HOME, WS, FakeWinApi

#: `icacls C:\` on a stock Windows (DISA STIG V-63373's default list): Administrators and SYSTEM full,
#: Users read & execute, Authenticated Users Modify inherit-only (OI)(CI)(IO)(M) and add-subdirectory (AD).
ROOT_DACL = "D:PAI(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)(A;OICI;0x1200a9;;;BU)(A;OICIIO;SDGRGWGX;;;AU)(A;;LC;;;AU)"
PY = r"C:\hostedtoolcache\windows\Python\3.12.8\x64"
SITE = PY + r"\Lib\site-packages"
CHECKOUT = r"D:\a\sandgate\sandgate"
DIRS = (
    "C:\\",
    r"C:\hostedtoolcache",
    r"C:\hostedtoolcache\windows",
    r"C:\hostedtoolcache\windows\Python",
    r"C:\hostedtoolcache\windows\Python\3.12.8",
    PY,
    PY + r"\Lib",
    SITE,
    PY + r"\Scripts",
    "D:\\",
    r"D:\a",
    r"D:\a\sandgate",
    CHECKOUT,
    CHECKOUT + r"\launcher",
)
CODE = (PY, PY + r"\Lib", SITE, PY + r"\Scripts", CHECKOUT, HOME + r"\AppData\Roaming\Python\Python312\site-packages")


def _machine(code: tuple[str, ...] = CODE) -> FakeWinApi:
    api = FakeWinApi()
    for d in DIRS:
        api.m.dirs.add(d)
        api.m.dacls[d] = ROOT_DACL if d.endswith(":\\") else "D:AI"  # made by installers: inheriting the root's
    api.code = code
    return api


def _attacks(m: winfake.Machine, sid: str) -> dict[str, bool]:
    """What the sandbox user (token: its SID, Everyone, Authenticated Users, Users) manages to do."""
    fs, done = ntfsmodel.Ntfs(m, sid), dict[str, bool]()
    tries: dict[str, Callable[[], None]] = {
        "site .pth": lambda: fs.write(SITE + r"\sandgate-evil.pth", b"import os"),
        "sitecustomize": lambda: fs.write(PY + r"\Lib\sitecustomize.py", b"x"),
        "checkout module": lambda: fs.write(CHECKOUT + r"\launcher\evil.py", b"x"),
        "Scripts": lambda: fs.write(PY + r"\Scripts\sandgate.exe.local", b"x"),
        "rename the version folder": lambda: fs.rename(
            r"C:\hostedtoolcache\windows\Python\3.12.8", r"C:\hostedtoolcache\windows\Python\old"
        ),
        "rename the checkout's parent": lambda: fs.rename(r"D:\a\sandgate", r"D:\a\moved"),
    }
    for what, attack in tries.items():
        try:
            attack()
            done[what] = True
        except ntfsmodel.Denied:
            done[what] = False
    return done


def test_after_setup_the_sandbox_user_plants_nothing_where_sandgate_loads_code() -> None:
    api = _machine()
    probe_sid = "S-1-5-21-9-9-9-1001"  # any authenticated user, before setup: the hole
    assert all(_attacks(copy.deepcopy(api.m), probe_sid).values())
    setup.setup(api, lambda _: None)
    sid = winfake.sandbox_sid(api)
    assert not any(_attacks(copy.deepcopy(api.m), sid).values())
    assert all(_attacks(copy.deepcopy(api.m), probe_sid).values())  # another user: untouched (sandbox SID only)
    # what remains (docs/windows.md): anything else made under the drive root by an installer
    api.m.dirs.add(r"C:\tools")
    api.m.dacls[r"C:\tools"] = "D:AI"
    ntfsmodel.Ntfs(api.m, sid).write(r"C:\tools\planted.cmd", b"x")


def test_the_record_comes_before_any_ace_and_a_second_setup_changes_nothing() -> None:
    api, said = _machine(), list[str]()
    setup.setup(api, said.append)
    names = api.names()
    record_at = next(i for i, (n, a) in enumerate(api.calls) if n == "write_file" and "json" in str(a[0]))
    first_ace = next(i for i, (n, a) in enumerate(api.calls) if n.startswith("set_dacl"))
    # 5 code folders (their inherited deny walks the tree once), 6 ancestors' guards (that folder only: no walk,
    # r4-setup R3: a guard on C:\hostedtoolcache walked the whole tool cache)
    assert record_at < first_ace and names.count("set_dacl") == 5 and names.count("set_dacl_here") == 6
    record = state.decode(api.m.files[state.setup_record(APPDATA)])
    assert (SITE, "code") in record.protected and (r"D:\a", "guard") in record.protected
    assert not any(p.startswith(HOME) for p, _ in record.protected)
    assert any("your profile" in line for line in said)  # the skipped folder is said, not hidden
    before, n = api.snapshot(), len(api.calls)
    said.clear()
    setup.setup(api, said.append)
    assert api.snapshot() == before and not any(x.startswith("set_dacl") for x in api.names()[n:])
    assert "0 added, 11 present" in " ".join(said)


def test_remove_takes_out_exactly_those_aces() -> None:
    api = _machine()
    originals = {d: api.m.dacls[d] for d in DIRS}
    setup.setup(api, lambda _: None)
    sid = winfake.sandbox_sid(api)
    mine = f"(A;OICI;0x1200a9;;;{sid})"  # someone's own ACE for the same SID, and another trustee's
    api.m.dacls[SITE] = sddl.with_ace(sddl.with_ace(api.m.dacls[SITE], mine), "(A;;FA;;;S-1-5-21-1-2-3-500)")
    setup.remove(api, lambda _: None)
    for d in DIRS:
        if d != SITE:
            assert sddl.same_dacl(api.m.dacls[d], originals[d]), d
    assert sddl.same_dacl(api.m.dacls[SITE], sddl.with_ace(sddl.with_ace("D:AI", mine), "(A;;FA;;;S-1-5-21-1-2-3-500)"))


def test_a_second_setup_from_another_interpreter_keeps_the_first_ones_denies() -> None:
    api = _machine((SITE,))
    setup.setup(api, lambda _: None)
    api.code = (CHECKOUT,)
    setup.setup(api, lambda _: None)
    protected = state.decode(api.m.files[state.setup_record(APPDATA)]).protected
    assert (SITE, "code") in protected and (CHECKOUT, "code") in protected
    setup.remove(api, lambda _: None)
    assert all(sddl.same_dacl(api.m.dacls[d], "D:AI") for d in DIRS if not d.endswith(":\\"))


def _refused(api: FakeWinApi, what: str) -> None:
    with pytest.raises(setup.NotSetUp) as e:
        setup.check(api)
    text = str(e.value)
    assert what in text and "\n" not in text and text.endswith("run 'sandgate setup' as administrator again")


def test_each_run_checks_the_denies_with_one_read_per_folder() -> None:
    api = _machine()
    winfake.set_up(api)
    ready = setup.check(api)
    assert len([1 for n, _ in api.calls if n == "dacl"]) == 11  # no walk
    assert CHECKOUT in ready.code and HOME + r"\AppData\Roaming\Python\Python312\site-packages" in ready.code
    sid = winfake.sandbox_sid(api)
    api.m.dacls[SITE] = selfprotect_undone(api.m.dacls[SITE], sid)  # an administrator took it out
    _refused(api, f"deny ACE on {SITE} is missing")


def selfprotect_undone(dacl: str, sid: str) -> str:
    from fsguard.windows import selfprotect

    return selfprotect.undone(dacl, selfprotect.Edit(SITE, "code"), sid)


def test_a_run_of_an_interpreter_setup_never_saw_is_refused() -> None:
    api = _machine((SITE,))
    winfake.set_up(api)
    setup.check(api)  # the control: the interpreter setup protected
    api.code = (SITE, r"C:\tools\venv\Lib\site-packages")
    _refused(api, r"own folder C:\tools\venv\Lib\site-packages is not protected")
    api.code = (SITE,)
    r = state.decode(api.m.files[state.setup_record(APPDATA)])
    older = state.SetupRecord(r.name, r.sid, r.port)  # a record of a setup from before the denies
    api.m.files[state.setup_record(APPDATA)] = state.encode(older)
    _refused(api, "is not protected")


def test_a_run_whose_workspace_is_sandgates_checkout_is_refused_before_anything_is_applied(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = winfake.installed(monkeypatch)
    api.code = (WS,)  # `pip install -e .` of the repository the run works in (the CI workflow's smoke steps)
    api.m.dirs.add(r"C:\src")
    api.m.dacls[r"C:\src"] = "D:AI"
    winfake.set_up(api)
    before = api.snapshot()
    with pytest.raises(SystemExit):
        cli.main(["run", "--", "tool.exe"])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the "no policy given" note
    assert err.startswith("sandgate: error: ") and "\n" not in err and "holds sandgate's own code" in err
    assert not {"set_dacl", "create_job", "start_suspended"} & set(api.names())
    assert api.snapshot() == before
    api.code = (r"C:\sgcode",)  # the control: sandgate installed elsewhere, the same run starts
    api.m.dirs.add(r"C:\sgcode")
    api.m.dacls[r"C:\sgcode"] = "D:AI"
    winfake.set_up(api)
    assert cli.main(["run", "--", "tool.exe"]) == 7 and "start_suspended" in api.names()


def test_an_unreadable_dacl_is_one_line() -> None:
    api = _machine((SITE,))
    winfake.set_up(api)
    api.m.dacls[SITE] = "D:garbage"
    with pytest.raises(WinApiError) as e:
        setup.check(api)
    assert SITE in str(e.value) and "\n" not in str(e.value)


def test_remove_without_the_record_still_takes_this_interpreters_denies_out() -> None:
    api = _machine()
    setup.setup(api, lambda _: None)
    del api.m.files[state.setup_record(APPDATA)]  # lost: remove finds the user by its derived name
    setup.remove(api, lambda _: None)
    assert all(sddl.same_dacl(api.m.dacls[d], "D:AI") for d in DIRS if not d.endswith(":\\"))
