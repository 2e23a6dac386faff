"""The command's terminal: a pty of the sandbox's own devpts, made by init, relayed by the launcher.

When sandgate runs on a terminal, the host's /dev/pts/N must not reach inside (the threats: an
ioctl or a reopened /dev/tty on the user's real terminal, keystrokes pushed into it, its session's
job control), yet the command wants a terminal of its own (`tty`, ttyname(), GPG_TTY, job control).
So init, in the sandbox's mount namespace after /dev is built, opens the private devpts' ptmx,
passes the master out to the launcher (which relays it to the user's terminal), and puts the slave
in place of every descriptor that was the host's terminal. The command makes it its controlling
terminal in a session of its own; init leaves the host's session first, so no process of the
sandbox has the host's terminal as its own any more.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import termios
from typing import Any

TIOCGPTPEER = 0x5441  # open the slave from the master: no path lookup another process could race
TIOCSPTLCK = 0x40045431
TIOCGPTN = 0x80045430


class PtyPlan:
    """What init needs: which of fds 0-2 were the host's terminal, its modes and size, and the
    socket (inherited, this run only) that carries the master out to the launcher. A plain class:
    a dataclass costs most of this module's import, paid before CMD starts."""

    def __init__(self, fds: tuple[int, ...], attrs: list[Any], rows: int, cols: int, sock: int, peer: int) -> None:
        self.fds = fds
        self.attrs = attrs  # termios.tcgetattr() of the user's terminal: the inner pty starts in the same modes
        self.rows, self.cols = rows, cols
        self.sock = sock
        self.peer = peer  # the launcher's end of that socket: the holder closes its inherited copy first


def open_pair() -> tuple[int, int]:
    """(master, slave) from this mount namespace's /dev/ptmx, neither becoming anyone's terminal yet."""
    master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(master, TIOCSPTLCK, b"\0\0\0\0")  # unlockpt
        try:
            slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:  # a kernel before 4.13: by name, in our own devpts
            n = int.from_bytes(fcntl.ioctl(master, TIOCGPTN, b"\0\0\0\0"), sys.byteorder)
            slave = os.open(f"/dev/pts/{n}", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except BaseException:
        os.close(master)
        raise
    return master, slave


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, rows.to_bytes(2, sys.byteorder) + cols.to_bytes(2, sys.byteorder) + bytes(4))


def setup_in_init(plan: PtyPlan, uid: int, gid: int) -> None:
    """In init, mounts done: leave the host's session, make the pty, send the master out, and put
    the slave where the host's terminal was (init's own fds too: it keeps the slave open, so the
    master reads no spurious EIO while the command reopens its terminal)."""
    os.setsid()  # the threat: init's session had the host's terminal as controlling tty (/dev/tty)
    master, slave = open_pair()
    try:
        try:
            os.fchown(slave, uid, gid)  # the command may reopen it by name (GPG_TTY, pinentry)
        except OSError:
            pass  # init already is that uid (no other mapped), or the group is unmapped: owner rw is enough
        termios.tcsetattr(slave, termios.TCSANOW, plan.attrs)
        set_size(slave, plan.rows, plan.cols)
        with socket.socket(fileno=plan.sock) as out:
            socket.send_fds(out, [b"P"], [master])
        for fd in plan.fds:
            os.dup2(slave, fd)  # the host's terminal leaves the sandbox with this
    finally:
        os.close(master)
        os.close(slave)


def become_controlling(fd: int) -> None:
    """In the command, before exec: a session of its own with the sandbox's pty as its terminal, its
    process group in the foreground (so ^C and ^Z from the relayed terminal reach it)."""
    os.setsid()
    fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
