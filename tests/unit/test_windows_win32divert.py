"""The wired transparent path (win32divert.py) against a fake WinDivert that keeps WinDivert 2.2's
documented contract (tests/support/windivertfake.py, https://reqrypt.org/windivert-doc.html):
opening needs Administrator; the SOCKET layer reports connect events with the process id and
cannot inject (send fails); recv on a closed handle fails (ERROR_INVALID_HANDLE); a closed
NETWORK handle no longer diverts (fail open, what the dynamic permits must not outlive)."""

from __future__ import annotations

import socket
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
JOB_PID, OTHER_PID = 100, 200
PORT = 3129
_event, _syn = connect_event, syn


class Permits:
    """The dynamic WFP session, as BFE keeps it: open adds the permits, close removes them."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[wfp.WfpFilter, ...]] = {}
        self.log: list[str] = []

    def open(self, plan: wfp.WfpPlan, filters: tuple[wfp.WfpFilter, ...]) -> int:
        self.log.append("permits open")
        self.live[7] = filters
        return 7

    def close(self, h: int) -> None:
        self.log.append("permits close")
        del self.live[h]


def _path(**kw: Any) -> tuple[win32divert.TransparentPath, list[FakeWinDivert], Permits, list[str]]:
    handles: list[FakeWinDivert] = []
    permits, failures = Permits(), list[str]()

    def opener(f: divertfilter.DivertFilters) -> tuple[FakeWinDivert, FakeWinDivert]:
        net = FakeWinDivert(f.network, NETWORK).open()
        ev = FakeWinDivert(f.socket, SOCKET, flags=SNIFF | RECV_ONLY).open()
        handles.extend((net, ev))
        permits.log.append("handles open")
        return net, ev

    path = win32divert.TransparentPath(
        wfp.plan_filters(SID, (3128,)),
        SID,
        divertfilter.plan_filters(PORT),
        PORT,
        lambda pid: owners.Held(owners.Owner("job" if pid == JOB_PID else "outside", OTHER_SID)),
        permits=win32divert.Permits(permits.open, permits.close),
        opener=opener,
        on_fail=failures.append,
        **kw,
    )
    return path, handles, permits, failures


def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 3
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_loop_reflects_the_jobs_flow_and_the_proxy_resolves_it() -> None:
    path, handles, permits, _ = _path()
    path.start()
    net, ev = handles
    try:
        assert permits.log == ["handles open", "permits open"]  # never permits without diversion
        assert {f.layer for f in permits.live[7]} == {"ALE_AUTH_CONNECT_V4", "ALE_AUTH_CONNECT_V6"}
        ev.push(_event(JOB_PID, "93.184.216.34", 443, 50000))
        ev.push(_event(OTHER_PID, "198.18.0.9", 443, 50001))
        net.push(_syn("10.0.0.5", 50000, "93.184.216.34", 443))
        net.push(_syn("10.0.0.5", 50001, "198.18.0.9", 443))
        net.push(_syn("10.0.0.5", 50002, "198.18.0.10", 443))  # nobody's connect: dropped
        _until(lambda: len(net.sent) == 2)
        time.sleep(0.2)
        reflected, passed = net.sent
        assert (reflected.src_addr, reflected.dst_addr, reflected.dst_port) == ("93.184.216.34", "10.0.0.5", PORT)
        assert reflected.direction == 1  # re-injected inbound, into the proxy's transparent listener
        assert (passed.dst_addr, passed.dst_port) == ("198.18.0.9", 443)  # another process: unchanged
        assert len(net.sent) == 2  # the unknown owner's SYN went nowhere
        conn = SimpleNamespace(getpeername=lambda: ("93.184.216.34", 50000))
        assert path.original_addr(conn) == ("93.184.216.34", 443)  # type: ignore[arg-type]
        stranger = SimpleNamespace(getpeername=lambda: ("203.0.113.7", 40000))  # reached the port from outside
        with pytest.raises(win32divert.DivertError):
            path.original_addr(stranger)  # type: ignore[arg-type]
    finally:
        path.stop()
    assert permits.live == {} and net.closed and ev.closed
    assert permits.log[-1] == "permits close"


def test_a_closed_handle_takes_the_permits_with_it() -> None:
    """Fail closed: WinDivert stops diverting when its handle closes; the permits must go first."""
    path, handles, permits, failures = _path()
    path.start()
    net, ev = handles
    net.close()  # the driver unloaded, another tool closed it, a crash in pydivert
    _until(lambda: not path.running)
    assert permits.live == {}  # the persistent hard block applies again
    assert ev.closed
    _until(lambda: bool(failures))
    assert "redirect loop stopped" in failures[0] and "handle is invalid" in failures[0]
    conn = SimpleNamespace(getpeername=lambda: ("93.184.216.34", 50000))
    with pytest.raises(win32divert.DivertError):
        path.original_addr(conn)  # type: ignore[arg-type]
    path.stop()  # idempotent
    assert permits.log.count("permits close") == 1


def test_a_normal_stop_is_no_failure() -> None:
    """stop() closes the handles under the loop's recv (ERROR_INVALID_HANDLE): not a dead loop."""
    path, handles, permits, failures = _path()
    path.start()
    time.sleep(0.1)  # the loop is inside recv
    path.stop()
    assert permits.live == {} and all(h.closed for h in handles)
    assert failures == [] and path.failure is None


