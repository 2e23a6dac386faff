"""The fork server's loop: accept a caller of our uid and context, fork its worker, watch both.

One thread, one epoll: the listener; per run the worker's pidfd (reaped: its death by a signal is
told to the caller) and the caller's connection, watched for its hang-up only (the caller gone: the
worker is SIGKILLed, as a SIGKILLed launcher's run would be); the code watch (codewatch.py) and the
mount table: any change and the server stops taking runs, then exits when its last one ends. Idle for `idle_exit` seconds
with no run: it exits.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

from launcher.forkserver import codewatch, context, wire, worker

_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class Server:
    def __init__(
        self, listener: socket.socket, key: str, watch_fd: int, idle_exit: float, release: Callable[[], None]
    ) -> None:
        self.listener: socket.socket | None = listener
        self.release = release  # the socket closed and its file removed (daemonpath.DaemonSocket.release)
        self.key, self.watch_fd, self.idle_exit = key, watch_fd, idle_exit
        self.ep = select.epoll()
        self.ep.register(listener.fileno(), select.EPOLLIN)
        self.ep.register(watch_fd, select.EPOLLIN)
        # The mount table changed (the kernel flags /proc/self/mountinfo): our view is no longer the one
        # our key names (context.mounts), and a caller with that view may still come.
        self.mounts_fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self.view = self._view()
        self.ep.register(self.mounts_fd, select.EPOLLPRI)
        # pidfd -> (pid, the caller's connection; None: the spare worker, waiting for a run)
        self.runs: dict[int, tuple[int, socket.socket | None]] = {}
        self.spare: tuple[int, int, socket.socket] | None = None  # pid, pidfd, the pair's end it reads
        self.callers: dict[int, int] = {}  # connection fd -> pidfd
        self.idle_since = time.monotonic()
        self.stopping = False
        # SIGTERM: take no more runs. The wake-up pipe ends the poll (PEP 475 would resume it otherwise).
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        self.ep.register(self.wake_r, select.EPOLLIN)
        signal.signal(signal.SIGTERM, lambda *_: self.stop("SIGTERM"))

    def serve(self) -> None:
        self.fork_spare()
        while self.listener is not None or self.runs:
            timeout = self._idle_timeout()
            if timeout is not None and timeout <= 0:
                self.stop("idle")
            else:
                for fd, events in self.ep.poll(timeout):
                    self._event(fd, events)
            if self.stopping and self.listener is not None:
                self._close_listener()
            if not self._busy():  # between runs: its fork and page copies must not slow a run down
                self.fork_spare()  # (and here no caller's descriptor is open: a spare must hold none)

    def _idle_timeout(self) -> float | None:
        """Seconds left before an idle exit; None while a run lives, once stopping, or never idle-exiting."""
        if self.stopping or self.idle_exit <= 0 or self._busy():
            return None
        return self.idle_since + self.idle_exit - time.monotonic()

    def _view(self) -> list[str]:
        """What our mount table shows, as a key has it (context.mounts); read from the start."""
        os.lseek(self.mounts_fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self.mounts_fd, 65536):
            chunks.append(chunk)
        return context.mounts(b"".join(chunks).decode(errors="replace"))

    def _busy(self) -> bool:
        return any(conn is not None for _, conn in self.runs.values())

    def stop(self, why: str) -> None:
        """Take no more runs (the ones running go on to their end)."""
        if not self.stopping:
            print(f"sandgate fork server {os.getpid()}: stopping ({why})", file=sys.stderr, flush=True)
        self.stopping = True

    def _event(self, fd: int, events: int) -> None:
        if self.listener is not None and fd == self.listener.fileno():
            self._accept()
        elif fd == self.wake_r:
            os.read(fd, 64)  # the handler already ran
        elif fd == self.watch_fd:
            if codewatch.changed(fd):  # (not the imports' own byte-code cache)
                self.stop("its code changed")
        elif fd == self.mounts_fd and self._view() != self.view:  # (reading it again clears the flag)
            self.ep.unregister(fd)
            self.stop("the mount table changed")
        elif fd in self.runs:
            self._reap(fd)
        elif fd in self.callers:
            try:
                signal.pidfd_send_signal(self.callers[fd], signal.SIGKILL)  # the caller died: so does its run
            except OSError:
                pass
            self.ep.unregister(fd)
            del self.callers[fd]

    def _close_listener(self) -> None:
        assert self.listener is not None
        if self.spare is not None:
            self.spare[2].close()  # the spare reads EOF and exits (reaped like a run)
            self.spare = None
        self.ep.unregister(self.listener.fileno())
        self.release()  # the file goes now: a server killed while its last runs end leaves none behind
        self.listener = None

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            conn.settimeout(2.0)
            _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if uid != os.geteuid():
                conn.close()  # only our uid starts runs of ours: no answer at all
                return
            data, anc, flags, _ = conn.recvmsg(wire.MAX_REQUEST, socket.CMSG_SPACE((wire.FDS + 1) * 4))
            fds = wire.unpack_fds(anc, (socket.SOL_SOCKET, socket.SCM_RIGHTS))
            msg = wire.decode(data, len(fds)) if not flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) else None
            if codewatch.changed(self.watch_fd):  # a change queued before this caller came: not served
                self.stop("its code changed")
            if msg == "stop":
                self.stop("asked")
            elif not isinstance(msg, wire.Request) or self.stopping or msg.key != self.key or not _same_dir(msg, fds):
                conn.send(b"R")  # the caller takes the full path
            else:
                self._fork(msg, data, fds, conn)
                return
        except (OSError, wire.WireError) as e:
            print(f"sandgate fork server: refused a request: {e}", file=sys.stderr, flush=True)
            try:
                conn.send(b"R")
            except OSError:
                pass
        finally:
            for fd in fds:
                os.close(fd)
        conn.close()

    def _fork(self, req: wire.Request, data: bytes, fds: list[int], conn: socket.socket) -> None:
        """Hand the run to the spare worker (forked now if there is none) and tell the caller; the next spare
        is forked once no run is in progress (serve)."""
        spare = self.spare or self._fork_spare()
        self.spare = None
        pid, pidfd, sock = spare
        try:
            sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, wire.pack_fds([conn.fileno(), *fds]))])
        finally:
            sock.close()
        self.runs[pidfd] = (pid, conn)
        self.callers[conn.fileno()] = pidfd
        self.ep.register(conn.fileno(), select.EPOLLRDHUP)  # hang-up only: the caller's "go" is the worker's
        try:
            conn.sendmsg([wire.frame(b"P", pid)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, wire.pack_fds([pidfd]))])
        except OSError:
            pass  # the caller is gone: its hang-up is in the epoll, and the worker sees no "go"

    def fork_spare(self) -> None:
        """A worker for the next run, forked ahead: its fork and page copies are off the next run's path."""
        if self.spare is None and not self.stopping:
            try:
                self.spare = self._fork_spare()
            except OSError as e:
                print(f"sandgate fork server: no spare worker: {e}", file=sys.stderr, flush=True)

    def _fork_spare(self) -> tuple[int, int, socket.socket]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            worker.spare(theirs, server)  # it closes every descriptor but its end and 0-2
        theirs.close()
        pidfd = os.pidfd_open(pid)
        self.ep.register(pidfd, select.EPOLLIN)
        self.runs[pidfd] = (pid, None)  # reaped like a run; not a run until it gets one
        return pid, pidfd, mine

    def _reap(self, pidfd: int) -> None:
        pid, conn = self.runs.pop(pidfd)
        _, status = os.waitpid(pid, 0)
        self.ep.unregister(pidfd)
        os.close(pidfd)
        if conn is None:  # the spare (stopped, or died waiting): the next run forks its own
            if self.spare is not None and self.spare[1] == pidfd:
                self.spare[2].close()
                self.spare = None
            return
        if os.WIFSIGNALED(status):  # killed before it could say: the caller dies of the same
            try:
                conn.send(wire.frame(b"K", os.WTERMSIG(status)))
            except OSError:
                pass
        if self.callers.pop(conn.fileno(), None) is not None:
            self.ep.unregister(conn.fileno())
        conn.close()
        self.idle_since = time.monotonic()


def _same_dir(req: wire.Request, fds: list[int]) -> bool:
    """The caller's directory is the one its path names here. A worker changes to the path, never to the
    caller's descriptor: that may be a mount of another mount namespace (`ip netns exec` makes one per
    command), whose paths would mix with ours; and where the path leads elsewhere, the views differ."""
    try:
        here, theirs = os.stat(req.cwd), os.fstat(fds[3])
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (theirs.st_dev, theirs.st_ino)
