"""win32wfp through ctypes' own argument conversion (r3-sdk): tests/support/bfefake.py checks WFP's
contract and each call's arity, not what ctypes makes of the arguments. Here every call of install,
installed, open_dynamic, close_dynamic and remove first goes through a ctypes prototype of its table
entry (a wrong type raises ArgumentError; an integer must fit its width), and what each byref pointed
at (FWPM_FILTER0, FWPM_SESSION0, GUID, HANDLE, UINT64 ...) is compiled against the SDK's pointee.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netguard.windows import wfp, win32wfp
from sgbase.windows import win32calls
from tests.support import winsdkcalls
from tests.support.bfefake import Engine

#: mingw-w64's SDK and compiler are the Linux suite's; on Windows the real DLLs are loaded instead
pytestmark = pytest.mark.skipif(os.name == "nt", reason="the SDK check runs where mingw-w64 is (Linux)")

REAL = "S-1-5-21-1111111111-2222222222-3333333333-1000"
SANDBOX = "S-1-5-21-1111111111-2222222222-3333333333-1001"


def _converting(engine: Engine, seen: list[winsdkcalls.Passed]) -> Callable[[str], Callable[..., Any]]:
    def fn(name: str) -> Callable[..., Any]:
        call = win32calls.BY_NAME[name]
        proto = ctypes.CFUNCTYPE(call.restype, *call.argtypes)(lambda *_: None if call.restype is None else 0)
        inner = engine.fn(name)

        def run(*args: Any) -> Any:
            proto(*args)
            for t, v in zip(call.argtypes, args, strict=True):
                if isinstance(v, int) and isinstance(getattr(t, "_type_", None), str) and t._type_ in "bBhHiIqQ":
                    assert winsdkcalls.int_fits(t, v), f"{name}: {v:#x} does not fit {t.__name__}"
            seen.extend(winsdkcalls.passed(name, args))
            return inner(*args)

        return run

    return fn


def test_every_wfp_call_converts_and_points_at_the_sdks_structures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = Engine(caller=REAL, elevated=True)
    seen: list[winsdkcalls.Passed] = []
    monkeypatch.setattr(win32wfp, "fn", _converting(engine, seen))
    plan = wfp.plan_filters(SANDBOX, (3128,), owner=REAL)
    win32wfp.install(plan)
    engine.elevated = False
    assert win32wfp.installed(plan)
    engine.elevated = True
    h = win32wfp.open_dynamic(plan, wfp.transparent_permits(SANDBOX))
    win32wfp.close_dynamic(h)
    win32wfp.remove(plan)
    called = {p.call for p in seen}
    assert {"FwpmEngineOpen0", "FwpmFilterAdd0", "FwpmFilterGetByKey0", "FwpmFilterGetSecurityInfoByKey0"} <= called
    assert {"FwpmProviderAdd0", "FwpmSubLayerAdd0", "FwpmFilterDeleteByKey0"} <= called
    assert winsdkcalls.failures(winsdkcalls.recorded_checks(seen), tmp_path) == []