def test_permits_that_cannot_be_removed_keep_the_handles_open() -> None:
    """Closing the handles while the permits live would fail open: keep diverting, retry at stop()."""
    path, handles, permits, failures = _path()
    path.start()
    broken = [True]

    def flaky(h: int) -> None:
        if broken[0]:
            raise OSError(1, "FwpmEngineClose0 failed")
        permits.close(h)

    path._permits = win32divert.Permits(permits.open, flaky)
    with pytest.raises(OSError):
        path.stop()
    assert path._thread is not None
    path._thread.join(3)  # the loop's own retry at its exit fails too, and says so
    assert not any(h.closed for h in handles) and permits.live  # still diverted; nothing left unchanged
    assert failures and "its permits" in failures[0]
    broken[0] = False
    path.stop()
    assert permits.live == {} and all(h.closed for h in handles)


def test_permits_that_cannot_be_added_leave_no_handle_open() -> None:
    path, handles, permits, _ = _path()

    def refuse(plan: wfp.WfpPlan, filters: tuple[wfp.WfpFilter, ...]) -> int:
        raise OSError(5, "FwpmFilterAdd0: access denied")

    path._permits = win32divert.Permits(refuse, permits.close)
    with pytest.raises(OSError):
        path.start()
    assert all(h.closed for h in handles) and not path.running


def test_the_socket_handle_only_sniffs() -> None:
    ev = FakeWinDivert(divertfilter.connect_events(), SOCKET, flags=SNIFF | RECV_ONLY).open()
    with pytest.raises(OSError):
        ev.send(object())


@pytest.fixture
def fake_pydivert(monkeypatch: pytest.MonkeyPatch) -> list[FakeWinDivert]:
    made: list[FakeWinDivert] = []
    mod = types.ModuleType("pydivert")

    def make(*a: Any, **k: Any) -> FakeWinDivert:
        made.append(FakeWinDivert(*a, **k))
        return made[-1]

    mod.WinDivert = make  # type: ignore[attr-defined]
    mod.Layer = SimpleNamespace(SOCKET=SOCKET, NETWORK=NETWORK)  # type: ignore[attr-defined]
    mod.Flag = SimpleNamespace(SNIFF=SNIFF, RECV_ONLY=RECV_ONLY)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pydivert", mod)
    return made


def test_pydivert_is_opened_lazily_and_only_on_windows(
    fake_pydivert: list[FakeWinDivert], monkeypatch: pytest.MonkeyPatch
) -> None:
    filters = divertfilter.plan_filters(PORT)
    monkeypatch.setattr(sys, "platform", "linux")  # off Windows, also when the workflow runs this there (r2-ci C11)
    with pytest.raises(win32divert.DivertError, match="only on Windows"):
        win32divert.open_handles(filters)
    assert fake_pydivert == []  # nothing opened off Windows
    monkeypatch.setattr(sys, "platform", "win32")
    net, ev = win32divert.open_handles(filters)
    try:
        assert isinstance(net, divertpump.Pumped) and isinstance(ev, divertpump.Pumped)  # pydivert 3.1.3: no timeout
        assert (ev.inner.layer, ev.inner.flags, ev.inner.filter) == (SOCKET, SNIFF | RECV_ONLY, filters.socket)
        assert (net.inner.layer, net.inner.flags, net.inner.filter) == (NETWORK, 0, filters.network)
        assert all(h.opened for h in fake_pydivert)
    finally:
        net.close()
        ev.close()


def test_not_elevated_is_one_clear_error(fake_pydivert: list[FakeWinDivert], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    original = FakeWinDivert.open

    def denied(self: FakeWinDivert) -> FakeWinDivert:
        self.elevated = False
        return original(self)

    monkeypatch.setattr(FakeWinDivert, "open", denied)
    with pytest.raises(win32divert.DivertError, match="elevated"):
        win32divert.open_handles(divertfilter.plan_filters(PORT))
    assert all(not h.opened or h.closed for h in fake_pydivert)


def test_a_path_not_started_resolves_nothing() -> None:
    path, _, _, _ = _path()
    a, b = socket.socketpair()
    try:
        with pytest.raises(win32divert.DivertError):
            path.original_addr(a)  # not started: nothing resolves
    finally:
        a.close()
        b.close()


def test_the_proxy_childs_own_resolver_gets_the_original_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    """Across processes, as on Windows: mitmproxy's own Resolver (what platform.original_addr is in
    the proxy child there) asks the loop's ResolverServer, on loopback, in mitmproxy's protocol."""
    from mitmproxy.platform import windows as mitm_windows

    path, handles, _, _ = _path()
    path.start()
    server = win32divert.ResolverServer(path, ("127.0.0.1", 0))
    try:
        net, ev = handles
        ev.push(_event(JOB_PID, "93.184.216.34", 443, 50000))
        net.push(_syn("10.0.0.5", 50000, "93.184.216.34", 443))
        _until(lambda: len(net.sent) == 1)
        monkeypatch.setattr(mitm_windows, "REDIRECT_API_PORT", server.addr[1])
        resolver: Any = mitm_windows.Resolver()  # type: ignore[no-untyped-call]  # mitmproxy's, untyped
        peer: Any = SimpleNamespace(getpeername=lambda: ("93.184.216.34", 50000))
        assert resolver.original_addr(peer) == ("93.184.216.34", 443)
        stranger: Any = SimpleNamespace(getpeername=lambda: ("203.0.113.7", 40000))
        with pytest.raises(RuntimeError, match="Cannot resolve"):
            resolver.original_addr(stranger)
        path.stop()  # the loop ended: nothing resolves any more
        with pytest.raises(RuntimeError):
            resolver.original_addr(peer)
        assert resolver.sock is not None
        resolver.sock.close()
    finally:
        path.stop()
        server.close()
