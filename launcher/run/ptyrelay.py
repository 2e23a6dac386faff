"""The launcher's half of the command's terminal: bytes between the user's terminal and the master
of the sandbox's own pty (made inside by fsguard/sandboxpty.py), the user's terminal in raw mode meanwhile.

Imported only when sandgate runs on a terminal. Raw mode is set, and the keys read, only while
sandgate is the terminal's foreground job (a background run must not stop on SIGTTOU/SIGTTIN; it
looks a few times a second whether `fg` gave it the terminal), and the saved modes are put back on
every way out: the command's end, an error, a signal (supervise's `finally`, and teardown's). The line discipline that turns ^C into SIGINT, ^Z into SIGTSTP and ^D into EOF is
the sandbox pty's: those keys reach the command's foreground process group inside.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import sys
import termios
import time
from collections.abc import Callable
from typing import Any

from fsguard.sandboxpty import PtyPlan, set_size

TIOCSIG = 0x40045436  # on a pty master: signal the slave's foreground process group
TIOCGSID = 0x5429  # the session a terminal controls (ENOTTY: not the caller's controlling terminal)
IN_LIMIT = 64 * 1024  # bytes typed ahead for a command that does not read: stop reading the terminal beyond
CHUNK = 16 * 1024
PAUSE_POLL = 0.1  # seconds between looks while a sandgate prompt owns the terminal
BACKGROUND_POLL = 0.25  # seconds between looks whether a background sandgate was brought to the foreground
DRAIN_WAIT = 0.2  # seconds the master may stay silent before its last output counts as read
DRAIN_LIMIT = 2.0  # the whole drain at the end, at most (a process outside holding the slave must not hang us)


class Outer:
    """The user's terminal as sandgate found it: which of fds 0-2 are it (replaced inside), where the
    keys come from (fd 0; None: stdin is not it, the relay opens /dev/tty) and the output goes, its modes."""

    def __init__(self, fds: tuple[int, ...], term_in: int | None, term_out: int, attrs: list[Any]) -> None:
        self.fds, self.term_in, self.term_out, self.attrs = fds, term_in, term_out, attrs


def terminal_fds(kind: Callable[[int], int | None]) -> tuple[tuple[int, ...], int | None, int] | None:
    """Pure: from each std fd's terminal identity (st_rdev, None if not a terminal), the fds that are
    the user's terminal (stdin's, else stdout's), the fd input comes from and the one output goes
    to; None when neither stdin nor stdout is a terminal (then nothing changes)."""
    ids = {fd: kind(fd) for fd in (0, 1, 2)}
    lead = 0 if ids[0] is not None else 1 if ids[1] is not None else None
    if lead is None:
        return None
    fds = tuple(fd for fd in (0, 1, 2) if ids[fd] is not None and ids[fd] == ids[lead])
    out = next((fd for fd in (1, 2) if fd in fds), 0)  # stdout and stderr both redirected: only echo, to fd 0
    return fds, (0 if lead == 0 else None), out


def _tty_id(fd: int) -> int | None:
    try:
        return os.fstat(fd).st_rdev if os.isatty(fd) else None
    except OSError:
        return None


def probe() -> Outer | None:
    """The user's terminal when stdin or stdout is one, else None (the run goes on as without a pty)."""
    found = terminal_fds(_tty_id)
    if found is None:
        return None
    fds, term_in, term_out = found
    try:
        attrs = termios.tcgetattr(fds[0])
    except termios.error:
        return None
    return Outer(fds, term_in, term_out, attrs)


