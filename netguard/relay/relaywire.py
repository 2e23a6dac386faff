"""The messages between the daemon and its relay workers (netguard.relay.relaypool, relayworker): pure.

One message per SOCK_SEQPACKET datagram, a tag byte then fixed big-endian fields:
  H  worker -> daemon  ready; how many flows it can hold (its fd limit, less its reserve, over two)
  A  daemon -> worker  take a flow: its id and idle timeout; the datagram carries its two sockets
  C  daemon -> worker  cut these flows (a sandbox's drop, the daemon's exit), and why
  D  worker -> daemon  these flows ended: id, bytes up, bytes down delivered, why (none: a clean end)
Anything else, or a field that does not add up, is a WireError: the daemon treats the worker as dead
(its flows end), never guesses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_DATAGRAM = 60 * 1024  # well below the AF_UNIX send buffer: one message never blocks half-sent
_HELLO = struct.Struct("!cQ")
_ADD = struct.Struct("!cQd")
_CUT = struct.Struct("!cHH")  # tag, why length, count of flow ids
_ENDED = struct.Struct("!QQQH")  # id, up, down, why length + 1 (0: None)
_ID = struct.Struct("!Q")
_WHY_MAX = 200  # a why is a short reason text: longer ones are cut, so a batch's size stays known


class WireError(ValueError):
    """A datagram that is not one of ours."""


@dataclass(frozen=True)
class Hello:
    capacity: int


@dataclass(frozen=True)
class Add:
    flow: int
    idle: float  # seconds without a byte either way, 0: none (tcp_timeout)


@dataclass(frozen=True)
class Cut:
    flows: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class Ended:
    flow: int
    up: int
    down: int
    why: str | None


@dataclass(frozen=True)
class Done:
    ended: tuple[Ended, ...]


Message = Hello | Add | Cut | Done
CUT_BATCH = (MAX_DATAGRAM - _CUT.size - _WHY_MAX * 4) // _ID.size  # ids per Cut datagram
DONE_BATCH = (MAX_DATAGRAM - 1) // (_ENDED.size + _WHY_MAX * 4)  # records per Done datagram


def _why(text: str) -> bytes:
    return text[:_WHY_MAX].encode("utf-8", "replace")


def encode(m: Message) -> bytes:
    """One datagram; a Cut or Done longer than a batch is split by the caller (`batches`)."""
    if isinstance(m, Hello):
        return _HELLO.pack(b"H", m.capacity)
    if isinstance(m, Add):
        return _ADD.pack(b"A", m.flow, m.idle)
    if isinstance(m, Cut):
        why = _why(m.why)
        return _CUT.pack(b"C", len(why), len(m.flows)) + why + b"".join(_ID.pack(f) for f in m.flows)
    out = [b"D"]
    for e in m.ended:
        why = b"" if e.why is None else _why(e.why)
        out += [_ENDED.pack(e.flow, e.up, e.down, 0 if e.why is None else len(why) + 1), why]
    return b"".join(out)


def batches(m: Cut | Done) -> list[bytes]:
    """`m` as datagrams of at most MAX_DATAGRAM bytes each."""
    if isinstance(m, Cut):
        return [encode(Cut(m.flows[i : i + CUT_BATCH], m.why)) for i in range(0, len(m.flows), CUT_BATCH)]
    return [encode(Done(m.ended[i : i + DONE_BATCH])) for i in range(0, len(m.ended), DONE_BATCH)]


def decode(data: bytes) -> Message:
    """The message in one datagram; WireError if it is not exactly one well-formed message."""
    try:
        tag = data[:1]
        if tag == b"H" and len(data) == _HELLO.size:
            return Hello(_HELLO.unpack(data)[1])
        if tag == b"A" and len(data) == _ADD.size:
            _, flow, idle = _ADD.unpack(data)
            return Add(flow, idle)
        if tag == b"C":
            _, n_why, n = _CUT.unpack_from(data)
            start = _CUT.size + n_why
            if len(data) != start + n * _ID.size:
                raise WireError("cut: length does not match its count")
            ids = tuple(_ID.unpack_from(data, start + i * _ID.size)[0] for i in range(n))
            return Cut(ids, data[_CUT.size : start].decode("utf-8", "replace"))
        if tag == b"D":
            return Done(_ended(data))
    except struct.error as e:
        raise WireError(f"truncated message: {e}") from None
    raise WireError(f"unknown message (tag {tag!r}, {len(data)} bytes)")


def _ended(data: bytes) -> tuple[Ended, ...]:
    out: list[Ended] = []
    at = 1
    while at < len(data):
        flow, up, down, n_why = _ENDED.unpack_from(data, at)
        at += _ENDED.size
        why = None if n_why == 0 else data[at : at + n_why - 1].decode("utf-8", "replace")
        at += max(0, n_why - 1)
        if at > len(data):
            raise WireError("done: a why runs past the end")
        out.append(Ended(flow, up, down, why))
    return tuple(out)
