"""The human on sandgate's own terminal: one prompt at a time, a one-key answer, a deadline.

The terminal is /dev/tty opened here, never the sandbox's stdin (the sandbox must not be the one
typing the answer; seccomp also refuses it TIOCSTI). A process in the sandbox shares the terminal
and could print a fake prompt: every real prompt carries this run's code, printed by sandgate
before the command started and never given to the sandbox, so a prompt without it is not
sandgate's. No terminal, end of input or no answer in time is a refusal.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from launcher import ctty
from netguard.approval import Answer, By, Choice, Request

KEYS: dict[str, Choice] = {"o": "once", "r": "run", "a": "always", "d": "deny"}


def open_tty() -> int:
    """sandgate's controlling terminal, read and write; OSError when there is none."""
    return ctty.open_tty(os.O_RDWR)


def shown(text: str) -> str:
    """`text` with every non-printable character as '?'.

    The process name and the host come from the sandbox (prctl(PR_SET_NAME), SNI, Host headers):
    escape sequences hidden there could move the cursor and redraw a genuine, code-bearing prompt
    to name another destination.
    """
    return "".join(c if c.isprintable() else "?" for c in text)


class TerminalPrompt:
    def __init__(
        self, code: str, timeout: float, stop: threading.Event, open_tty: Callable[[], int] = open_tty
    ) -> None:
        self.code, self.timeout = code, timeout
        self._stop, self._open = stop, open_tty
        self._human = threading.Lock()  # one prompt on the terminal at a time

    def ask(self, req: Request) -> tuple[Answer, By]:
        """The human's choice for `req`, or deny (no terminal) or timeout (no answer in time)."""
        with self._human:
            try:
                fd = self._open()
            except OSError:
                return "deny", "no-terminal"
            try:
                os.write(fd, self.question(req).encode())
                choice = self._read_choice(fd, time.monotonic() + self.timeout)
                if choice is not None:
                    os.write(fd, f"sandgate [{self.code}] {choice}\r\n".encode())
                    return choice, "terminal"
                os.write(fd, f"\r\nsandgate [{self.code}] no answer: denied\r\n".encode())
                return "timeout", "timeout"
            finally:
                os.close(fd)

    def busy(self) -> bool:
        """A prompt is on the terminal (launcher/run/ptyrelay.py then leaves the keys to it)."""
        return self._human.locked()

    def question(self, req: Request) -> str:
        who = f" asked by {shown(req.asked_by)}" if req.asked_by else ""
        return (
            f"\r\nsandgate [{self.code}] allow {shown(req.host)}:{req.port} ({shown(req.kind)}){who}? "
            f"[o]nce, for this [r]un, [a]lways, [d]eny ({self.timeout:.0f}s): "
        )

    def _read_choice(self, fd: int, deadline: float) -> Choice | None:
        """Lines from the terminal until one starts with o, r, a or d; None at the deadline, EOF or stop."""
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], min(0.5, max(0.0, deadline - time.monotonic())))
            if self._stop.is_set():
                return None
            if not ready:
                continue
            chunk = os.read(fd, 64)
            if not chunk:
                return None
            buf += chunk
            if b"\n" in buf or b"\r" in buf:
                choice = KEYS.get(buf.strip()[:1].decode(errors="replace").lower())
                if choice is not None:
                    return choice
                buf = b""
                os.write(fd, b"o, r, a or d: ")
        return None
