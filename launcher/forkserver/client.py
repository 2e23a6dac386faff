"""The console script's side of the fork server: may this run be served, then pass it over and wait.

Imports only what the interpreter has loaded already plus C modules (_socket and _signal, not socket
and signal: their enums cost ~5 ms): a served run's whole Python cost is the interpreter's start and
this module. Anything unexpected before the server says "started" leaves the run to the full path
(the caller's streams untouched); after it, the run is the worker's and this process only forwards
signals and exits with its status.
"""

from __future__ import annotations

import _signal
import _socket
import os
import sys
import time

from launcher import ctty
from launcher.forkserver import context, wire

REFUSED_FOR = 600.0  # seconds a refused key is not started again (client._refused_lately)
REPLY_TIMEOUT = 5.0  # seconds to be accepted and forked; a server that slow leaves the run to the full path
LAUNCHER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (socket path, key) of a server this run looked for and did not find: started for the next run.
missed: list[tuple[str, str]] = []


def serve(args: list[str]) -> None:
    """Run `sandgate ARGS` through this context's server and exit with its status; return (nothing done)
    when the run must take the full path: no server yet, a terminal, or anything unexpected."""
    if os.environ.get("SANDGATE_FORKSERVER") == "0" or any(_isatty(fd) for fd in (0, 1, 2)):
        return  # a terminal on a stream: the launcher's pty relay, which a served run does not have
    tty = _terminal()
    if tty == -1:
        return  # its terminal can signal it (^C, ^Z reach the whole foreground group): job control as ever
    try:
        sock = _connect(tty)
    except OSError:
        sock = None
    if sock is None:
        if tty is not None:
            os.close(tty)
        return
    _wait(sock)  # never returns


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _terminal() -> int | None:
    """The controlling terminal, opened for approval prompts (a worker has none of its own); None without
    one; -1 when it could send this process's group a signal (foreground, ISIG on): a human at a shell,
    whose ^C and ^Z must reach CMD the way they reach a bare command."""
    try:
        fd = ctty.open_tty()
    except OSError:
        return None
    try:
        import termios

        if os.tcgetpgrp(fd) == os.getpgrp() and termios.tcgetattr(fd)[3] & termios.ISIG:
            os.close(fd)
            return -1
    except OSError:
        pass  # (termios.error is an OSError) a terminal we cannot ask: it cannot signal us either way
    return fd


def _connect(tty: int | None) -> _socket.socket | None:
    """Connected and accepted: the socket with the run started; None if no server serves this context."""
    from netguard.daemon import daemonpath

    try:
        rt = daemonpath.runtime_dir()
    except daemonpath.ControlError:
        return None  # the full path says why, in its words
    here = os.getcwd()  # a deleted directory (FileNotFoundError): the full path says so
    key = context.key(os.environ, LAUNCHER_DIR)
    path = os.path.join(rt, context.socket_name(key))
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    sock.settimeout(REPLY_TIMEOUT)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        missed.append((path, key))
        return None
    try:
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        sock.close()
        return None
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        req = wire.Request(key, list(sys.argv), here, dict(os.environ), umask, tty is not None)
        data = req.encode()
        if len(data) > wire.MAX_REQUEST:
            sock.close()
            return None  # a huge environment or command line: the full path takes it
        fds = wire.pack_fds([0, 1, 2, cwd, *([tty] if tty is not None else [])])
        sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        return _started(sock)
    except OSError:
        sock.close()  # before "go": a worker forked for us sees the end and runs nothing
        return None
    finally:
        os.close(cwd)


def _started(sock: _socket.socket) -> _socket.socket | None:
    """The server's answer: "P" and a pidfd (then we say go), or anything else (the full path)."""
    data, anc, _flags, _addr = sock.recvmsg(64, _socket.CMSG_SPACE(4))
    pidfds = wire.unpack_fds(anc, (_socket.SOL_SOCKET, _socket.SCM_RIGHTS))
    kind, _value = wire.unframe(data)
    if kind != b"P" or len(pidfds) != 1:
        for fd in pidfds:
            os.close(fd)
        sock.close()
        return None
    pidfd = pidfds[0]
    for sig in ctty.FORWARDED:  # from here on the run is the worker's: what we are sent is for it
        _signal.signal(sig, lambda s, _f: _forward(pidfd, s))
    sock.send(b"G")  # committed: the worker starts the run
    return sock


