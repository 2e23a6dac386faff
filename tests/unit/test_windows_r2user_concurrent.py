"""r2-user U4: two runs at once. "One run at a time" held only when the second run had a policy.

A run without a policy started no proxy, so the one loopback port the WFP filters let CMD reach was
free for another run's proxy (its allowlist) or another program; and both runs' ACEs shared the
workspace. Now such a run binds that port itself for its whole life (a bind the fake enforces as
Windows does: one holder per address, WSAEADDRINUSE for the next), so whichever run comes second is
refused before it changes anything. The real binding is also run here, on Linux loopback.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run import windowsbackend
from launcher.run.windows.win32runsession import RealSessionApi
from sgbase.windows.api import Proc, WinApiError
from tests.support import winfake
from tests.support.winfake import FakeWinApi

POLICY: list[str] = ["--allow", "example.test"]
NONE: list[str] = []


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    return winfake.installed(monkeypatch)


def _second_run(api: FakeWinApi, argv: list[str], seen: list[object]) -> Callable[[FakeWinApi, Launch, str], int]:
    """While the first run's command runs, the user starts a second run in another terminal."""

    def first(fake: FakeWinApi, launch: Launch, desk: str) -> int:
        if len(fake.launches) > 1:
            return 0  # the second run's own command (only if it was let start)
        snapshot = fake.snapshot()
        try:
            seen.append(cli.main(["run", *argv, "--", "tool"]))
        except SystemExit as e:
            seen.append(e.code)
        seen.append(fake.snapshot() == snapshot)  # the refused run left the machine as it found it
        return 0

    return first


@pytest.mark.parametrize(
    ("first", "second"), [(POLICY, NONE), (NONE, POLICY), (NONE, NONE)], ids=["p+none", "none+p", "none+none"]
)
def test_the_second_of_two_runs_at_once_is_refused_and_leaves_nothing(
    api: FakeWinApi, first: list[str], second: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[object] = []
    api.program = _second_run(api, second, seen)
    assert cli.main(["run", *first, "--", "tool"]) == 0
    assert seen == [125, True] and len(api.launches) == 1  # refused, nothing changed, its command never started
    err = capsys.readouterr().err
    assert ("port in use by another run" in err or windowsbackend.PORT_TAKEN in err) and "Traceback" not in err
    assert api.bound == {}  # both ports released: a third run may start


def test_the_control_without_the_hold_the_second_run_reaches_the_first_ones_proxy(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "hold_port", lambda port: 0)  # the old backend: nothing bound
    seen: list[object] = []
    api.program = _second_run(api, NONE, seen)
    assert cli.main(["run", *POLICY, "--", "tool"]) == 0
    assert seen[0] == 0 and len(api.launches) == 2  # it ran, beside the first run's proxy on its port


def test_a_run_without_a_policy_holds_the_port_for_its_whole_life(api: FakeWinApi) -> None:
    assert cli.main(["run", "--", "tool"]) == 7
    names = api.names()
    assert names.index("hold_port") < names.index("start_suspended") < names.index("release_port")
    assert "start_proxy" not in names and api.bound == {}


# ---- the real binding, on this machine's loopback ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_real_hold_refuses_a_connect_and_a_second_holder() -> None:
    real, port = RealSessionApi(), _free_port()
    handle = real.hold_port(port)
    try:
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with pytest.raises(WinApiError, match="in use"):
            RealSessionApi().hold_port(port)
        listener = socket.socket()
        with pytest.raises(OSError):  # another program (or a proxy) cannot listen there meanwhile
            listener.bind(("127.0.0.1", port))
        listener.close()
    finally:
        real.release_port(handle)
    again = RealSessionApi()
    again.release_port(again.hold_port(port))  # released: free again


def test_the_real_hold_is_refused_where_something_listens() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with pytest.raises(WinApiError, match="in use"):
            RealSessionApi().hold_port(int(listener.getsockname()[1]))


# ---- Ctrl+C while the proxy is not ready yet (U7) ------------------------------------------------


def test_the_ready_wait_is_sliced_so_ctrl_c_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Windows CPython runs the Ctrl+C handler only between calls, and a lock wait is one call: a
    single 30 s wait would hold Ctrl+C back until the proxy is ready. Sliced, the handler's
    KeyboardInterrupt (simulated on the third slice) ends the wait at once."""
    import subprocess
    import sys
    import threading

    from launcher.run.windows import realapi

    waits: list[float] = []

    class Event(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if timeout is None:  # Thread.start's own wait for the reader thread
                return super().wait()
            waits.append(timeout)
            if len(waits) == 3:
                raise KeyboardInterrupt
            return super().wait(timeout)

    monkeypatch.setattr(threading, "Event", Event)  # the module realapi's wait builds its Event from
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE)
    api = realapi.RealWinApi()
    api._children[child.pid] = child
    try:
        with pytest.raises(KeyboardInterrupt):
            api.await_proxy(Proc(child.pid, 0), 30)
    finally:
        child.kill()
        child.wait()
    assert waits == [0.1, 0.1, 0.1]