def raw(attrs: list[Any]) -> list[Any]:
    """Pure: cfmakeraw(3) of `attrs`, a new list: every key goes through as a byte, nothing is echoed
    or translated here (the sandbox's pty does that)."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = attrs
    iflag &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP | termios.INLCR | termios.IGNCR) & ~(
        termios.ICRNL | termios.IXON
    )
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag = (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    cc = list(cc)
    cc[termios.VMIN], cc[termios.VTIME] = 1, 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


def window(fd: int) -> tuple[int, int]:
    """(rows, columns) of a terminal; (0, 0) when it has none set."""
    try:
        got = fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8))
    except OSError:
        return 0, 0
    return int.from_bytes(got[0:2], sys.byteorder), int.from_bytes(got[2:4], sys.byteorder)


def plan(outer: Outer, sock: int, peer: int) -> PtyPlan:
    rows, cols = window(outer.fds[0])
    return PtyPlan(outer.fds, outer.attrs, rows, cols, sock, peer)


def _set_modes(fd: int, attrs: list[Any]) -> None:
    """tcsetattr with SIGTTOU blocked: restoring from the background must not stop sandgate."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        termios.tcsetattr(fd, termios.TCSADRAIN, attrs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _foreground(fd: int) -> bool:
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


class Relay:
    """One run's relay. Until init sends the master it waits on `sock`; then each select round asks
    `readers`/`writers`/`timeout` and hands the ready fds to `pump`; `close` drains and restores."""

    def __init__(self, outer: Outer, sock: socket.socket, paused: Callable[[], bool] | None = None) -> None:
        self.outer, self.sock, self.paused = outer, sock, paused or (lambda: False)
        self.master: int | None = None
        self.saved: list[Any] | None = None  # the user's modes while theirs is raw (set only when ours)
        self.to_master = b""
        self.term_in = outer.term_in  # where the keys are read (fd 0, or /dev/tty opened once the master came)
        self.opened: int | None = None  # that /dev/tty, ours to close
        self.input_open = True
        self.output_open = True
        self.held = False  # this round leaves the user's keys to a sandgate prompt

    @property
    def raw(self) -> bool:
        """Whether the user's terminal is raw now (a line sandgate prints then needs its own \\r)."""
        return self.saved is not None

    def readers(self) -> list[int]:
        """The fds to wait on this round (call first: it also decides `timeout`)."""
        if self.master is None:
            return [self.sock.fileno()] if self.sock.fileno() >= 0 else []
        out = [self.master] if self.output_open else []
        self.held = self._reading() and self.paused()  # once per round: a prompt ending meanwhile waits one poll
        if self.term_in is not None and self._reading() and not self.held:
            out.append(self.term_in)
        return out

    def writers(self) -> list[int]:
        return [self.master] if self.master is not None and self.to_master else []

    def timeout(self) -> float | None:
        """Look again soon while a prompt holds the terminal (its answer is not the command's input), or
        while sandgate runs in the background (`fg` gives it the terminal without a signal)."""
        if self.held:
            return PAUSE_POLL
        return BACKGROUND_POLL if self._in_background() else None

    def pump(self, readable: list[int], writable: list[int]) -> None:
        if self.master is None:
            if self.sock.fileno() in readable:
                self._take_master()
            return
        if self._in_background():
            self.regain()
        if self.master in readable:
            self._from_master()
        if self.term_in in readable and self._reading() and not self.paused():  # a prompt since: its keys
            self._from_terminal()
        if self.master in writable or self.to_master:
            self._to_master()

    def resize(self) -> None:
        """SIGWINCH: the user's window size onto the master; the kernel signals the command's foreground."""
        if self.master is not None:
            try:
                set_size(self.master, *window(self.outer.fds[0]))
            except OSError:
                pass

    def interrupt(self, sig: int) -> bool:
        """SIGINT/SIGQUIT sent to sandgate: to the command's foreground process group, as the key would
        (TIOCSIG on the master); False when there is no master yet."""
        if self.master is None:
            return False
        try:
            fcntl.ioctl(self.master, TIOCSIG, sig)
        except OSError:
            return False
        return True

    def regain(self) -> None:
        """At start and on SIGCONT: raw and reading while sandgate is the foreground job, else neither."""
        fd = self.term_in
        if fd is None or self.master is None:
            return
        if _foreground(fd) and self.saved is None:
            try:
                now = termios.tcgetattr(fd)  # as the shell left them when it gave us the terminal
            except termios.error:
                return
            self.saved = now if _try_modes(fd, raw(now)) else None
        elif not _foreground(fd) and self.saved is not None:
            self._restore()

    def close(self) -> None:
        """After the sandbox ended: the master's last output to the user, their modes back. Idempotent."""
        try:
            if self.master is not None:
                self._drain()
        finally:
            self._restore()
            if self.master is not None:
                os.close(self.master)
                self.master = None
            if self.opened is not None:
                os.close(self.opened)
                self.opened = self.term_in = None
            self.sock.close()

    def _in_background(self) -> bool:
        return self.master is not None and self.term_in is not None and self.input_open and self.saved is None

    def _reading(self) -> bool:
        return self.input_open and self.saved is not None and len(self.to_master) < IN_LIMIT

    def _take_master(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.sock, 16, 1)
        except OSError:
            msg, fds = b"", []
        self.sock.close()  # one message only: EOF without it means init failed (it says why on stderr)
        if msg != b"P" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return
        self.master = fds[0]
        os.set_blocking(self.master, False)
        if self.term_in is None:  # stdin is a pipe: the keys still come from the user's terminal (less, vim -)
            self.term_in = self.opened = _same_terminal(self.outer.fds[0])
        self.resize()  # the window may have changed while the sandbox was built
        self.regain()

    def _from_master(self) -> None:
        assert self.master is not None
        try:
            data = os.read(self.master, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # EIO: no slave open any more (init holds one while it lives)
        if not data:
            self.output_open = False
            return
        self._write_out(data)

    def _from_terminal(self) -> None:
        """What is waiting on the user's terminal, never more: a prompt's thread also reads it, and may
        have taken the bytes that woke us (a blocking read would then stall the relay until the next key)."""
        fd = self.term_in
        assert fd is not None
        waiting = _waiting(fd)
        if waiting == 0:
            if _hung_up(fd):  # SIGHUP is on its way to us and forwarded to the command
                self.input_open = False
            return
        try:
            self.to_master += os.read(fd, min(waiting, CHUNK))
        except OSError:
            self.input_open = False

    def _to_master(self) -> None:
        assert self.master is not None
        try:
            n = os.write(self.master, self.to_master)
        except BlockingIOError:
            return
        except OSError:
            n = len(self.to_master)  # nobody reads it any more
        self.to_master = self.to_master[n:]

    def _write_out(self, data: bytes) -> None:
        while data:
            try:
                n = os.write(self.outer.term_out, data)
            except InterruptedError:
                continue
            except OSError:
                return  # a read-only fd 0 with stdout and stderr redirected: the echo has nowhere to go
            data = data[n:]

    def _drain(self) -> None:
        assert self.master is not None
        end = time.monotonic() + DRAIN_LIMIT  # output keeps coming only from a slave held outside the sandbox
        while self.output_open and time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], DRAIN_WAIT)
            if not ready:
                return
            self._from_master()

    def _restore(self) -> None:
        if self.saved is not None and self.term_in is not None:
            saved, self.saved = self.saved, None
            _try_modes(self.term_in, saved)


def _same_terminal(fd: int) -> int | None:
    """/dev/tty opened here when the terminal `fd` is is sandgate's controlling one (TIOCGSID answers
    only for that); opened only now, after the fork: the sandbox never inherits it."""
    try:
        fcntl.ioctl(fd, TIOCGSID, bytes(4))
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None


def _waiting(fd: int) -> int:
    """Bytes ready to read on a terminal (FIONREAD); 0 when none or it cannot say."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), sys.byteorder, signed=True)
    except OSError:
        return 0


def _hung_up(fd: int) -> bool:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in poll.poll(0))


def _try_modes(fd: int, attrs: list[Any]) -> bool:
    try:
        _set_modes(fd, attrs)
    except (termios.error, OSError):
        return False
    return True
