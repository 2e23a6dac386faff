"""The launcher <-> daemon control protocol: JSON messages over AF_UNIX SOCK_SEQPACKET with SCM_RIGHTS.

One message is one JSON object (at most MAX_MESSAGE bytes); SEQPACKET keeps message
boundaries, so no framing is needed and a reply can never be confused with a half-read one.
Requests and replies:
  {"op": "bind", "spec": {"memfd": 5}} + fds [audit, regular, transparent, dns_udp, dns_tcp, spec memfd]
                                   -> {"ok": true} | {"ok": false, "error": "..."}  (netguard.daemon.specfd)
  {"op": "end"}                    -> {"ok": true} once this connection's binding is gone
  {"op": "status"}                 -> {"ok": true, "pid": N, "uptime": S, "bindings": [{"task", "since"}]}
  {"op": "stop"[, "if_idle": true]} -> {"ok": true, "stopped": B}, then the daemon exits (if_idle: unless
                                      another launcher is connected)
A binding lives as long as the connection that made it (EOF drops it). The daemon's half (its socket under
a lock, SO_PEERCRED, the passed fds) is here too. Only the stdlib and netguard.daemon: on the launcher's fast path."""

from __future__ import annotations

import array
import fcntl
import json
import os
import socket
import stat
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from netguard.daemon import daemonpath, specfd
from netguard.daemon.daemonpath import ControlError as ControlError
from netguard.daemon.daemonpath import DaemonSocket as DaemonSocket
from netguard.daemon.daemonpath import answers as answers
from netguard.daemon.daemonpath import code_id as code_id
from netguard.daemon.status import Status, parse_status
from netguard.spec import BindingSpec

MAX_MESSAGE = 1 << 20
#: The fds a bind carries, in this order.
BIND_FDS = ("audit", "regular", "transparent", "dns_udp", "dns_tcp")
MAX_FDS = 16  # room to notice (and close) a peer that sends too many, instead of truncating silently


# ---- messages -------------------------------------------------------------------------------


def send_message(sock: socket.socket, msg: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """Send one JSON object, with `fds` attached as SCM_RIGHTS; raises ValueError if it is too large."""
    data = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    sock.sendmsg([data], anc)


def recv_raw(sock: socket.socket, flags: int = 0) -> tuple[bytes, list[int], int]:
    """One message's bytes, the fds that came with it (close-on-exec) and its truncation flags.

    b"", no fds and no flags is EOF: the protocol never sends an empty message.
    """
    data, anc, msg_flags, _ = sock.recvmsg(
        MAX_MESSAGE + 1, socket.CMSG_SPACE(MAX_FDS * 4), flags | socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
            fds.extend(a)
    return data, fds, msg_flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC)  # the kernel echoes MSG_CMSG_CLOEXEC


def parse_message(data: bytes, msg_flags: int) -> dict[str, Any]:
    """The JSON object of a received message; ValueError with a reply-worthy text if it is not one."""
    if isinstance(data, specfd.Expanded):  # a memfd bind, already read (ctlasync.recv)
        return data.result()
    if msg_flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) > MAX_MESSAGE:
        raise ValueError(f"message larger than {MAX_MESSAGE} bytes or with more than {MAX_FDS} fds")
    try:
        msg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("message is not JSON") from None
    if not isinstance(msg, dict):
        raise ValueError("message is not a JSON object")
    return msg


close_fds = specfd.close_fds


# ---- the client -----------------------------------------------------------------------------


