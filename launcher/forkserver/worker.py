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
from typing import NoReturn

from fsguard import process
from launcher import ctty, timings
from launcher.forkserver import wire

MAX_FD = 1 << 20  # closerange's end: above any descriptor a server holds
GO_TIMEOUT = 10.0  # seconds for the caller's "go"; it sends it as soon as it has our pid


def spare(sock: socket.socket, server: int) -> NoReturn:
    """A worker forked ahead of its run (in the child of os.fork); never returns.

    It sheds the server's state and copies the pages a run would write, then waits on `sock` for a
    run: the request and its descriptors, the caller's connection first. EOF: the server stopped."""
    try:
        _detach(server, sock.fileno())
        _own_pages()
        data, anc, _, _ = sock.recvmsg(wire.MAX_REQUEST, socket.CMSG_SPACE((wire.FDS + 2) * 4))
        fds = wire.unpack_fds(anc, (socket.SOL_SOCKET, socket.SCM_RIGHTS))
        sock.close()
        msg = wire.decode(data, len(fds) - 1) if data and fds else None
    except BaseException:
        traceback.print_exc()
        os._exit(125)
    if not isinstance(msg, wire.Request):
        os._exit(0)  # no run came (the server stopped): nothing ran
    run(msg, fds[1:], socket.socket(fileno=fds[0]))


def run(req: wire.Request, fds: list[int], conn: socket.socket) -> NoReturn:
    """A run's whole life in its worker, from the caller's "go" to its status; never returns."""
    code = 125
    try:
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


def _own_pages() -> None:
    """Write, before any run, the server's pages a run would write (the reference counts of what it
    imported): ~2 ms of copy-on-write faults a run would otherwise meet along its way."""
    gc.unfreeze()
    gc.get_objects()  # a list of every tracked object: each one's count written, and written back
    gc.freeze()


def _detach(server: int, keep: int) -> None:
    """Nothing of the server's: its descriptors (all but 0-2 and `keep`: the listener, other runs'
    callers, their pidfds), session, signal handling; dead with it (fail closed: a run nobody watches
    for its caller's death must not go on)."""
    process.die_with_parent(server)
    os.closerange(3, keep)
    os.closerange(keep + 1, MAX_FD)
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
