"""`sandgate run` reaches its daemon first, before its own imports: a cold daemon starts ~50 ms sooner.

A cold start's first connection waits for the daemon (issue 25), and the daemon's start is mostly its
imports; the launcher's own imports and checks used to come before the spawn. So the console script,
on `sandgate run`, finds the daemon's socket with nothing but `os` (netguard.daemon.daemonpath: the
same runtime-directory checks as ever) and connects, or spawns the daemon exactly as
launcher/run/daemonctl.py did (its own session, `/` as its directory, only DAEMON_ENV of the
environment, stdin from /dev/null, output to daemon.log, every other descriptor closed). daemonctl
takes what was found (`take`); if anything here fails, nothing is left half-done and daemonctl
does it all again the usual way, with its usual errors.
"""

from __future__ import annotations

import os
import sys

#: The daemon sees only what it needs of the launcher's environment (it outlives the launcher).
DAEMON_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "XDG_RUNTIME_DIR")
ABANDON_WAIT = 10.0  # seconds a failed run waits for the daemon it spawned, to stop it (~0.2 s unless loaded)


class Early:
    """What the start of a run found: a connected control socket, or a daemon spawned and its ready pipe."""

    def __init__(self, path: str, sock: object | None = None, ready_fd: int | None = None) -> None:
        self.path, self.sock, self.ready_fd = path, sock, ready_fd


_found: list[Early] = []


def command_args(argv: list[str], orig_argv: list[str]) -> list[str] | None:
    """The command line after the program when this process is sandgate's CLI (the console script, or
    `python -m launcher.cli` as the tests run it); None for anything else (a library user, a test run)."""
    if argv and argv[0].endswith("/sandgate"):
        return argv[1:]
    if argv[:1] == ["-m"] and "-m" in orig_argv:  # argv[0] is "-m" while -m's packages are imported
        at = orig_argv.index("-m")
        if orig_argv[at + 1 : at + 2] == ["launcher.cli"]:
            return orig_argv[at + 2 :]
    return None


def wanted(args: list[str] | None) -> bool:
    """`sandgate run ...` on Linux, not asking for help or a dry run (anything else finds its daemon later, if at all)."""
    if args is None or not sys.platform.startswith("linux") or args[:1] != ["run"]:
        return False
    opts = args[1 : args.index("--")] if "--" in args else args[1:]
    return not {"-h", "--help", "--dry-run"} & set(opts)  # a dry run starts nothing, no daemon either


def start() -> bool:
    """Connect to this user's daemon or spawn one; on any trouble, leave it all to daemonctl. True when a
    running daemon answered (a warm run)."""
    from netguard.daemon import daemonpath

    try:
        path = daemonpath.socket_path(daemonpath.runtime_dir())
    except (OSError, daemonpath.ControlError):
        return False  # reported by the launcher, in its own words, once it gets there
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(5.0)
        s.connect(path)
        _found.append(Early(path, sock=s))
        return True
    except OSError:
        s.close()
    ready = spawn(path)
    if ready is not None:
        _found.append(Early(path, ready_fd=ready))
        import atexit

        atexit.register(_untaken)  # a usage error exits before daemonctl takes it (a run exits by os._exit)
    return False


def spawn(path: str) -> int | None:
    """`python -m netguard.daemon` for `path`; the read end of its ready pipe, or None if it could not start."""
    try:
        r, w = (_high(fd) for fd in os.pipe())
    except OSError:
        return None
    argv = [sys.executable, "-m", "netguard.daemon", "--socket", path, "--ready-fd", "3"]
    env = {k: v for k, v in os.environ.items() if k in DAEMON_ENV}
    if not detach(argv, env, os.path.join(os.path.dirname(path), "daemon.log"), w):
        os.close(r)
        return None
    os.set_blocking(r, False)
    return r


def detach(argv: list[str], env: dict[str, str], log_path: str, ready: int | None = None) -> bool:
    """Start `argv` in a session of its own, output to `log_path`, `ready` (closed here) as its fd 3: a
    per-user server that outlives this run (the daemon, the fork server). False if it could not start."""
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        log = _high(os.open(log_path, flags, 0o600))
    except OSError:
        if ready is not None:
            os.close(ready)
        return False  # (what was opened is close-on-exec and goes with this process) daemonctl says it
    try:
        pid = os.fork()  # no thread runs here yet (daemonctl: before the sandbox): fork, then only os calls
    except OSError:
        pid = -1
    if pid == 0:
        _exec_detached(argv, env, log, ready)
    os.close(log)
    if ready is not None:
        os.close(ready)
    return pid > 0


def _high(fd: int) -> int:
    """`fd` moved above the standard streams: when one was closed, a new descriptor takes its number, and
    the child's dup2 onto 0-2 would overwrite it."""
    if fd >= 3:
        return fd
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _exec_detached(argv: list[str], env: dict[str, str], log: int, ready: int | None) -> None:
    """In the child: a session of its own (the terminal's Ctrl-C is not for it), only its descriptors, exec."""
    try:
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        if ready is not None:
            os.dup2(ready, 3)
            os.set_inheritable(3, True)  # dup2 onto itself (ready was 3) leaves close-on-exec set
        os.closerange(4, 1 << 20)  # nothing of the launcher's caller (a pipe, a terminal) may live on in the daemon
        os.chdir("/")  # hold no directory of the launcher's busy
        os.execve(argv[0], argv, env)
    except BaseException:
        pass
    os._exit(127)


def take(path: str) -> Early | None:
    """What `start` found for the socket `path` (once); None if nothing, or if it was for another socket."""
    early = _found.pop() if _found else None
    if early is not None and early.path != path:
        if early.ready_fd is not None:
            os.close(early.ready_fd)
        if early.sock is not None:
            early.sock.close()  # type: ignore[attr-defined]
        return None
    return early


def stop_if_idle(path: str, ready_fd: int | None, wait: float = ABANDON_WAIT) -> None:
    """Stop the daemon this run spawned for `path` (once it is up), unless another launcher is connected to it
    (a concurrent cold run may be about to bind): a run that failed before its bind must not leave it serving
    nobody for its idle time. On any trouble it idles out as before."""
    import select

    from netguard.daemon.control import ControlClient, ControlError

    try:
        if ready_fd is not None:
            select.select([ready_fd], [], [], wait)
            os.close(ready_fd)
        with ControlClient.connect(path, timeout=wait) as client:
            client.stop(if_idle=True)
    except (OSError, ControlError):
        pass


def _untaken() -> None:
    """At exit: what `start` spawned and nothing took (the command line or the directory was refused first)."""
    while _found:
        early = _found.pop()
        if early.sock is not None:
            early.sock.close()  # type: ignore[attr-defined]
        else:
            stop_if_idle(early.path, early.ready_fd)
