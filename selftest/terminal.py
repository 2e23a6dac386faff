"""Running the probe runner on a fresh pseudo-terminal, so the terminal-injection probe has a real one to attack."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

from selftest.errors import VerifyError
from selftest.world import World

RUN_TIMEOUT = 150.0


def run_on_a_terminal(w: World, cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str, int]:
    """Run sandgate on a fresh pseudo-terminal, so the terminal-injection probe has a real one to attack."""
    master, slave = pty.openpty()
    try:
        p = w.popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        slave = -1
        deadline = time.monotonic() + RUN_TIMEOUT
        chunks: list[str] = []
        errs: list[str] = []
        assert p.stdout is not None and p.stderr is not None
        streams = {p.stdout.fileno(): chunks, p.stderr.fileno(): errs, master: []}
        while p.poll() is None or any(_readable(fd) for fd in (p.stdout.fileno(), p.stderr.fileno())):
            if time.monotonic() > deadline:
                p.kill()
                raise VerifyError(f"the probes did not finish within {RUN_TIMEOUT:.0f} s")
            ready, _, _ = select.select(list(streams), [], [], 0.5)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    streams.pop(fd)
                    continue
                streams[fd].append(data.decode(errors="replace"))
            if not ready and p.poll() is not None:
                break
        p.wait()
        return "".join(chunks), "".join(errs), p.returncode
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)


def _readable(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _take_terminal() -> None:
    """In the child, already a session leader (World.popen starts a new session): adopt the pty as terminal."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
