"""The Linux backend behind the platform seam: both backends are the seam's Backend, and Linux's teardown
removes exactly what make made, whichever step failed, once.

The effects that need root and forks (the holder, its handshake, the daemon, the confinement plan's
filesystem walk) are faked; the run directory, the state file, the lock, the placeholders and the
audit log are real files under tmp_path, so "removed" is judged on disk. The real sequence runs in
the e2e tests (tests/e2e/test_run_e2e.py and friends).
"""

from __future__ import annotations

import inspect
import os
import pickle
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from fsguard import mounts
from launcher.errors import RunError
from launcher.run import confinement, daemonctl, linuxbackend, options, placeholdershare, runstate, sandbox, seam
from launcher.run.linuxbackend import LinuxBackend, LinuxRun, LinuxSandbox
from launcher.run.windowsbackend import WindowsBackend
from netguard.audit import AuditLog


def _static(linux: LinuxBackend, windows: WindowsBackend) -> tuple[seam.Backend, seam.Backend]:
    """mypy --strict (tests/unit/test_code_quality.py) refuses this if either stops fitting the Protocol."""
    return linux, windows


def test_both_backends_have_the_seams_methods_and_signatures() -> None:
    for cls in (LinuxBackend, WindowsBackend):
        for name in ("make", "start", "wait", "teardown"):
            want = list(inspect.signature(getattr(seam.Backend, name)).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert len(got) == len(want) and got[0] == "self", (cls, name, got)
    assert (LinuxBackend.name, WindowsBackend.name) == ("linux", "windows")
    assert seam.platform_name("linux") == LinuxBackend.name


@dataclass
class Effects:
    """What the fakes saw, in order; `fail` names the step that raises."""

    fail: str | None = None
    error: type[BaseException] = RuntimeError
    log: list[str] = field(default_factory=list)
    peer: socket.socket | None = None  # the holder's end of the channel

    def step(self, name: str) -> None:
        self.log.append(name)
        if self.fail == name:
            raise self.error(f"{name} failed")


class FakeDaemon:
    def __init__(self, fx: Effects) -> None:
        self.fx, self.pending = fx, fx.fail != "bind"

    def bind(self, spec: object, fds: list[int]) -> None:
        self.fx.step("bind")

    def end(self) -> None:
        self.fx.log.append("daemon.end")

    def close(self) -> None:
        self.fx.log.append("daemon.close")


class FakeBroker:
    def __init__(self, fx: Effects) -> None:
        self.fx = fx
        self.who: Callable[[str, int], str | None] = lambda ip, port: None

    def banner(self) -> str:
        return "banner"

    def start(self) -> None:
        self.fx.step("broker.start")

    def stop(self) -> None:
        self.fx.log.append("broker.stop")


def _fakes(monkeypatch: pytest.MonkeyPatch, fx: Effects, tmp_path: Path) -> None:
    """Each faked step records itself and raises when it is `fx.fail`; the real ones are wrapped."""
    ph = (str(tmp_path / "work" / ".git" / "hooks"), True), (str(tmp_path / "work" / ".envrc"), False)
    plan = mounts.MountPlan(False, (), (), (), ph, (), (), (str(tmp_path / "work"),))

    def wrap(mod: object, name: str, fake: Callable[..., Any] | None = None) -> None:
        real = fake or getattr(mod, name)

        def step(*a: object, **kw: object) -> object:
            fx.step(name)
            return real(*a, **kw)

        monkeypatch.setattr(mod, name, step)

    def holder(parent: int, early: sandbox.Early) -> tuple[int, socket.socket]:
        mine, fx.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return 4242, mine

    def listeners(*_: object) -> list[int]:
        return [fd for _ in range(2) for fd in os.pipe()]

    wrap(runstate, "make_dirs")
    wrap(runstate, "cleanup_stale")
    wrap(confinement, "plan", lambda *_: confinement.Confinement(plan, None, {}, [], str(tmp_path / "home")))
    wrap(placeholdershare, "take")
    wrap(linuxbackend, "_inside")
    wrap(linuxbackend, "_broker", lambda *_: FakeBroker(fx))
    wrap(sandbox, "start_holder", holder)
    wrap(sandbox, "handshake", listeners)
    monkeypatch.setattr(linuxbackend, "_tell_terminal", lambda text: None)


def _run(tmp_path: Path, fx: Effects) -> tuple[LinuxBackend, seam.SandboxRequest, runstate.RunPaths]:
    (tmp_path / "work" / ".git").mkdir(parents=True, exist_ok=True)
    opts = options.RunOptions(cmd=["true"], audit_path=tmp_path / "audit.jsonl", user=None)
    paths = runstate.RunPaths(tmp_path / "rt", "r1")
    (tmp_path / "rt").mkdir(exist_ok=True)
    daemon = cast(daemonctl.Daemon, FakeDaemon(fx))
    run = LinuxRun(opts, paths, daemon, AuditLog(opts.audit_path), None)
    request = seam.SandboxRequest(tuple(opts.cmd), str(tmp_path / "work"), {}, opts.policy, opts.task)
    return LinuxBackend(run), request, paths


# The holder is forked before the plan (it makes its namespaces while the launcher plans).
MADE = ["make_dirs", "_broker", "start_holder", "cleanup_stale", "plan", "take", "_inside", "handshake"]
UNDO_HOST = ["broker.stop", "daemon.close"]  # then placeholders, run state and the audit log, judged on disk
UNDO_ALL = ["daemon.end", *UNDO_HOST]  # once the holder was forked: the channel closed, the binding ended


@pytest.mark.parametrize(
    ("fail", "undo"),
    [
        ("make_dirs", ["daemon.close"]),  # the broker was not made yet
        ("_broker", ["daemon.close"]),
        ("start_holder", UNDO_HOST),
        ("cleanup_stale", UNDO_ALL),  # the holder forked first: its channel closed, the binding ended
        ("plan", UNDO_ALL),
        ("take", UNDO_ALL),
        ("_inside", UNDO_ALL),
        ("handshake", UNDO_ALL),
        ("bind", UNDO_ALL),
        ("broker.start", UNDO_ALL),
    ],
)
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_make_removes_exactly_what_it_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail: str, undo: list[str], error: type[BaseException]
) -> None:
    fx = Effects(fail, error)
    _fakes(monkeypatch, fx, tmp_path)
    backend, request, paths = _run(tmp_path, fx)
    with pytest.raises(error, match=f"{fail} failed"):
        seam.run_in(backend, request)
    done = fx.log.index(fail) + 1
    assert fx.log[done:] == undo  # make stopped at `fail`; nothing was started or awaited
    assert not paths.dir.exists() and not paths.state.exists()
    assert not os.path.lexists(tmp_path / "work" / ".git" / "hooks")  # placeholders gone, or never made
    assert not os.path.lexists(tmp_path / "work" / ".envrc")
    assert backend.run.audit._fd is None  # closed
    if fx.peer is not None:  # the holder sees EOF: it never gets the go
        assert fx.peer.recv(16) == b""


