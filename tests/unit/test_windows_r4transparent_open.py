"""r4-transparent T2: a WinDivertOpen failure says what to do, by its documented error code.

https://reqrypt.org/windivert-doc.html#divert_open lists the errors: ERROR_FILE_NOT_FOUND (2) "The driver files
WinDivert32.sys or WinDivert64.sys were not found." (on a default Windows 11: Defender quarantines the
WinDivert64.sys pydivert bundles, e.g. github.com/BeyondDimension/SteamTools/issues/3113), ERROR_ACCESS_DENIED (5)
"does not have Administrator privileges", ERROR_DRIVER_BLOCKED (1275) "blocked by security software", ...
pydivert raises them as ctypes.WinError(code): an OSError whose `winerror` is the code.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from netguard.windows import divertfilter, win32divert
from tests.support.windivertfake import NETWORK, RECV_ONLY, SNIFF, SOCKET


def _win_error(code: int, text: str) -> OSError:
    err = OSError(code, text)
    setattr(err, "winerror", code)  # what ctypes.WinError sets on Windows (typeshed: win32 only)  # noqa: B010
    return err


class _Refused:
    """pydivert's WinDivert whose open() fails as WinDivertOpen does (raise_on_error -> WinError(code))."""

    code = 0

    def __init__(self, *a: object, **k: object) -> None:
        self.is_open = False

    def open(self) -> None:
        raise _win_error(self.code, "refused")

    def close(self) -> None:
        raise RuntimeError("WinDivert handle is not open.")  # pydivert 3.1.3 windivert.py:223


def _install(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    mod = types.ModuleType("pydivert")
    monkeypatch.setattr(_Refused, "code", code)
    mod.WinDivert = _Refused  # type: ignore[attr-defined]
    mod.Layer = SimpleNamespace(SOCKET=SOCKET, NETWORK=NETWORK)  # type: ignore[attr-defined]
    mod.Flag = SimpleNamespace(SNIFF=SNIFF, RECV_ONLY=RECV_ONLY)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pydivert", mod)
    monkeypatch.setattr(sys, "platform", "win32")


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (2, "antivirus may have quarantined"),
        (5, "elevated (administrator) terminal"),
        (577, "no signature Windows accepts"),
        (654, "incompatible WinDivert driver"),
        (1275, "blocked (security software"),
        (1753, "Base Filtering Engine"),
    ],
)
def test_each_documented_open_error_says_what_to_do(code: int, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, code)
    with pytest.raises(win32divert.DivertError) as got:
        win32divert.open_handles(divertfilter.plan_filters(3129))
    assert says in str(got.value)
    assert "\n" not in str(got.value)  # one line


def test_an_undocumented_failure_keeps_the_general_hint() -> None:
    assert "elevated terminal and WinDivert's driver" in win32divert.open_hint(TypeError("no dll"))
    assert "elevated terminal and WinDivert's driver" in win32divert.open_hint(_win_error(31, "general failure"))
