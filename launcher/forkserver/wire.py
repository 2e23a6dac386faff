"""The fork server's messages (SOCK_SEQPACKET: one message each, descriptors beside the first).

  caller -> server   the request: NUL-separated strings (MAGIC, key, directory, umask in octal, tty 0/1,
                     the number of arguments, the arguments, NAME=VALUE of the environment), with the
                     caller's fds 0, 1, 2, an O_PATH descriptor of its directory and (tty) its terminal
  server -> caller   b"P" + pid, with a pidfd of the worker: the run started; signals go to the pidfd
                     b"R": refused before anything ran (the caller takes the full path)
  worker -> caller   b"X" + exit code: the run's status, written just before the worker exits
  server -> caller   b"K" + signal number: the worker died of it before it reported

Strings, not marshal or pickle: a length field in five bytes must not make the server allocate a
gigabyte; argv and the environment cannot hold a NUL. Pure functions: the decoder is the server's
one check of what it was sent.
"""

from __future__ import annotations

import sys

MAX_REQUEST = 256 * 1024  # argv and environment; a caller with more takes the full path
FDS = 4  # 0, 1, 2 and the directory; a fifth when the caller passes its terminal
MAGIC = "sandgate-fork-1"
STOP = f"{MAGIC}\0stop".encode()  # `sandgate daemon stop`: take no more runs
_HEAD = 6  # MAGIC, key, cwd, umask, tty, argc


class WireError(Exception):
    """A malformed message: the server refuses it, the caller takes the full path."""


class Request:
    """What a caller asks (a plain class: the console script imports this module, and dataclasses is ~2 ms)."""

    __slots__ = ("argv", "cwd", "env", "key", "tty", "umask")

    def __init__(self, key: str, argv: list[str], cwd: str, env: dict[str, str], umask: int, tty: bool) -> None:
        self.key, self.argv, self.cwd, self.env, self.umask, self.tty = key, argv, cwd, env, umask, tty

    def encode(self) -> bytes:
        head = [MAGIC, self.key, self.cwd, f"{self.umask:o}", "1" if self.tty else "0", str(len(self.argv))]
        fields = head + self.argv + [f"{k}={v}" for k, v in self.env.items()]
        return "\0".join(fields).encode("utf-8", "surrogateescape")  # os.environ's own way with stray bytes


def decode(data: bytes, nfds: int) -> Request | str:
    """The request, checked field by field; or "stop"."""
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    if fields[0] != MAGIC:
        raise WireError("not a version 1 request")
    if fields[1:] == ["stop"] and nfds == 0:
        return "stop"
    if len(fields) < _HEAD or not fields[5].isdigit() or len(fields) < _HEAD + int(fields[5]):
        raise WireError("truncated request")
    key, cwd, umask, tty = fields[1:5]
    argv, env = fields[_HEAD : _HEAD + int(fields[5])], fields[_HEAD + int(fields[5]) :]
    if argv[1:2] != ["run"]:
        raise WireError("only `sandgate run` is served")
    if not cwd.startswith("/") or tty not in ("0", "1") or not 0 < len(umask) <= 3 or set(umask) - set("01234567"):
        raise WireError("bad directory, umask or tty")
    if not all("=" in e for e in env):
        raise WireError("bad environment")
    if nfds != FDS + (tty == "1"):
        raise WireError(f"expected {FDS + (tty == '1')} descriptors, got {nfds}")
    return Request(key, argv, cwd, dict(e.split("=", 1) for e in env), int(umask, 8), tty == "1")


def pack_fds(fds: list[int]) -> bytes:
    """SCM_RIGHTS data for `fds` (int32 each; not array: one shared library less for a served run)."""
    return b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)


def unpack_fds(anc: list[tuple[int, int, bytes]], rights: tuple[int, int]) -> list[int]:
    """The descriptors of recvmsg's ancillary data; `rights` is (SOL_SOCKET, SCM_RIGHTS)."""
    out: list[int] = []
    for level, kind, raw in anc:
        if (level, kind) == rights:
            out += [int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True) for i in range(0, len(raw) - 3, 4)]
    return out


def frame(kind: bytes, value: int | str) -> bytes:
    return kind + str(value).encode()


def unframe(data: bytes) -> tuple[bytes, str]:
    """(kind, value) of a reply; (b"", "") at end of stream."""
    return data[:1], data[1:].decode(errors="replace")
