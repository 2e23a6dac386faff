"""The daemon's relay workers (netguard.relay.relayworker): where spliced flows go, so the daemon holds none of their fds.

A flow handed off (netguard.relay.handoff) is placed on the ready worker holding the fewest flows,
its two sockets sent over SCM_RIGHTS and our copies closed once sent; the worker reports its end
(bytes both ways, why), from which the Gate writes the close record as for an in-process splice.
`place` returns None when no worker can take it (none started yet, all full, none can be started):
the caller then splices in-process, as before workers existed.

Fail closed: a worker that dies (EOF on its socket) took its flows' sockets with it; each of its
flows ends with "relay worker died". Workers die with the daemon (PR_SET_PDEATHSIG and the EOF).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from netguard.relay import relaywire

INITIAL = min(2, os.cpu_count() or 1)  # started together (LAZY): a second core for big transfers
MAX_WORKERS = 8  # more only when the others are three quarters full (each holds ~10,000 flows here)
RESPAWN = 1.0  # seconds between starts after a failure or a death: a crashing worker must not spin
#: Seconds after the first flow finds no worker before the workers start: their start (~50 ms of CPU each)
#: would otherwise run beside a cold start's first run, its command and its teardown, on the same cores;
#: meanwhile flows splice in-process, as they do whenever no worker can take them.
LAZY = 0.5
_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the netguard package


def boot(root: str) -> str:
    """Python code that imports the netguard package under `root` by its path, never putting `root` on sys.path.

    When sandgate runs from a checkout, `root` is the checkout, which a sandbox may write (only the packages
    in it are protected: launcher/run/configfiles.py); an `asyncio.py` planted there would otherwise run in
    the worker, outside every sandbox. Every other import comes from the standard library alone (-I -S)."""
    package = os.path.join(root, "netguard")
    return (
        "import importlib.util, sys; "
        f"s = importlib.util.spec_from_file_location('netguard', {os.path.join(package, '__init__.py')!r}, "
        f"submodule_search_locations=[{package!r}]); "
        "m = importlib.util.module_from_spec(s); sys.modules['netguard'] = m; s.loader.exec_module(m); "
    )


_CODE = boot(_ROOT) + "from netguard.relay import relayworker; relayworker.main()"

OnDone = Callable[[str | None], None]


class Moved:
    """One flow in a worker: `cut` asks the worker to end it; `on_done` runs once, after `up`/`down` are set."""

    def __init__(self, flow: int, worker: _Worker, on_done: OnDone) -> None:
        self.flow, self.worker = flow, worker
        self.up = self.down = 0
        self.closed = False
        self._on_done: OnDone | None = on_done

    def cut(self, why: str | None = None) -> None:
        if not self.closed:
            self.worker.cut(self.flow, why or "cut")

    def ended(self, up: int, down: int, why: str | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.up, self.down = up, down
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(why)


class _Worker:
    def __init__(self, pool: Pool, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        from netguard.relay.seqchannel import Channel

        self.pool, self.proc = pool, proc
        self.capacity = 0  # until its Hello: not used before it proved it runs
        self.hello = False
        self.flows: dict[int, Moved] = {}
        self._cuts: dict[str, list[int]] = {}
        self.chan = Channel(sock, self._message, self._died)

    def _message(self, data: bytes, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)  # a worker never sends fds
        try:
            m = relaywire.decode(data)
        except relaywire.WireError:
            self.proc.kill()  # not speaking our wire: its flows must not be counted on
            self.chan.close()
            self._died()
            return
        if isinstance(m, relaywire.Hello):
            self.capacity, self.hello = m.capacity, True
        elif isinstance(m, relaywire.Done):
            for e in m.ended:
                if (moved := self.flows.pop(e.flow, None)) is not None:
                    moved.ended(e.up, e.down, e.why)

    def cut(self, flow: int, why: str) -> None:
        if not self._cuts:
            asyncio.get_running_loop().call_soon(self._send_cuts)  # one datagram per drop, not per flow
        self._cuts.setdefault(why, []).append(flow)

    def _send_cuts(self) -> None:
        cuts, self._cuts = self._cuts, {}
        for why, flows in cuts.items():
            for data in relaywire.batches(relaywire.Cut(tuple(flows), why)):
                self.chan.send(data)

    def _died(self) -> None:
        self.pool.gone(self)
        self.chan.close()
        self.proc.kill()  # without its socket no end is reported: a worker still relaying would be unrecorded
        self._reap()
        flows, self.flows = self.flows, {}
        for moved in flows.values():
            moved.ended(0, 0, "relay worker died")  # its sockets closed with it: both ends saw the end

    def _reap(self) -> None:
        if self.proc.poll() is None:  # never wait() on the loop: a long-lived daemon leaves no zombie either
            asyncio.get_running_loop().call_later(0.2, self._reap)

    def stop(self) -> None:
        """Close our end: the worker cuts what it holds and exits."""
        self.chan.close()


class Pool:
    """The workers of this process (one per event loop: `pool()`)."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []
        self.away = 0  # flows in workers: fds this process does not hold (the daemon's netguard.daemon.fdlimit.Budget)
        self._next = 1
        self._after = 0.0  # no start before this (monotonic)
        self._later: asyncio.TimerHandle | None = None  # the start LAZY seconds after a flow found no worker

    def start(self, n: int = INITIAL) -> None:
        while len(self.workers) < n and self._spawn():
            pass

    def soon(self) -> None:
        """Start the workers LAZY seconds from now, if none is there or on its way."""
        if not self.workers and self._later is None:
            self._later = asyncio.get_running_loop().call_later(LAZY, self._start_later)

    def _start_later(self) -> None:
        self._later = None
        self.start()

    def _spawn(self) -> bool:
        if time.monotonic() < self._after or len(self.workers) >= MAX_WORKERS:
            return False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CODE, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as e:
            ours.close()
            self._after = time.monotonic() + RESPAWN
            print(f"sandgated: cannot start a relay worker: {e}; splicing in this process", file=sys.stderr)
            return False
        finally:
            theirs.close()
        self.workers.append(_Worker(self, proc, ours))
        return True

    def gone(self, w: _Worker) -> None:
        if w in self.workers:
            self.workers.remove(w)
            self._after = time.monotonic() + RESPAWN
            if w.flows:
                print(f"sandgated: relay worker {w.proc.pid} died; {len(w.flows)} flows cut", file=sys.stderr)

    def ready(self) -> bool:
        """A worker could take a flow now (`place` would not return None)."""
        return any(len(w.flows) < w.capacity and not w.chan.closed for w in self.workers)

    def place(self, a: int, b: int, idle: float, on_done: OnDone) -> Moved | None:
        """Send `a`, `b` to a worker (they are then closed here); None: nothing sent, they are still the caller's."""
        if not self.workers:
            self.soon()  # none yet: they come LAZY seconds from now, this flow stays with the caller
            return None
        ready = [w for w in self.workers if len(w.flows) < w.capacity and not w.chan.closed]
        starting = any(not w.hello for w in self.workers)
        if not starting and (not ready or min(len(w.flows) / w.capacity for w in ready) > 0.75):
            self._spawn()  # for the next flows: this one takes what is there now
        if not ready:
            return None
        w = min(ready, key=lambda w: len(w.flows))
        flow, self._next = self._next, self._next + 1
        moved = Moved(flow, w, lambda why: self._ended(on_done, why))
        w.flows[flow] = moved
        self.away += 1
        w.chan.send(relaywire.encode(relaywire.Add(flow, idle)), (a, b))
        return moved

    def _ended(self, on_done: OnDone, why: str | None) -> None:
        self.away -= 1
        on_done(why)

    def stop(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        for w in list(self.workers):
            w.stop()


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()


def pool() -> Pool:
    """The running loop's pool (one per loop: a worker's channel lives on the loop that made it)."""
    loop = asyncio.get_running_loop()
    p = _POOLS.get(loop)
    if p is None:
        p = _POOLS[loop] = Pool()
    return p
