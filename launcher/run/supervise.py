"""While the sandbox lives: forward signals, hand over to a late daemon, report a dead one, record drops,
and relay the command's terminal when sandgate runs on one (launcher/run/ptyrelay.py).

CMD's exit code becomes sandgate's: a normal exit as is, death by signal N as 128+N (as in a
shell). Terminal-generated signals are not forwarded twice: the terminal already delivered them.
With a relay, CMD has a terminal (and a session) of its own: ^C and ^Z are bytes the sandbox's pty
turns into signals; a SIGINT/SIGQUIT sandgate itself gets goes to that pty's foreground group.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
from typing import TYPE_CHECKING

from launcher import ctty
from launcher.errors import render
from launcher.run import daemonctl
from netguard.audit import AuditLog, decision_record

if TYPE_CHECKING:  # imported only when sandgate runs on a terminal
    from launcher.run.ptyrelay import Relay

FORWARDED = ctty.FORWARDED  # (terminal-generated ones reach CMD directly in the terminal's foreground group)
TTY_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


def supervise(
    holder: int,
    chan: socket.socket,
    handover: daemonctl.Handover,
    audit: AuditLog,
    task: str,
    relay: Relay | None = None,
) -> int:
    """Wait for the sandbox; forward signals; hand over to a late daemon; report a dead one; record drops;
    relay the command's terminal (`relay`, when sandgate runs on one: restored on every way out)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    pending: list[int] = []

    def on_signal(sig: int, _frame: object) -> None:
        pending.append(sig)

    old_wakeup = signal.set_wakeup_fd(wake_w)
    old = {s: signal.signal(s, on_signal) for s in (*FORWARDED, *((signal.SIGWINCH,) if relay else ()))}
    holder_fd = os.pidfd_open(holder)
    daemon = handover.daemon
    daemon_fd = daemon.wait_fd()
    chan_open = True
    try:
        while True:
            fds = [holder_fd, wake_r, *([chan.fileno()] if chan_open else [])]
            fds += [daemon_fd] if daemon_fd is not None else []
            fds += relay.readers() if relay else []  # before _timeout: it decides the relay's too
            ready, writable, _ = select.select(fds, relay.writers() if relay else [], [], _timeout(daemon, relay))
            if wake_r in ready:
                os.read(wake_r, 4096)
            while pending:
                _signalled(pending.pop(0), chan if chan_open else None, relay)
            if relay is not None:
                relay.pump(ready, writable)
            if daemon_fd is not None and (daemon_fd in ready or daemon.pending):
                daemon_fd = _daemon_event(handover, relay)
            if chan_open and chan.fileno() in ready:
                chan_open = _drops(chan, audit, task, relay)
            if holder_fd in ready:
                while chan_open:  # the holder's last report of dropped packets
                    chan_open = _drops(chan, audit, task, relay)
                _, status = os.waitpid(holder, 0)
                code = os.waitstatus_to_exitcode(status)
                return 128 - code if code < 0 else code
    finally:
        if relay is not None:
            relay.close()  # the command's last output, then the user's terminal modes back
        os.close(holder_fd)
        handover.close()
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)


def _timeout(daemon: daemonctl.Daemon, relay: Relay | None) -> float | None:
    waits = [t for t in (1.0 if daemon.pending else None, relay.timeout() if relay else None) if t is not None]
    return min(waits) if waits else None


def _signalled(sig: int, chan: socket.socket | None, relay: Relay | None) -> None:
    """A signal to sandgate: a window resize for the relay, anything else on to CMD."""
    if relay is not None and sig == signal.SIGWINCH:
        relay.resize()
        return
    if relay is not None and sig in TTY_SIGNALS and relay.interrupt(sig):
        return  # ^C on a terminal that only shows the output (stdin a pipe), or `kill -INT`: as the key would
    if relay is not None and sig == signal.SIGCONT:
        relay.regain()  # back in the foreground (fg): raw again; in the background (bg): not
    _forward(sig, chan, relayed=relay is not None)


def _say(text: str, relay: Relay | None) -> None:
    """One line of sandgate's own on stderr; with the user's terminal raw, it needs its own CR."""
    print(render(text) + ("\r" if relay is not None and relay.raw else ""), file=sys.stderr)


def _forward(sig: int, chan: socket.socket | None, relayed: bool = False) -> None:
    """Pass a signal on to the holder, which relays it to init and so to CMD."""
    if sig in TTY_SIGNALS and not relayed and _terminal_owns_us():
        return  # the terminal already delivered it to CMD's process group (relayed: CMD is in a session of its own)
    if chan is not None:
        chan.send(f"S{sig}".encode())


def _daemon_event(handover: daemonctl.Handover, relay: Relay | None = None) -> int | None:
    """The daemon became ready (bind now), failed to start, or died: returns the next fd to watch."""
    daemon = handover.daemon
    if daemon.pending:
        try:
            if not daemon.poll_ready():
                return daemon.wait_fd()
            handover.try_bind()
            return daemon.wait_fd()
        except daemonctl.DaemonError as e:
            handover.close()  # the waiting connections are reset: no network (fail closed)
            _say(f"{e}; the sandbox has no network (fail closed)", relay)
            return None
    _say("the proxy daemon exited; the sandbox has no network from now on (fail closed)", relay)
    daemon.close()
    return None


def _drops(chan: socket.socket, audit: AuditLog, task: str, relay: Relay | None = None) -> bool:
    """One `kind: packet` record per (destination, protocol, port) the sandbox's table dropped; False at EOF."""
    try:
        msg = chan.recv(4096)
    except OSError:
        return False
    if not msg:
        return False
    if msg[:1] == b"D":
        dst, proto, port = msg[1:].decode(errors="replace").split(" ")
        audit.write(
            decision_record(
                task,
                os.urandom(6).hex(),
                "packet",
                "deny",
                dst,
                int(port) if port.isdigit() else None,
                proto=proto,
                reason=f"{proto} packet dropped by the sandbox firewall",
            )
        )
    elif msg[:1] == b"E":
        _say(msg[1:].decode(errors="replace"), relay)
    return True


def _terminal_owns_us() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False
