"""r3-new N1: verify's `logon_sid` row must fail when CMD opens WinSta0 itself, not only its Default desktop.

A process whose window station is WinSta0 reaches what the station holds, the clipboard and the global
atom table (WINSTA_ACCESSCLIPBOARD, WINSTA_ACCESSGLOBALATOMS:
https://learn.microsoft.com/en-us/windows/win32/winstation/window-station-security-and-access-rights),
whatever the Default desktop's DACL says; the run denies the station itself (logonreach.DENY_STATION).
"""

from __future__ import annotations

from typing import Any

from selftest.windows import probelogon

OK, DENIED = {"ok": True, "error": 0}, {"ok": False, "error": probelogon.ERROR_ACCESS_DENIED}


def _got(**steps: Any) -> dict[str, Any]:
    base = {"real_pid": 4242, "own_process": OK, "own_desktop": OK, "own_attach": OK, "real_process": DENIED}
    return base | steps


def test_an_opened_station_fails_the_row_though_its_desktop_was_refused() -> None:
    verdict = probelogon.judge(0, _got(winsta0=OK, default=DENIED, default_attach=None))
    assert not verdict.ok and "WinSta0" in verdict.detail and "clipboard" in verdict.detail


def test_the_matching_pass_the_station_refused_for_access_denied() -> None:
    verdict = probelogon.judge(0, _got(winsta0=DENIED, default=None, default_attach=None))
    assert verdict.ok and "refused (access denied)" in verdict.detail


def test_a_station_refused_for_another_reason_proves_nothing() -> None:
    verdict = probelogon.judge(0, _got(winsta0={"ok": False, "error": 2}, default=None))
    assert not verdict.ok and "not with access denied" in verdict.detail
