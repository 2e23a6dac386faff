"""The launcher's side of the proxy daemon: find it, start it on demand, hand it a sandbox, notice its death.

Cold start without waiting: when no daemon answers, one is spawned and the sandbox starts at
once. Its listeners already exist inside its namespace, so early connections simply wait in
their backlog until the daemon is ready and the binding is made. If the daemon never comes
up, the launcher closes the listeners: the waiting connections are reset (fail closed).
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

from launcher import prestart
from launcher.errors import UsageError
from netguard.daemon import control
from netguard.spec import BindingSpec

START_TIMEOUT = 30.0
CONNECT_RETRY = 5.0  # seconds a launcher keeps knocking on a daemon whose accept queue is full
DAEMON_ENV = prestart.DAEMON_ENV  # what the daemon sees of the launcher's environment


class DaemonError(UsageError):
    """The daemon could not be started or refused the sandbox; one line for the user."""


class Daemon:
    """One run's connection to the daemon, possibly still starting."""

    def __init__(self, runtime_dir: Path) -> None:
        self.path = control.socket_path(runtime_dir)
        self.log = runtime_dir / "daemon.log"
        self.client: control.ControlClient | None = None
        self.ready_fd: int | None = None
        self.deadline = time.monotonic() + START_TIMEOUT
        self.bound = False
        early = prestart.take(str(self.path))  # what the console script found first (launcher/prestart.py)
        if early is not None and early.sock is not None:
            self.client = control.ControlClient(early.sock)  # type: ignore[arg-type]  # a connected socket.socket
        elif early is not None:
            self.ready_fd = early.ready_fd
        else:
            self._connect_or_spawn()
        self.spawned = self.ready_fd is not None  # by this run: abandon() stops it if the run fails first

    def _connect_or_spawn(self) -> None:
        try:
            self.client = control.ControlClient.connect(self.path, timeout=5.0)
            return
        except (OSError, control.ControlError):
            pass
        self.ready_fd = prestart.spawn(str(self.path))  # its own session: the terminal's Ctrl-C is not for it
        if self.ready_fd is None:
            raise DaemonError(f"cannot start the proxy daemon (see {self.log})")

    @property
    def pending(self) -> bool:
        return self.client is None

    def wait_fd(self) -> int | None:
        """What to select() on: the ready pipe while starting, else the control socket (EOF: it died)."""
        return self.ready_fd if self.client is None else self.client.fileno()

    def poll_ready(self) -> bool:
        """Called when wait_fd() is readable (or on a timer) while pending; True once connected."""
        assert self.ready_fd is not None
        try:
            os.read(self.ready_fd, 64)
        except BlockingIOError:
            if time.monotonic() > self.deadline:
                raise DaemonError(
                    f"the proxy daemon did not start within {START_TIMEOUT:.0f} s; see {self.log}"
                ) from None
            return False
        os.close(self.ready_fd)
        self.ready_fd = None
        # "ready", or EOF: the new daemon exited, e.g. because another launcher's daemon won the race.
        # Many runs started at once (issue 23) fill the winner's accept queue (EAGAIN): try again a while.
        retry_until = time.monotonic() + CONNECT_RETRY
        while True:
            try:
                self.client = control.ControlClient.connect(self.path, timeout=5.0)
                return True
            except (OSError, control.ControlError) as e:
                if time.monotonic() > retry_until:
                    raise DaemonError(f"the proxy daemon did not start ({e}); see {self.log}") from None
            time.sleep(0.05)

    def wait_ready(self, timeout: float) -> None:
        """Block until connected (for callers that cannot start the sandbox before the daemon is up)."""
        end = time.monotonic() + timeout
        while self.pending:
            assert self.ready_fd is not None
            select.select([self.ready_fd], [], [], max(0.0, end - time.monotonic()))
            if not self.poll_ready() and time.monotonic() > end:
                raise DaemonError(f"the proxy daemon did not start within {timeout:.0f} s; see {self.log}")

    def bind(self, spec: BindingSpec, fds: list[int]) -> None:
        assert self.client is not None
        try:
            self.client.bind(spec, fds)
        except (OSError, control.ControlError) as e:
            raise DaemonError(f"the proxy daemon refused the sandbox: {e}") from None
        self.bound = True

    def abandon(self) -> None:
        """A run that failed before its bind (a policy error, a refused workspace): the daemon it spawned first
        thing must not serve nobody for its idle time (launcher/prestart.py stop_if_idle)."""
        fd, self.ready_fd = self.ready_fd, None
        client, self.client = self.client, None
        if self.spawned and not self.bound:
            if client is not None:
                client.close()
            prestart.stop_if_idle(str(self.path), fd)
        elif fd is not None:
            os.close(fd)
        elif client is not None:
            client.close()

    def end(self) -> None:
        """Tell the daemon this sandbox is gone, so its records are complete before the summary."""
        if self.client is not None:
            try:
                self.client.end()
            except (OSError, control.ControlError):
                pass

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None


class Handover:
    """The listeners (and audit fd) on their way to the daemon; ours are closed once it holds them."""

    def __init__(self, daemon: Daemon, spec: BindingSpec, fds: list[int]) -> None:
        self.daemon, self.spec, self.fds = daemon, spec, fds
        self.done = False

    def try_bind(self) -> None:
        """Bind now if the daemon is up; else later, when supervise() sees it ready."""
        if self.done or self.daemon.pending:
            return
        try:
            self.daemon.bind(self.spec, self.fds)
        finally:
            self.close()
        self.done = True

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
