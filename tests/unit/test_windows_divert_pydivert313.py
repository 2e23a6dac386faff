"""The transparent loop over the pydivert Windows actually gets (issue 28 review, win-divert D2, M-a).

mitmproxy pins pydivert on win32 (12.3.x: `pydivert<=3.1.3`; pyproject.toml follows it), so a
Windows install has pydivert 3.1.3, never the 4.0.1 this venv holds for eBPFDivert. The handle
below has exactly 3.1.3's signatures (pydivert-3.1.3 windivert.py: `__init__(filter, layer,
priority, flags)`, `open()`, `close()` raising RuntimeError when not open, `is_open`,
`recv(bufsize)` blocking with NO timeout, `send(packet, recalculate_checksum)`), so a loop that
calls `recv(timeout=...)` on it fails here as it would on Windows (TypeError on the first call).
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from netguard.windows import divertfilter, divertpump, owners, wfp, win32divert
from tests.support.windivertfake import NETWORK, RECV_ONLY, SNIFF, SOCKET, FakeWinDivert, connect_event, syn

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"
OTHER_SID = "S-1-5-21-1111111111-2222222222-3333333333-1000"
JOB_PID, PORT = 100, 3129


class Pydivert313(FakeWinDivert):
    """pydivert 3.1.3's WinDivert: recv(bufsize) blocks until a packet or an error, no timeout."""

    def recv(self, bufsize: int = 65575) -> Any:  # type: ignore[override]
        return super().recv(bufsize, None)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Pydivert313]:
    handles: list[Pydivert313] = []
    mod = types.ModuleType("pydivert")

    def make(filter: str, layer: int = NETWORK, priority: int = 0, flags: int = 0) -> Pydivert313:
        handles.append(Pydivert313(filter, layer, priority, flags))
        return handles[-1]

    mod.WinDivert = make  # type: ignore[attr-defined]
    mod.Layer = SimpleNamespace(NETWORK=NETWORK, SOCKET=SOCKET)  # type: ignore[attr-defined]
    mod.Flag = SimpleNamespace(SNIFF=SNIFF, RECV_ONLY=RECV_ONLY)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pydivert", mod)
    monkeypatch.setattr(sys, "platform", "win32")
    return handles


class Permits:
    def __init__(self) -> None:
        self.live: set[int] = set()

    def open(self, plan: wfp.WfpPlan, filters: tuple[wfp.WfpFilter, ...]) -> int:
        self.live.add(7)
        return 7

    def close(self, h: int) -> None:
        self.live.discard(h)


def _path(failures: list[str]) -> tuple[win32divert.TransparentPath, Permits]:
    permits = Permits()
    path = win32divert.TransparentPath(
        wfp.plan_filters(SID, (3128,)),
        SID,
        divertfilter.plan_filters(PORT),
        PORT,
        lambda pid: owners.Held(owners.Owner("job" if pid == JOB_PID else "outside", OTHER_SID)),
        permits=win32divert.Permits(permits.open, permits.close),
        on_fail=failures.append,
    )  # the default opener: win32divert.open_handles, as in production
    return path, permits


def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 3
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_loop_reflects_over_pydivert_313_handles_and_stops(made: list[Pydivert313]) -> None:
    failures: list[str] = []
    path, permits = _path(failures)
    path.start()
    ev, net = made  # opened in that order: the SOCKET handle first
    try:
        ev.push(connect_event(JOB_PID, "93.184.216.34", 443, 50000))
        net.push(syn("10.0.0.5", 50000, "93.184.216.34", 443))
        _until(lambda: len(net.sent) == 1 or bool(failures))
        assert failures == []  # before the pump: "unexpected keyword argument 'timeout'"
        (reflected,) = net.sent
        assert (reflected.src_addr, reflected.dst_addr, reflected.dst_port) == ("93.184.216.34", "10.0.0.5", PORT)
    finally:
        path.stop()
    assert permits.live == set() and ev.closed and net.closed and failures == []


def test_a_handle_failing_under_the_reader_ends_the_loop_permits_first(made: list[Pydivert313]) -> None:
    failures: list[str] = []
    path, permits = _path(failures)
    path.start()
    _, net = made
    with net.cv:  # the driver unloaded under the blocked recv: it fails (pydivert raises OSError)
        net.closed = True
        net.cv.notify_all()
    _until(lambda: bool(failures))
    assert permits.live == set() and not path.running  # the persistent block applies again
    assert "redirect loop stopped" in failures[0] and "handle is invalid" in failures[0]
    path.stop()


def test_stop_ends_both_readers(made: list[Pydivert313]) -> None:
    handles = win32divert.open_handles(divertfilter.plan_filters(PORT))
    pumps = [h for h in handles if isinstance(h, divertpump.Pumped)]
    assert len(pumps) == 2 and all(p.reader_alive() for p in pumps)
    for p in pumps:
        p.close()
        p.close()  # idempotent: pydivert's own close() raises on a closed handle
    _until(lambda: not any(p.reader_alive() for p in pumps))
    with pytest.raises(OSError, match="invalid"):
        pumps[0].recv(timeout=0.0)  # the reader's error, not a silent timeout


def test_timeout_is_a_timeout_error(made: list[Pydivert313]) -> None:
    net, ev = win32divert.open_handles(divertfilter.plan_filters(PORT))
    try:
        with pytest.raises(TimeoutError):
            net.recv(timeout=0.0)
        made[0].push("event")
        _until(lambda: made[0].asks >= 2)  # the reader took it and asks again
        assert ev.recv(timeout=1.0) == "event"
    finally:
        net.close()
        ev.close()


@pytest.mark.parametrize("why", ["not installed", "dll", "not elevated"])
def test_every_open_failure_is_one_divert_error(
    why: str, made: list[Pydivert313], monkeypatch: pytest.MonkeyPatch
) -> None:
    """M-a: pydivert's DLL load raises TypeError (ctypes.WinError(str)); closing the never-opened
    SOCKET handle after its open failed raises RuntimeError: neither may escape as a traceback."""
    if why == "not installed":
        monkeypatch.setitem(sys.modules, "pydivert", None)
    elif why == "dll":

        def no_dll(*a: object, **k: object) -> Pydivert313:
            raise TypeError("unsupported operand type(s)")

        monkeypatch.setattr(sys.modules["pydivert"], "WinDivert", no_dll)
    else:

        def denied(self: Pydivert313) -> Pydivert313:
            raise PermissionError(5, "Access is denied")

        monkeypatch.setattr(Pydivert313, "open", denied)
    with pytest.raises(win32divert.DivertError, match="elevated terminal"):
        win32divert.open_handles(divertfilter.plan_filters(PORT))
    assert all(not h.is_open for h in made)
