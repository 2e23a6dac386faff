"""The whole Windows path, end to end against the fake, with sys.platform = "win32" (issue 28,
acceptance): `sandgate setup`, `run`, `verify`, `cleanup`, `setup --remove`, each through
launcher.cli as a user would type it, on one fake machine that ends as it began.

The fake enforces the documented contracts (tests/support/winkernel.py), so this is the first
place a slip in any step shows. Fake evidence only: Windows itself has not run this.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from mitmproxy.platform import windows as mitm_windows  # imported off win32: it imports pydivert

from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run.windows import runner
from selftest.windows import probebody
from sgbase.windows import state
from tests.support import winprobefakes
from tests.support.winfake import APPDATA, REAL_SID, TOOL, FakeWinApi


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    fake = FakeWinApi()  # a machine that has never seen sandgate
    fake.program = winprobefakes.program
    fake.m.files[fake.python()] = b"MZ"  # the interpreter verify's probes run with
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(runner, "make_api", lambda: fake)
    return fake


def test_setup_run_verify_cleanup_remove_leave_the_machine_as_it_was(
    machine: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    before = machine.snapshot()
    assert cli.main(["setup"]) == 0
    assert machine.m.users and machine.m.filters and machine.m.rules
    assert cli.main(["run", "--allow", "example.test", "--", "tool", "--flag"]) == 0
    launched, desk = next(iter(machine.launches.values()))
    assert launched.application == TOOL and desk.startswith("sandgate-") and machine.stdout == [b"fake output\n"]
    capsys.readouterr()
    names = winprobefakes.simulated()  # every body with a fake simulation (winprobefakes.py)
    assert cli.main(["verify", "--only", ",".join(names)]) == 0
    out = capsys.readouterr().out
    assert "ok    private_desktop" in out and f"{len(names)} passed, 0 failed" in out
    assert cli.main(["cleanup"]) == 0
    assert cli.main(["setup", "--remove"]) == 0
    after = machine.snapshot()
    assert not machine.violations
    assert (after.users, after.filters, after.rules, after.desktops) == ({}, set(), {}, {})
    own = state.root(APPDATA)  # sandgate's own folder (audit logs, journals) stays, empty of journals
    assert {p: d for p, d in after.dacls.items() if not p.startswith(own)} == before.dacls
    assert {d for d in after.dirs - before.dirs if not d.startswith(own)} == set()
    assert not [p for p in after.files if "sandgate-verify" in p or p.endswith(probebody.RESULT)]


def test_verify_fails_when_cmd_lands_on_the_users_desktop(
    machine: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsguard.windows import desktop

    assert cli.main(["setup"]) == 0
    monkeypatch.setattr(desktop.DesktopPlan, "lp_desktop", property(lambda self: ""))  # the old NULL lpDesktop
    capsys.readouterr()
    assert cli.main(["verify", "--only", "private_desktop"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  private_desktop" in out and "interactive window station" in out


def test_verify_fails_a_probe_that_did_not_run(machine: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["setup"]) == 0
    machine.program = lambda api, launch, desk: 1  # writes nothing
    capsys.readouterr()
    assert cli.main(["verify", "--only", "private_desktop"]) == 1 and "did not run" in capsys.readouterr().out


def test_verify_without_setup_is_one_error_line(machine: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["verify"])
    err = capsys.readouterr().err
    assert e.value.code != 0 and "sandgate: error:" in err and "sandgate setup" in err and "Traceback" not in err


def test_verify_json_and_an_unknown_only_name(machine: FakeWinApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["setup"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--json", "--only", "private_desktop"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["name"] == "private_desktop" and doc["rows"][0]["ok"] is True and doc["missing"] > 0
    with pytest.raises(SystemExit):
        cli.main(["verify", "--only", "no_such_probe"])
    assert "sandgate: error: --only no_such_probe" in capsys.readouterr().err


def test_setup_and_run_transparent_capture_into_the_proxy_and_leave_nothing(
    machine: FakeWinApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28 item 2: `setup --transparent` then `run --transparent`: pydivert's handles (the fake
    WinDivert) reflect CMD's direct connect into the proxy, the proxy child's own mitmproxy Resolver
    learns the original destination from the loop, another process's connect passes unchanged;
    after the run the dynamic permits are gone and CMD's user is refused again."""
    from launcher.run.windows import transparent
    from netguard.windows import firewall

    before = machine.snapshot()
    assert cli.main(["setup", "--transparent"]) == 0
    allow = firewall.transparent_allow(REAL_SID, machine.python(), 3129)
    assert machine.m.rules[allow.name].action == "allow"
    other, seen = 5555, dict[str, object]()  # another process of the real user, outside the job
    machine.alive.add(other)

    def program(api: FakeWinApi, launch: Launch, desk: str) -> int:
        (pid,) = [p for p, (run, _) in api.launches.items() if run is launch]
        seen["cmd"] = api.tcp_connect(pid, "198.18.0.7", 443, 50000)  # ignores HTTPS_PROXY: captured
        seen["other"] = api.tcp_connect(other, "198.18.0.8", 443, 50001)
        monkeypatch.setattr(mitm_windows, "REDIRECT_API_PORT", api.resolvers[-1].addr[1])  # 8085 on Windows
        resolver: Any = mitm_windows.Resolver()  # type: ignore[no-untyped-call]  # what the proxy child asks
        peer: Any = SimpleNamespace(getpeername=lambda: ("198.18.0.7", 50000))
        seen["original"] = resolver.original_addr(peer)
        resolver.sock.close()
        seen["permits"] = len(api.dynamic)
        return 0

    machine.program = program
    assert cli.main(["run", "--transparent", "--allow", "example.test", "--", "tool"]) == 0
    assert "error" not in capsys.readouterr().err  # a normal stop is no failure of the loop
    assert seen == {"cmd": "proxy", "other": "direct", "original": ("198.18.0.7", 443), "permits": 1}
    names = machine.names()
    (proxy_argv,) = [args[0] for name, args in machine.calls if name == "start_proxy"]
    assert proxy_argv[-2:] == ("--transparent", transparent.LISTEN)  # type: ignore[index]
    assert cli.build_parser().parse_args(list(proxy_argv[4:])).transparent == "0.0.0.0:3129"  # type: ignore[index]
    order = ["serve_resolver", "start_proxy", "create_job", "divert_open", "wfp_open_dynamic", "start_suspended"]
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
    assert names.index("wfp_close_dynamic") < names.index("close_job") < names.index("stop_proxy")
    assert machine.dynamic == {} and all(h.closed for h in machine.divert_handles)
    assert all(r._sock.fileno() == -1 for r in machine.resolvers)
    (pid,) = machine.launches
    assert machine.tcp_connect(pid, "198.18.0.7", 443, 50002) == "refused"  # the persistent block again
    assert cli.main(["cleanup"]) == 0
    assert cli.main(["setup", "--remove"]) == 0
    after = machine.snapshot()
    assert not machine.violations
    assert (after.users, after.filters, after.rules) == ({}, set(), {})
    assert {p: d for p, d in after.dacls.items() if not p.startswith(state.root(APPDATA))} == before.dacls
