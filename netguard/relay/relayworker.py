"""A relay worker: a process of the daemon that splices flows it is handed, so that no one process
needs more fds than its hard limit allows (10,000 spliced flows are 20,000 sockets), and big
transfers get another core.

    python -I -S -c '...relayworker.main()' FD PARENT_PID   (started by netguard.relay.relaypool only)

It imports the stdlib and the splice relay only (no mitmproxy, no policy): it never decides
anything, it moves bytes between two sockets the daemon already decided on, and says how many.
It dies with the daemon twice over: PR_SET_PDEATHSIG (SIGKILL) and EOF on its control socket. Its
death closes every socket it holds: the flows end at both ends (fail closed), nothing outlives it.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import signal
import socket
import sys

from netguard.relay import nofile, relaywire, splice
from netguard.relay.seqchannel import Channel

PR_SET_PDEATHSIG = 1
RESERVE = 2 * splice.PIPES_MAX + 64  # its pipes, the control socket, the interpreter's own


def capacity(soft: int) -> int:
    """Flows a worker can hold under an fd limit of `soft`: two sockets each, past its reserve."""
    return max(0, (soft - RESERVE) // 2)


class Worker:
    """The flows of this process by id; reports each one's end, batched once per loop round."""

    def __init__(self, sock: socket.socket) -> None:
        self.pairs: dict[int, splice.Pair] = {}
        self._ended: list[relaywire.Ended] = []
        self.gone = asyncio.Event()
        self.chan = Channel(sock, self._message, self.gone.set)

    def _message(self, data: bytes, fds: list[int]) -> None:
        try:
            m = relaywire.decode(data)
        except relaywire.WireError:
            m = None
        if isinstance(m, relaywire.Add) and len(fds) == 2 and m.flow not in self.pairs:
            self.pairs[m.flow] = splice.Pair(fds[0], fds[1], functools.partial(self._done, m.flow), m.idle)
            self.pairs[m.flow].start()
            return
        for fd in fds:  # a flow we cannot take is closed: both its ends see it go
            os.close(fd)
        if isinstance(m, relaywire.Cut):
            for flow in m.flows:
                if flow in self.pairs:
                    self.pairs[flow].cut(m.why)
        elif not isinstance(m, relaywire.Add):
            self.gone.set()  # not our daemon speaking: stop, every flow goes with us

    def _done(self, flow: int, why: str | None) -> None:
        pair = self.pairs.pop(flow, None)
        if pair is None:
            return
        if not self._ended:
            asyncio.get_running_loop().call_soon(self._report)
        self._ended.append(relaywire.Ended(flow, pair.up, pair.down, why))

    def _report(self) -> None:
        ended, self._ended = self._ended, []
        for data in relaywire.batches(relaywire.Done(tuple(ended))):
            self.chan.send(data)

    def cut_all(self) -> None:
        for pair in list(self.pairs.values()):
            pair.cut("relay worker stopped")


async def serve(fd: int) -> None:
    """Relay until the daemon closes its end (or dies)."""
    sock = socket.socket(fileno=fd)
    w = Worker(sock)
    w.chan.send(relaywire.encode(relaywire.Hello(capacity(nofile.raise_nofile()))))
    await w.gone.wait()
    w.cut_all()
    w.chan.close()


def die_with(parent: int) -> None:
    """SIGKILL when the daemon dies; exit now if it already did (the race before the prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fd, parent = int(args[0]), int(args[1])
    die_with(parent)
    for sig in (signal.SIGINT, signal.SIGTERM):
        # ^C or a stop sent to the whole process group: the daemon first cuts its flows with their close
        # records, then its exit ends us (EOF). Dying first would leave those records without their counts.
        signal.signal(sig, signal.SIG_IGN)
    asyncio.run(serve(fd))
    return 0
