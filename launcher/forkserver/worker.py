"""In the fork: become the caller's run (its streams, directory, umask, environment, arguments), run it
through the launcher's own entry, and exit with its status.

Everything a run inherits from its process and does not get here is the same by construction (the
server's context.key() equals the caller's); what a fork keeps of the server is undone first: its
descriptors, its session, its signal dispositions.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterable
from typing import NoReturn

from fsguard import process
from launcher import ctty, timings
from launcher.forkserver import wire

GO_TIMEOUT = 10.0  # seconds for the caller's "go"; it sends it as soon as it has our pid


def run(req: wire.Request, fds: list[int], conn: socket.socket, server: int, close: Iterable[int]) -> NoReturn:
    """The worker's whole life (in the child of os.fork); never returns."""
    code = 125
    try:
        _detach(server, close)
        if _go(conn):
            _become(req, fds)
            code = _main(req.argv)
        else:
            code = 0  # the caller gave up before "go" and runs it itself: nothing ran here
    except BaseException:  # the launcher reports its own errors; this is a bug of ours
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            conn.send(wire.frame(b"X", code))  # the server sends it too once it reaps us; first one wins
        except OSError:
            pass
        os._exit(code)


def _detach(server: int, close: Iterable[int]) -> None:
    """Nothing of the server's: its descriptors, session, signal handling; dead with it (fail closed: a
    run nobody watches for its caller's death must not go on)."""
    process.die_with_parent(server)
    for fd in close:
        try:
            os.close(fd)
        except OSError:
            pass
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():  # a fresh interpreter's dispositions
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _go(conn: socket.socket) -> bool:
    """The caller's "go": it has our pid and forwards its signals to us. No "go" (it timed out and took
    the full path, or died): nothing may run, or the command would run twice."""
    conn.settimeout(GO_TIMEOUT)
    try:
        return conn.recv(8) == b"G"
    except OSError:
        return False


def _become(req: wire.Request, fds: list[int]) -> None:
    """The caller's streams, directory, umask, environment and arguments."""
    for i in range(3):
        os.dup2(fds[i], i, inheritable=True)
    os.chdir(req.cwd)  # the path, checked by the server against fds[3] (server._same_dir)
    ctty.hand_in(fds[4] if req.tty else None)  # approval prompts and notices (launcher/ctty.py)
    for fd in fds[:4]:
        os.close(fd)
    os.umask(req.umask)
    os.environ.clear()
    os.environ.update(req.env)
    time.tzset()  # TZ as the caller has it
    if "tempfile" in sys.modules:
        import tempfile

        tempfile.tempdir = None  # TMPDIR read again, the caller's
    sys.argv = list(req.argv)
    timings.ON = req.env.get("SANDGATE_TIMINGS") == "1"  # read at import, in the server
    gc.disable()  # as the console script runs: launcher.gcpause.resume() freezes and enables it
    timings.mark("forked")


def _main(argv: list[str]) -> int:
    """launcher.cli.main, as the console script runs it, and its status."""
    from launcher import cli

    try:
        return int(cli.main(argv[1:]))
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
