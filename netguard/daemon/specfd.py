"""A bind's spec in a sealed memfd: no control message's size limit, and no change after the daemon read it.

The launcher writes the spec (netguard.daemon.specbytes) into a memfd, seals it against writing,
shrinking and growing, and sends it as one more SCM_RIGHTS fd beside the bind's five, with the small
message {"op": "bind", "spec": {"memfd": 5}}. The daemon refuses a memfd without those seals (the
launcher could otherwise change the spec between the daemon's check and its use) or larger than
MAX_BYTES, and closes the fd on every path. `expand` turns such a message into the bind it stands
for before serve.py sees it, so the daemon has one bind path.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netguard.spec import BindingSpec

#: Seals the daemon requires; the launcher adds F_SEAL_SEAL too, so no seal can be changed after.
REQUIRED = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
MAX_BYTES = 128 << 20  # a million names with their origins is ~60 MiB
INLINE_BYTES = 64 << 10  # ~2,000 rules decode in a few ms; larger specs are read off the event loop
MEMFD_INDEX = 5  # after the bind's audit, regular, transparent, dns_udp and dns_tcp fds (control.BIND_FDS)


class SpecFdError(Exception):
    """A spec fd the daemon will not read; one sentence for the launcher."""


class Expanded(bytes):
    """A received message already decoded by `expand` (control.parse_message returns `message`, or raises `error`)."""

    message: dict[str, Any]
    error: str | None

    def result(self) -> dict[str, Any]:
        """The message it stands for; ValueError (with the reply's text) if it could not be read."""
        if self.error is not None:
            raise ValueError(self.error)
        return self.message


def bind_request(spec: BindingSpec) -> tuple[dict[str, Any], int]:
    """The bind message for `spec` and the sealed memfd to send after the five bind fds (caller closes it)."""
    from netguard.daemon.specbytes import to_bytes

    return {"op": "bind", "spec": {"memfd": MEMFD_INDEX}}, sealed(to_bytes(spec))


def sealed(data: bytes) -> int:
    """A close-on-exec memfd holding `data`, sealed for good; the caller closes it once sent."""
    fd = os.memfd_create("sandgate-spec", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_sealed(fd: int, limit: int = MAX_BYTES) -> bytes:
    """The contents of a passed memfd, checked sealed and at most `limit` bytes; `fd` is closed in every case."""
    try:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise SpecFdError("the spec fd is not a memfd") from None
        if seals & REQUIRED != REQUIRED:
            # Unsealed, the launcher could rewrite the spec after the daemon checked it.
            raise SpecFdError("the spec memfd is not sealed against writing, shrinking and growing")
        size = os.fstat(fd).st_size  # fixed from here on: the seals forbid shrinking and growing
        if size > limit:
            raise SpecFdError(f"the spec is {size} bytes, more than the {limit} a bind may carry")
        chunks, got = [], 0
        while got < size:
            chunk = os.pread(fd, size - got, got)
            if not chunk:
                raise SpecFdError("the spec memfd ended early")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise SpecFdError(f"cannot read the spec memfd: {e.strerror or e}") from None
    finally:
        os.close(fd)


def names_memfd(data: bytes, fds: list[int]) -> bool:
    """Whether a received message is a bind whose spec travels in a memfd (cheap: such a message is tiny)."""
    return bool(fds) and len(data) < 256 and b'"memfd"' in data


def small(fd: int) -> bool:
    """Whether a spec fd is small enough to read and decode on the event loop (its seals are checked later)."""
    try:
        return os.fstat(fd).st_size <= INLINE_BYTES
    except OSError:
        return True  # expand refuses it at once


def expand(data: bytes, fds: list[int], flags: int) -> tuple[bytes, list[int], int]:
    """A memfd bind as the bind it stands for (an Expanded), its memfd read and closed; anything else unchanged.

    Decoding a new big policy takes a while: the daemon runs this off its event loop.
    """
    if flags:  # truncated: control.parse_message refuses it (and the caller closes its fds)
        return data, fds, flags
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        return data, fds, flags
    spec = msg.get("spec") if isinstance(msg, dict) else None
    if not isinstance(spec, dict) or "memfd" not in spec or msg.get("op") != "bind":
        return data, fds, flags
    if spec != {"memfd": MEMFD_INDEX} or set(msg) != {"op", "spec"} or len(fds) != MEMFD_INDEX + 1:
        close_fds(fds)
        return (
            _failed(data, f"a memfd bind carries {MEMFD_INDEX} fds and then the memfd, named by index {MEMFD_INDEX}"),
            [],
            flags,
        )
    from netguard.daemon.policycache import CACHE  # the daemon's: the launcher never expands
    from netguard.daemon.specbytes import split_bytes
    from netguard.spec import Received, SpecError

    rest = fds[:MEMFD_INDEX]
    try:
        header, policy = split_bytes(read_sealed(fds[MEMFD_INDEX]))
        received = Received(header, CACHE.policy(policy))
    except (SpecFdError, SpecError) as e:
        close_fds(rest)
        return _failed(data, f"invalid spec: {e}"), [], flags
    except BaseException:
        close_fds(rest)  # whatever went wrong, a long-lived daemon keeps no fd of this bind
        raise
    out = Expanded(data)
    out.message, out.error = {"op": "bind", "spec": received}, None
    return out, rest, flags


def _failed(data: bytes, error: str) -> Expanded:
    out = Expanded(data)
    out.message, out.error = {}, error
    return out


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