def test_make_start_then_teardown_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The happy path makes every piece (the control: the failure cases above are not vacuous), the go
    reaches the holder only at start, and a second teardown does nothing."""
    fx = Effects()
    _fakes(monkeypatch, fx, tmp_path)
    backend, request, paths = _run(tmp_path, fx)
    box = backend.make(request)
    assert fx.log == [*MADE, "broker.start"]
    assert paths.dir.is_dir() and paths.state.is_file() and (paths.dir / "resolv.conf").is_file()
    assert os.path.isdir(tmp_path / "work" / ".git" / "hooks") and os.path.isfile(tmp_path / "work" / ".envrc")
    assert fx.peer is not None
    fx.peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        fx.peer.recv(16)  # no go before start
    backend.start(box)
    msg, fds, _, _ = socket.recv_fds(fx.peer, 16, 1)
    assert msg == b"G" and len(fds) == 1  # with the rest of the plan, in a sealed memfd
    os.lseek(fds[0], 0, os.SEEK_SET)
    with os.fdopen(fds[0], "rb") as f:
        inside = pickle.load(f)
    assert isinstance(inside, sandbox.Inside) and box.inside is not None
    assert inside.cmd == ("true",) and inside.env == box.inside.env and inside.mounts == box.inside.mounts
    backend.teardown(box)
    assert fx.log[len(MADE) + 1 :] == UNDO_ALL
    assert not paths.dir.exists() and not os.path.lexists(tmp_path / "work" / ".envrc")
    fx.log.clear()
    backend.teardown(box)
    assert fx.log == [] and box.chan is None and box.broker is None and box.refs is None


def test_start_and_wait_refuse_an_unfinished_sandbox(tmp_path: Path) -> None:
    """A seam misuse never starts CMD unconfined."""
    fx = Effects()
    backend, request, _ = _run(tmp_path, fx)
    box = LinuxSandbox(request, backend.run)
    with pytest.raises(RunError, match="start before make"):
        backend.start(box)
    with pytest.raises(RunError, match="wait before make"):
        backend.wait(box)
    with pytest.raises(TypeError):
        backend.teardown(object())
