"""Who may use a daemon's control socket: a process in the daemon's own user and network namespaces.

Threat (issue 22): the socket is 0600 in a 0700 directory, so only the daemon's uid reaches it, and
SO_PEERCRED reports a sandboxed process as that very uid (its user namespace maps it there). A
sandbox that finds another daemon of its user (a login session's `$XDG_RUNTIME_DIR/sandgate` beside a
cron run's `/tmp/sandgate-<uid>`, the user's daemon beside a `sudo sandgate run`) could bind a policy
of its own choosing there and reach anything, unaudited, or stop it. The uid says nothing; where the
peer lives does: a launcher runs in the namespaces the daemon was started from (it started it, or one
like it), and every sandboxed process, root or not, is in a user namespace of its own, nested below.

The peer is read race-free: SO_PEERPIDFD (Linux 6.5) pins the process that called connect(); its pid is
read from the pidfd, its namespaces from /proc/<pid>/ns, and the pidfd is asked again afterwards: a
process still alive then cannot have had its pid reused in between. Older kernels: SO_PEERCRED's pid
and pidfd_open, with a window in which a dead peer's pid could be reused (said in the README).
"""

from __future__ import annotations

import os
import socket
import struct

SO_PEERPIDFD = 77  # <asm-generic/socket.h>; Python's socket module does not name it yet
_NAMESPACES = ("user", "net")  # user: no sandbox shares the daemon's; net: a daemon serves one netns


class PeerRefused(Exception):
    """The peer is not a launcher in the daemon's namespaces; the text says why (for the daemon's log)."""


def own_namespaces() -> dict[str, tuple[int, int]]:
    """The daemon's own namespaces, read once at start (a daemon never changes them)."""
    return {ns: _ns_id(f"/proc/self/ns/{ns}") for ns in _NAMESPACES}


def check(sock: socket.socket, ours: dict[str, tuple[int, int]]) -> int:
    """The peer's pid if it lives in `ours`; else PeerRefused. Fail closed: anything unreadable refuses."""
    pidfd = _peer_pidfd(sock)
    try:
        pid = _pid_of(pidfd)
        theirs = {ns: _ns_id(f"/proc/{pid}/ns/{ns}") for ns in ours}
        if _pid_of(pidfd) != pid:  # it exited while we looked: /proc/<pid> may already be another process
            raise PeerRefused(f"pid {pid} exited during the check")
    except OSError as e:
        raise PeerRefused(f"cannot read the peer's namespaces: {e.strerror or e}") from None
    finally:
        os.close(pidfd)
    for ns, ident in ours.items():
        if theirs[ns] != ident:
            raise PeerRefused(f"pid {pid} is in another {ns} namespace (a sandbox, or another machine's view)")
    return pid


def _peer_pidfd(sock: socket.socket) -> int:
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))
    except OSError:
        pass  # before Linux 6.5
    pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    if pid <= 0:
        raise PeerRefused("the kernel did not say which process connected")
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        raise PeerRefused(f"pid {pid} is gone: {e.strerror}") from None


def _pid_of(pidfd: int) -> int:
    """The pid a pidfd refers to, in our pid namespace; PeerRefused once the process has exited (-1)."""
    with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as f:
        for line in f:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid <= 0:
                    raise PeerRefused("the peer exited (or lives in a pid namespace we cannot see)")
                return pid
    raise PeerRefused("not a pidfd")


def _ns_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def refusal(conn: socket.socket, ours: dict[str, tuple[int, int]]) -> str | None:
    """Why this control peer is refused, or None: the daemon's uid *and* its user and network namespaces."""
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
    except OSError:
        uid = -1
    if uid != os.geteuid():  # the socket is 0600 in a 0700 dir: another user never gets this far
        return f"uid {uid} is not the daemon's"
    try:
        check(conn, ours)
    except PeerRefused as e:
        return str(e)
    return None