def _forward(pidfd: int, sig: int) -> None:
    try:
        _signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        pass  # the worker has exited; its status is on its way


def _wait(sock: _socket.socket) -> None:
    """The run's status, as ours: an exit code, or death by the signal that killed the worker."""
    sock.settimeout(None)
    while True:
        try:
            data = sock.recv(64)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        kind, value = wire.unframe(data)
        if kind == b"X" and value.isdigit():
            os._exit(int(value))
        if kind == b"K" and value.isdigit():
            _die_of(int(value))
        if not data:
            os.write(2, b"sandgate: error: the fork server went away with the run; its status is unknown\n")
            os._exit(125)


def _die_of(sig: int) -> None:
    """Die of `sig`, as the worker did (a SIGKILLed launcher reads the same to the caller)."""
    try:
        _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    os._exit(128 + sig)


def spawn_missed() -> None:
    """Start the server this run looked for (`python -P -m launcher.forkserver`, detached like the daemon)."""
    if not missed:
        return
    path, key = missed.pop()
    if _refused_lately(path + ".refused"):
        return  # a server started for this key found itself another context (its log says why): not again
    if not _missed_twice(os.path.join(os.path.dirname(path), "fork-missed"), key):
        return
    from launcher import prestart

    env = {k: v for k, v in os.environ.items() if k in prestart.DAEMON_ENV or k.startswith(("PYTHON", "LC_"))}
    argv = [sys.executable, *server_flags(), "-m", "launcher.forkserver", "--socket", path, "--key", key]
    prestart.detach(argv, env, os.path.join(os.path.dirname(path), "forkserver.log"))


def server_flags() -> list[str]:
    """The server's interpreter flags: no script directory on sys.path (-P), and the caller's UTF-8 mode.
    A caller in the C or POSIX locale (`env -i`, cron, many CI runners and agents) starts in UTF-8 mode
    (PEP 540) and exports LC_CTYPE=C.UTF-8 (PEP 538), with which a child would not be: without -X utf8
    its server would be another context, refuse, and nobody of that locale would ever be served."""
    return ["-P", "-X", f"utf8={sys.flags.utf8_mode}"]


def _refused_lately(marker: str) -> bool:
    """A server started for this key refused it within REFUSED_FOR seconds (its context changed between
    the caller's key and its own: a mount came or went, say); after that, it may be tried again."""
    try:
        return os.stat(marker).st_mtime > time.time() - REFUSED_FOR
    except OSError:
        return False


def _missed_twice(marker: str, key: str) -> bool:
    """True the second time in a row a warm run of this context finds no server. A context made anew for
    each command (a mount namespace with fresh tmpfs covers, say) would start a server for nobody at
    every run; one file remembers the last key that missed (the key names the network namespace)."""
    try:
        with open(marker) as f:
            if f.read() == key:
                return True
    except OSError:
        pass
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    return False


def stale_files(runtime_dir: str) -> list[str]:
    """What `sandgate cleanup` removes: sockets no server answers (a server SIGKILLed while serving),
    refusal markers past REFUSED_FOR."""
    paths = [os.path.join(runtime_dir, n) for n in sorted(os.listdir(runtime_dir)) if n.startswith("fork-")]
    old = [p for p in paths if p.endswith(".refused") and not _refused_lately(p)]
    return old + [p for p in paths if p.endswith(".sock") and _dead(p)]


def _dead(path: str) -> bool:
    """Nothing listens there (another error, busy or not ours to judge: kept)."""
    from netguard.daemon import daemonpath

    try:
        return not daemonpath.answers(path)
    except OSError:
        return False


def stop_all(runtime_dir: str) -> int:
    """Ask every fork server of this network namespace to take no more runs (`sandgate daemon stop`); the
    runs they serve go on to their end, then each exits. Returns how many were asked."""
    asked, prefix = 0, context.socket_prefix()
    for name in sorted(os.listdir(runtime_dir)):
        if not (name.startswith(prefix) and name.endswith(".sock")):
            continue
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
        sock.settimeout(2.0)
        try:
            sock.connect(os.path.join(runtime_dir, name))
            sock.send(wire.STOP)
            asked += 1
        except OSError:
            pass  # gone already
        finally:
            sock.close()
    return asked
