"""sandgated: one long-lived proxy per user and network namespace, serving many sandboxes.

    python -m netguard.daemon --socket PATH [--ready-fd N] [--idle-exit SECONDS]   (see __main__.py)

Launchers connect to PATH (AF_UNIX SOCK_SEQPACKET, see netguard.daemon.control) and hand over, per
sandbox, listeners that were created inside the sandbox's network namespace plus its audit
log. The daemon accepts on them and connects upstream from its own namespace. A binding lives
as long as its control connection; if the daemon dies, every passed listener dies with it, so
sandboxes fail closed. The daemon opens no path for a sandbox: it writes only its socket, its
lock file and the audit descriptors it was given.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netguard.daemon import ctlasync, peercheck
from netguard.daemon.control import (
    BindError,
    DaemonSocket,
    PassedFds,
    adopt_fds,
    close_fds,
    parse_message,
    send_message,
)
from netguard.decision import limits, trim
from netguard.spec import BindingSpec, SpecError, decode

if TYPE_CHECKING:  # imported lazily: the control/lock logic runs before mitmproxy's import cost
    from netguard.daemon.fdlimit import Budget
    from netguard.daemon.frontdoor import FrontDoor
    from netguard.decision.binding import Binding
    from netguard.decision.dns import DnsGate, DnsService

MAX_SLOT = 65535  # slots are listen ports in mitmproxy mode specs, which must be valid ports
REFUSING_MAX = 16  # refused control peers being told why at once
BACKLOG = 4096  # asyncio re-runs listen() on a passed socket: keep the queue the launcher sized for a cold start


def log(line: str) -> None:
    """One line to stderr (the launcher points it at the daemon's log file)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} sandgated[{os.getpid()}]: {line}", file=sys.stderr, flush=True)


# ---- one sandbox ------------------------------------------------------------------------------


@dataclass
class Sandbox:
    """What the daemon holds for one bound sandbox, all of it released by `Daemon.drop`."""

    task: str
    binding: Binding
    slots: tuple[int, int]
    since: str  # RFC 3339, as in the audit log
    doors: list[FrontDoor] = field(default_factory=list)  # the regular and transparent listeners
    dns: list[DnsService] = field(default_factory=list)
    conns: dict[asyncio.Task[Any], asyncio.StreamWriter] = field(default_factory=dict)
    budget: Budget | None = None  # the daemon's, shared by every sandbox
    share: limits.Share = field(default_factory=lambda: limits.Share())  # this sandbox's part of it
    counted: bool = False  # in budget.sandboxes (released once)

    def tracked(self, handler: Any, budgeted: bool = True) -> Any:
        """Wrap a stream handler so `drop` can cut this sandbox's open connections.

        `budgeted`: the connection counts against the fd budget (the front door counted it already)."""
        budget = self.budget if budgeted else None

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if budget is not None and not budget.take():
                writer.transport.abort()  # out of fds soon: refuse this one, never let accept() meet EMFILE
                return
            task = asyncio.current_task()
            assert task is not None
            self.conns[task] = writer
            try:
                await handler(reader, writer)
            finally:
                self.conns.pop(task, None)
                if budget is not None:
                    budget.give()

        return handle


@dataclass
class Peer:
    sock: socket.socket
    sandbox: Sandbox | None = None


# ---- the daemon -------------------------------------------------------------------------------


class Daemon:
    """The control loop around one mitmproxy master; every sandbox is a Peer's binding."""

    def __init__(self, listener: DaemonSocket, idle_exit: float) -> None:
        self.listener = listener
        self.idle_exit = idle_exit
        self.started = time.monotonic()
        self.bindings: dict[int, Binding] = {}  # slot -> sandbox, shared with the Gate addon
        self.peers: dict[int, Peer] = {}  # id(peer) -> peer
        self.stopping = asyncio.Event()
        self._next_slot = 1
        self._idle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing: set[asyncio.Task[None]] = set()
        self.namespaces = peercheck.own_namespaces()  # who may talk to us: launchers in these (issue 22)

    async def run(self, ready_fd: int | None) -> None:
        # What serves a bound sandbox's first connections, none of it mitmproxy: a cold daemon is ready once these
        # are imported, mitmproxy loads beside it (mitmload); here, so the two threads never import one module.
        from netguard.daemon import fdlimit, frontdoor, mitmload  # noqa: F401
        from netguard.decision import decide, dns
        from netguard.relay import nofile, relaypool

        nofile.raise_nofile()  # before the relay workers start: they inherit it
        self.budget = fdlimit.Budget(resource.getrlimit(resource.RLIMIT_NOFILE)[0], lambda: relaypool.pool().away)
        self.dnsgate: DnsGate = dns.DnsGate()
        # The relay workers boot once mitmproxy is loaded: on a cold start they would take the CPU the first
        # run needs (until then the front door relays in-process, as when no worker is up).
        self.mitm = mitmload.Mitm(self.bindings, decide.Decider(), self._stop, relaypool.pool().start)
        self.mitm.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, signal.Signals(sig).name)
        assert self.listener.sock is not None
        lfd = self.listener.sock.fileno()
        self.listener.sock.setblocking(False)
        loop.add_reader(lfd, self._accept)
        ctlasync.report_ready(ready_fd)
        log(f"ready on {self.listener.path}")
        self._arm_idle()
        try:
            await self.stopping.wait()
        finally:
            loop.remove_reader(lfd)
            self.listener.release()  # first: no new launcher may reach a daemon that is going away
            for peer in list(self.peers.values()):
                await self.drop(peer, "daemon exit")
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.mitm.done()

    def _stop(self, why: str) -> None:
        if not self.stopping.is_set():
            log(f"exiting ({why})")
            self.stopping.set()

    def _arm_idle(self) -> None:
        # Idle: no control connection at all (every binding has one): a launcher just connected keeps its bind.
        if self.idle_exit > 0 and not self.peers and self._idle is None and not self.stopping.is_set():
            self._idle = asyncio.get_running_loop().call_later(self.idle_exit, self._stop, "idle")

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    # ---- control connections ------------------------------------------------------------

    def _accept(self) -> None:
        assert self.listener.sock is not None
        try:
            conn, _ = self.listener.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # EMFILE and friends: pause instead of spinning on a readable listener
            log(f"accept failed: {e}; pausing for a second")
            loop = asyncio.get_running_loop()
            loop.remove_reader(self.listener.sock.fileno())
            loop.call_later(1.0, self._resume_accept)
            return
        conn.setblocking(False)
        why = peercheck.refusal(conn, self.namespaces)
        if why is not None:
            log(f"refused a control connection: {why}")
            if len(self._refusing) < REFUSING_MAX:  # else no answer at all: a flood costs a close each
                task = asyncio.get_running_loop().create_task(ctlasync.refuse(conn, why))
                self._refusing.add(task)
                task.add_done_callback(self._refusing.discard)
            else:
                conn.close()
            return
        peer = Peer(conn)
        self.peers[id(peer)] = peer
        self._disarm_idle()
        task = asyncio.get_running_loop().create_task(self._serve_peer(peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _resume_accept(self) -> None:
        if self.listener.sock is not None and not self.stopping.is_set():
            asyncio.get_running_loop().add_reader(self.listener.sock.fileno(), self._accept)

    async def _serve_peer(self, peer: Peer) -> None:
        try:
            while not self.stopping.is_set():
                data, fds, flags = await ctlasync.recv(peer.sock)
                if not data and not fds and not flags:
                    break  # EOF: the launcher exited or was killed; its sandbox goes with it
                reply, stop = await self._handle(peer, data, fds, flags)
                send_message(peer.sock, reply)  # BlockingIOError: a peer that never reads is dropped
                if stop:
                    self._stop("stop requested")
                    break
        except OSError:
            pass
        except Exception as e:
            log(f"control connection failed: {type(e).__name__}: {e}")
        finally:
            await self.drop(peer, "connection closed")
            peer.sock.close()
            self.peers.pop(id(peer), None)
            self._arm_idle()

    async def _handle(self, peer: Peer, data: bytes, fds: list[int], flags: int) -> tuple[dict[str, Any], bool]:
        try:
            msg = parse_message(data, flags)
        except ValueError as e:
            close_fds(fds)
            return ctlasync.err(str(e)), False
        op = msg.get("op")
        if op == "bind":
            return await self._bind(peer, msg, fds), False
        close_fds(fds)  # only a bind carries fds; stray ones must not pile up in a long-lived daemon
        if op not in ("end", "status", "stop"):
            return ctlasync.err(f"unknown op {op!r} (expected bind, end, status or stop)"), False
        allowed = {"op", "if_idle"} if op == "stop" else {"op"}
        if not set(msg) <= allowed:
            return ctlasync.err(f"unexpected keys in {op!r}: {', '.join(sorted(set(msg) - allowed))}"), False
        if op == "end":
            await self.drop(peer, "end")
            return {"ok": True}, False
        if op == "status":
            return {
                "ok": True,
                "pid": os.getpid(),
                "uptime": round(time.monotonic() - self.started, 3),
                "mitmproxy": self.mitm.state(),  # "loading" for the first second of a cold daemon
                "bindings": [
                    {"task": p.sandbox.task, "since": p.sandbox.since}
                    for p in self.peers.values()
                    if p.sandbox is not None
                ],
            }, False
        if msg.get("if_idle") is True and self._used_by_another(peer):
            return {"ok": True, "stopped": False}, False  # another launcher uses it (or is about to bind)
        return {"ok": True, "stopped": True}, True

    def _used_by_another(self, peer: Peer) -> bool:
        """Is another launcher connected? Those still in the listen queue count: they are taken first."""
        assert self.listener.sock is not None
        while select.select([self.listener.sock], [], [], 0)[0] and len(self.peers) < MAX_SLOT:
            before = len(self.peers)
            self._accept()
            if len(self.peers) == before:
                break  # refused (another namespace) or failed: nothing more to take now
        return any(p is not peer for p in self.peers.values())

    # ---- bindings -----------------------------------------------------------------------

    async def _bind(self, peer: Peer, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if set(msg) != {"op", "spec"}:
            close_fds(fds)
            return ctlasync.err("bind takes exactly the keys op and spec")
        if peer.sandbox is not None:
            close_fds(fds)
            return ctlasync.err("this connection already has a binding; use one connection per sandbox")
        try:
            spec = decode(msg["spec"])
        except SpecError as e:
            close_fds(fds)
            return ctlasync.err(f"invalid spec: {e}")
        try:
            passed = adopt_fds(fds)
        except BindError as e:
            return ctlasync.err(str(e))
        try:
            peer.sandbox = await self._start(spec.task, spec, passed)
        except Exception as e:
            log(f"bind of task {spec.task} failed: {type(e).__name__}: {e}")
            return ctlasync.err(f"cannot serve this sandbox: {e}")
        log(f"bind task={spec.task} slots={peer.sandbox.slots[0]},{peer.sandbox.slots[1]} ({self._count()} bindings)")
        return {"ok": True}

    async def _start(self, task: str, spec: BindingSpec, passed: PassedFds) -> Sandbox:
        from netguard import rules
        from netguard.asking import Approver
        from netguard.audit import now_rfc3339
        from netguard.daemon import otlpexport
        from netguard.daemon.frontdoor import FrontDoor, Mode
        from netguard.decision import dns
        from netguard.decision.binding import Binding

        audit = otlpexport.audit_log(passed.audit, spec.otlp, task)  # + the run's OTLP collector, if it set one
        refusals = limits.Refusals(task, audit.write)  # this sandbox's limits, in this sandbox's log
        approver = None
        if spec.approval_socket:
            asked = functools.partial(refusals.refuse, "questions", "approval")
            approver = Approver(spec.approval_socket, spec.ask_timeout, asked)
        binding = Binding(
            task,
            rules.compile_policy(spec.policy),
            audit,
            learn=spec.learn,
            ask_all=spec.ask_all,
            approver=approver,
            ca=spec.ca,
            upstream_ca=spec.upstream_ca,
            secrets=spec.secrets,
            refusals=refusals,
            upstream_proxy=spec.upstream_proxy,
        )
        sb = Sandbox(task, binding, (0, 0), since=now_rfc3339(), budget=self.budget)
        self.budget.sandboxes += 1  # the fair share divides the budget among the bound sandboxes
        sb.counted = True
        try:
            sb.slots = (self._slot(binding), self._slot(binding))
            listeners: tuple[tuple[int, Mode, socket.socket], ...] = (
                (sb.slots[0], "regular", passed.regular),
                (sb.slots[1], "transparent", passed.transparent),
            )
            for slot, mode, sock in listeners:
                # What the front door does not take: mitmproxy's, once it is loaded (netguard.daemon.mitmload).
                fallback = sb.tracked(self.mitm.handler(mode, slot), budgeted=False)
                door = FrontDoor(sock, slot, mode, self.bindings, self.mitm.decider, fallback, **self._door_args(sb))
                sb.doors.append(door)
                door.start(BACKLOG)
            sb.dns.append(await dns.serve_udp(passed.dns_udp, binding, self.dnsgate))
            sb.dns.append(await dns.serve_tcp(passed.dns_tcp, binding, self.dnsgate))
        except BaseException:
            await self._release(sb)
            for s in (passed.regular, passed.transparent, passed.dns_udp, passed.dns_tcp):
                s.close()
            raise
        return sb

    def _door_args(self, sb: Sandbox) -> dict[str, Any]:
        from netguard.daemon.mitmload import IDLE

        shares = {"budget": self.budget, "share": sb.share, "refusals": sb.binding.refusals}
        return {"idle": IDLE, "log": log, "tls": self.mitm.material, **shares}

    def _slot(self, binding: Binding) -> int:
        for _ in range(MAX_SLOT):
            slot, self._next_slot = self._next_slot, self._next_slot % MAX_SLOT + 1
            if slot not in self.bindings:
                self.bindings[slot] = binding
                return slot
        raise BindError("no free slot: too many sandboxes")

    async def drop(self, peer: Peer, why: str) -> None:
        sb, peer.sandbox = peer.sandbox, None
        if sb is None:
            return
        await self._release(sb)
        trim.trim()  # hand back the heap the dropped sandbox freed: other sandboxes must not carry it
        log(f"end task={sb.task} ({why}; {self._count()} bindings)")

    async def _release(self, sb: Sandbox) -> None:
        """Close the sandbox's listeners and connections, then its audit fd (never reused by a late write)."""
        for slot in sb.slots:
            if self.bindings.get(slot) is sb.binding:
                del self.bindings[slot]
        if sb.counted:
            self.budget.sandboxes -= 1
            sb.counted = False
        for door in sb.doors:
            door.close()
        for service in sb.dns:
            service.close()
        for writer in list(sb.conns.values()):
            writer.transport.abort()
        from netguard.relay import handoff  # spliced flows hold no transport here: cut them where they run

        handoff.cut_slots(sb.slots, "closed by the proxy")
        waits = [*sb.conns, *(f for door in sb.doors for f in (*door.relayed, *door.deciding))]
        if waits:  # let the cut connections write their close records
            await asyncio.wait(waits, timeout=2)
        if sb.binding.refusals is not None:
            sb.binding.refusals.flush()  # the counts still pending: the exit line reads them next
        sb.binding.audit.close()

    def _count(self) -> int:
        return sum(1 for p in self.peers.values() if p.sandbox is not None)