class ControlClient:
    """A blocking client for one launcher: one connection, at most one binding, closed on exit."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def connect(cls, path: Path | str, timeout: float = 5.0) -> ControlClient:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except OSError as e:
            sock.close()
            raise ControlError(f"cannot reach the sandgate daemon at {path}: {e.strerror or e}") from None
        return cls(sock)

    def bind(self, spec: BindingSpec, fds: Sequence[int]) -> None:
        """Hand one sandbox to the daemon; `fds` in BIND_FDS order. The caller may close its copies after."""
        if len(fds) != len(BIND_FDS):
            raise ControlError(f"bind needs {len(BIND_FDS)} fds ({', '.join(BIND_FDS)}), got {len(fds)}")
        msg, spec_fd = specfd.bind_request(spec)  # no size limit of one message: 10^5 names are megabytes
        with open(spec_fd, "rb", closefd=True):  # closed once sent, whatever the answer
            self._request(msg, [*fds, spec_fd])

    def end(self) -> None:
        self._request({"op": "end"})

    def status(self) -> Status:
        try:
            return parse_status(self._request({"op": "status"}))
        except ValueError as e:
            raise ControlError(str(e)) from None

    def stop(self, if_idle: bool = False) -> bool:
        """Stop the daemon; with `if_idle`, only if no other launcher is connected. True if it stops."""
        return (
            self._request({"op": "stop", "if_idle": True} if if_idle else {"op": "stop"}).get("stopped", True) is True
        )

    def fileno(self) -> int:
        """Readable with no request outstanding means the daemon closed the connection (it died)."""
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _request(self, msg: Mapping[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        try:
            send_message(self._sock, msg, fds)
            data, got, flags = recv_raw(self._sock)
        except (OSError, ValueError) as e:
            raise ControlError(f"the sandgate daemon did not answer {msg.get('op')!r}: {e}") from None
        close_fds(got)  # replies never carry fds; one that does must not leak them into the launcher
        if not data and not flags:
            raise ControlError(f"the sandgate daemon closed the connection during {msg.get('op')!r}")
        try:
            reply = parse_message(data, flags)
        except ValueError as e:
            raise ControlError(f"malformed reply from the sandgate daemon: {e}") from None
        if reply.get("ok") is not True:
            raise ControlError(str(reply.get("error") or "the sandgate daemon refused the request"))
        return reply


# ---- where the socket lives -----------------------------------------------------------------


def socket_path(runtime_dir: Path) -> Path:
    """The daemon socket for this network namespace and this code (netguard.daemon.daemonpath.socket_path)."""
    return Path(daemonpath.socket_path(str(runtime_dir)))


def runtime_base(environ: Mapping[str, str], uid: int) -> Path:
    """Where the runtime directory should be, before any check of it (daemonpath.runtime_base)."""
    return Path(daemonpath.runtime_base(environ, uid))


def private_dir(path: Path, uid: int | None = None) -> Path:
    """`path` as a directory only `uid` can use, created 0700 if missing (daemonpath.private_dir)."""
    return Path(daemonpath.private_dir(str(path), uid))


def runtime_dir() -> Path:
    """$XDG_RUNTIME_DIR/sandgate, else /run/sandgate for root, else /tmp/sandgate-<uid>; checked, 0700."""
    return Path(daemonpath.runtime_dir())


# ---- the daemon's side: its socket, its peers, the fds it is handed -------------------------


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED), as the kernel saw it at connect()."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


# ---- passed descriptors -------------------------------------------------------------------


class BindError(Exception):
    """A bind the daemon will not take; the text goes back to the launcher."""


@dataclass
class PassedFds:
    """A checked bind's descriptors, owned by whoever holds this."""

    audit: int
    regular: socket.socket
    transparent: socket.socket
    dns_udp: socket.socket
    dns_tcp: socket.socket


def adopt_fds(fds: list[int]) -> PassedFds:
    """Check and take ownership of a bind's fds; on any problem all of them are closed and BindError raised.

    A wrong descriptor must be refused, not served: a non-listening socket handed to asyncio would
    be made to listen (autobinding a random port), a non-append fd could overwrite the log.
    """
    if len(fds) != len(BIND_FDS):
        close_fds(fds)
        raise BindError(f"bind needs {len(BIND_FDS)} fds ({', '.join(BIND_FDS)}), got {len(fds)}")
    owned: list[socket.socket] = []
    try:
        _check_audit(fds[0])
        inodes = set()
        for name, fd, kind in zip(
            BIND_FDS[1:], fds[1:], (socket.SOCK_STREAM,) * 2 + (socket.SOCK_DGRAM, socket.SOCK_STREAM), strict=True
        ):
            st = os.fstat(fd)
            if not stat.S_ISSOCK(st.st_mode):
                raise BindError(f"{name} fd is not a socket")
            inodes.add(st.st_ino)
            s = socket.socket(fileno=fd)
            owned.append(s)
            _check_socket(name, s, kind)
        if len(inodes) != 4:
            raise BindError("the same socket was passed twice")
    except (BindError, OSError) as e:
        for s in owned:
            s.close()
        close_fds([fds[0], *fds[1 + len(owned) :]])  # the rest belong to the closed socket objects
        raise e if isinstance(e, BindError) else BindError(f"cannot inspect a passed fd: {e}") from None
    return PassedFds(fds[0], *owned)


def _check_audit(fd: int) -> None:
    st = os.fstat(fd)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if not stat.S_ISREG(st.st_mode):
        raise BindError("audit fd is not a regular file")
    if not flags & os.O_APPEND or flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise BindError("audit fd must be open for writing with O_APPEND")


def _check_socket(name: str, s: socket.socket, kind: int) -> None:
    if s.family not in (socket.AF_INET, socket.AF_INET6):
        raise BindError(f"{name} fd is not an IPv4/IPv6 socket")
    if s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) != kind:
        raise BindError(f"{name} fd is not a {'TCP' if kind == socket.SOCK_STREAM else 'UDP'} socket")
    if kind == socket.SOCK_STREAM and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise BindError(f"{name} fd is not a listening socket")
    if kind == socket.SOCK_DGRAM and s.getsockname()[1] == 0:
        raise BindError(f"{name} fd is not bound")
