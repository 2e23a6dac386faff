"""A fake WinDivert (pydivert's handle) and the transparent path's part of the fake WinApi.

FakeWinDivert keeps WinDivert 2.2's documented contract (https://reqrypt.org/windivert-doc.html):
opening needs Administrator; the SOCKET layer reports connect events with the process id and
cannot inject (send fails); recv on a closed handle fails (ERROR_INVALID_HANDLE); a closed NETWORK
handle no longer diverts, so packets leave unchanged (WinDivert fails open).

DivertFake (a base of tests.support.winfake.FakeWinApi) adds what the machine does with one TCP
connect (`tcp_connect`): the sandbox user's connect is refused by the persistent hard block unless
a live dynamic WFP session permits it (FWPM_SESSION_FLAG_DYNAMIC: its filters die with the session,
https://learn.microsoft.com/en-us/windows/win32/api/fwpmtypes/ns-fwpmtypes-fwpm_session0); a
permitted SYN goes to the NETWORK handle if one is open, else out unchanged, which is a violation
for the sandbox user (the fail-open window the design forbids); so is a sandbox-SID SYN the loop
passes unchanged (a process that escaped the job: the permits match the SID, not the job).

The loop's owner lookup follows the documented contracts. `owner_open` is
OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION) then OpenProcessToken + TokenUser through that
handle: a process that is gone cannot be opened; OpenProcess is an access check against the
process's DACL (its token's default DACL: its user and SYSTEM; `m.running[pid].grants` where
wider), and the elevated loop's token (the real user, Administrators, Everyone) passes it only if
the DACL grants one of those, or "if the caller has enabled the SeDebugPrivilege privilege, the
requested access is granted regardless of the contents of the security descriptor" (OpenProcess
docs). `debug_privilege` is AdjustTokenPrivileges on sandgate's token: enabling a privilege the
token does not hold (`debug_held` False: not elevated, or no "Debug programs") fails. The handle
kept pins the pid ("the identifier may be reused" only after "all handles to the process are
closed", PROCESS_INFORMATION docs) and must be closed exactly once. `job_pids` is
QueryInformationJobObject(JobObjectBasicProcessIdList): the live processes assigned to the job,
on a live job handle only. `owner_refused[pid]` = "process" (the System process/CSRSS: refused even
with the privilege) or "token" (the token's DACL refuses TOKEN_QUERY) models what the loop cannot
open either way.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from netguard.windows import wfp
from netguard.windows.divertfilter import DivertFilters
from netguard.windows.owners import Opened
from netguard.windows.win32divert import ResolverServer, TransparentPath
from sgbase.windows.api import WinApiError

if TYPE_CHECKING:
    from fsguard.windows.launch import Launch
    from tests.support.winfake import Machine

ERROR_INVALID_HANDLE, ERROR_INVALID_PARAMETER = 6, 87
SOCKET, NETWORK, SNIFF, RECV_ONLY = 3, 0, 1, 4
HOST_ADDR = "10.0.0.5"  # the host's own address: a sandbox SYN's source, where the reflected SYN goes


class FakeWinDivert:
    def __init__(self, filter: str, layer: int = NETWORK, priority: int = 0, flags: int = 0) -> None:
        self.filter, self.layer, self.flags = filter, int(layer), int(flags)
        self.opened = self.closed = False
        self.inbox: list[Any] = []
        self.sent: list[Any] = []
        self.cv = threading.Condition()
        self.elevated = True
        self.asks = self.taken = self.asks_at_take = 0  # recv calls; packets handed out; asks then

    def open(self) -> FakeWinDivert:
        if not self.elevated:  # "a program using WinDivert must have Administrator access rights"
            raise PermissionError(5, "Access is denied")
        if self.layer == SOCKET and not self.flags & RECV_ONLY and not self.flags & SNIFF:
            raise OSError(ERROR_INVALID_PARAMETER, "socket events cannot be injected")
        self.opened = True
        return self

    @property
    def is_open(self) -> bool:
        return self.opened and not self.closed

    def close(self) -> None:
        if not self.opened:  # pydivert (3.1.3 and 4.0.1): closing a handle that never opened raises
            raise RuntimeError("WinDivert handle is not open")
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def push(self, item: Any) -> None:
        with self.cv:
            self.inbox.append(item)
            self.cv.notify_all()

    def recv(self, bufsize: int = 0, timeout: float | None = None) -> Any:
        with self.cv:
            self.asks += 1
            self.cv.notify_all()  # a reader asking again has finished with the last packet
            self.cv.wait_for(lambda: self.inbox or self.closed, timeout)
            if self.closed:
                raise OSError(ERROR_INVALID_HANDLE, "The handle is invalid")
            if not self.inbox:
                raise TimeoutError
            self.taken, self.asks_at_take = self.taken + 1, self.asks
            return self.inbox.pop(0)

    def handled(self, taken: int) -> bool:
        """The packet handed out after `taken` earlier ones is done with (sent or dropped)."""
        return self.taken > taken and self.asks > self.asks_at_take

    def send(self, packet: Any, recalculate_checksum: bool = True) -> int:
        if self.closed:
            raise OSError(ERROR_INVALID_HANDLE, "The handle is invalid")
        if self.layer == SOCKET or self.flags & RECV_ONLY:  # socket events cannot be injected
            raise OSError(ERROR_INVALID_PARAMETER, "The parameter is incorrect")
        with self.cv:
            self.sent.append(packet)
            self.cv.notify_all()
        return 1


def connect_event(pid: int, addr: str, port: int, local: int) -> Any:
    words = [int.from_bytes(bytes(int(x) for x in addr.split(".")), "big"), 0xFFFF, 0, 0]
    sock = SimpleNamespace(ProcessId=pid, RemoteAddr=words, RemotePort=port, LocalPort=local)
    return SimpleNamespace(socket=sock, event=3)  # WINDIVERT_EVENT_SOCKET_CONNECT


def syn(src: str, sport: int, dst: str, dport: int) -> Any:
    tcp = SimpleNamespace(syn=True, ack=False, fin=False, rst=False)
    return SimpleNamespace(src_addr=src, src_port=sport, dst_addr=dst, dst_port=dport, direction=0, tcp=tcp)


class DivertFake:
    """The transparent path's effects on the fake machine (mixed into FakeWinApi)."""

    admin: bool
    violations: list[str]
    launches: dict[int, tuple[Launch, str]]
    m: Machine
    alive: set[int]

    def _hit(self, name: str, *args: object) -> None: ...  # FakeWinApi's

    def __init__(self) -> None:
        self.divert_handles: list[FakeWinDivert] = []  # (network, socket) pairs, in open order
        self.dynamic: dict[int, tuple[wfp.WfpFilter, ...]] = {}  # live dynamic sessions
        self.resolvers: list[ResolverServer] = []
        self.divert_driver = True  # False: WinDivert64.sys missing
        self._session = 90_000
        self.owner_refused: dict[int, str] = {}  # pid -> "process" | "token": what the loop cannot open
        self.debug_held = True  # sandgate's elevated token holds SeDebugPrivilege (disabled by default)
        self.debug_enabled = False
        self.owner_handles: dict[int, int] = {}  # the loop's kept process handles -> pid

    def divert_open(self, filters: DivertFilters) -> tuple[FakeWinDivert, FakeWinDivert]:
        self._hit("divert_open")
        if not self.divert_driver:
            raise WinApiError("WinDivertOpen: The system cannot find the file specified (WinDivert64.sys)")
        net = FakeWinDivert(filters.network, NETWORK)
        ev = FakeWinDivert(filters.socket, SOCKET, flags=SNIFF | RECV_ONLY)
        try:
            for h in (ev, net):
                h.elevated = self.admin
                h.open()
        except OSError as e:
            ev.close()
            raise WinApiError(f"WinDivertOpen: {e.strerror}") from None
        self.divert_handles += [net, ev]
        return net, ev

    def wfp_open_dynamic(self, plan: wfp.WfpPlan, filters: tuple[wfp.WfpFilter, ...]) -> int:
        # FwpmFilterAdd0 needs FWPM_ACTRL_ADD on the filter container and sublayer: administrators
        # only (https://learn.microsoft.com/en-us/windows/win32/fwp/access-control)
        self._hit("wfp_open_dynamic")
        if not self.admin:
            raise WinApiError("FwpmFilterAdd0: access denied")
        if any(f.persistent for f in filters):
            raise WinApiError("a persistent filter added in a dynamic session outlives it")
        self._session += 1
        self.dynamic[self._session] = filters
        return self._session

    def wfp_close_dynamic(self, session: int) -> None:
        self._hit("wfp_close_dynamic", session)
        if self.dynamic.pop(session, None) is None:  # FwpmEngineClose0 on a closed handle
            raise WinApiError("FwpmEngineClose0: The handle is invalid")

    def user_of(self, pid: int) -> str | None:
        """The token user of a live process (CMD: the sandbox user; `m.running`: its own; `alive`:
        sandgate's and other runs' launchers, the real user's), else None."""
        if self.m.procs.get(pid) in ("suspended", "running") and pid in self.launches:
            return self.m.users[self.launches[pid][0].user][0]
        p = self.m.running.get(pid)
        if p is not None:
            return p.user if p.alive else None
        from tests.support.winfake import REAL_SID  # here: winfake imports this module

        return REAL_SID if pid in self.alive else None

    def debug_privilege(self, enable: bool) -> bool:
        self._hit("debug_privilege", enable)
        if not self.debug_held:  # AdjustTokenPrivileges "succeeds" with ERROR_NOT_ALL_ASSIGNED
            raise WinApiError("AdjustTokenPrivileges: not all privileges are assigned (error 1300)")
        was, self.debug_enabled = self.debug_enabled, enable
        return was

    def _dacl(self, pid: int, sid: str) -> tuple[str, ...]:
        p = self.m.running.get(pid)
        return p.grants if p is not None else (sid, "S-1-5-18")  # a token's default DACL: its user, SYSTEM

    def owner_open(self, pid: int) -> Opened:
        self._hit("owner_open", pid)
        from tests.support.winfake import REAL_SID  # here: winfake imports this module

        sid = self.user_of(pid)
        if sid is None or self.owner_refused.get(pid) == "process":
            return Opened()  # OpenProcess: gone, or the System process/CSRSS
        caller = {REAL_SID, "S-1-1-0"} | ({"S-1-5-32-544"} if self.admin else set())
        if not self.debug_enabled and not caller & set(self._dacl(pid, sid)):
            return Opened()  # ERROR_ACCESS_DENIED: the DACL grants this token nothing
        self._session += 1
        self.owner_handles[self._session] = pid
        return Opened(self._session, sid if self.owner_refused.get(pid) != "token" else None)

    def job_pids(self, job: int) -> frozenset[int]:
        self._hit("job_pids", job)
        if job not in self.m.jobs:
            raise WinApiError("QueryInformationJobObject: The handle is invalid")
        live = ("suspended", "running")
        return frozenset(pid for pid, j in self.m.in_job.items() if j == job and self.m.procs.get(pid) in live)

    def owner_release(self, handle: int) -> None:
        self._hit("owner_release")
        if self.owner_handles.pop(handle, None) is None:
            self.violations.append(f"process handle {handle} closed twice or never opened")

    def sandbox_sids(self) -> set[str]:
        return {sid for sid, _ in self.m.users.values()}

    def serve_resolver(self, path: TransparentPath) -> ResolverServer:
        self._hit("serve_resolver")
        server = ResolverServer(path, ("127.0.0.1", 0))  # port 0: tests run side by side, never 8085
        self.resolvers.append(server)
        return server

    def _permitted(self, sid: str) -> bool:
        me = wfp.user_condition(sid)
        return any(
            f.action == "permit" and f.layer.startswith("ALE_AUTH_CONNECT") and me in f.conditions
            for filters in self.dynamic.values()
            for f in filters
        )

    def tcp_connect(self, pid: int, dst: str, dport: int, sport: int) -> str:
        """One TCP connect by `pid`: 'refused' (WFP, WSAEACCES), 'proxy' (reflected into the
        transparent port), 'direct' (left unchanged), or 'dropped' (by the loop)."""
        sid = self.m.users[self.launches[pid][0].user][0] if pid in self.launches else self.user_of(pid)
        sandboxed = sid in self.sandbox_sids()  # WFP and the firewall match the SID, not the job
        if sid is not None and sandboxed and not self._permitted(sid):
            return "refused"  # the persistent hard block at ALE_AUTH_CONNECT
        live = [h for h in self.divert_handles if h.layer == NETWORK and not h.closed]
        if not live:
            if sandboxed:
                self.violations.append(
                    f"a sandbox connect to {dst}:{dport} left unchanged: no divert handle, permits live"
                )
            return "direct"
        net, ev = live[-1], self.divert_handles[self.divert_handles.index(live[-1]) + 1]
        before, taken = len(net.sent), net.taken
        ev.push(connect_event(pid, dst, dport, sport))
        net.push(syn(HOST_ADDR, sport, dst, dport))
        with net.cv:  # sent, or dropped: the loop asked for the next packet without sending this one
            net.cv.wait_for(lambda: len(net.sent) > before or net.handled(taken), 5.0)
        if len(net.sent) == before:
            return "dropped"
        pkt = net.sent[before]
        if (pkt.direction, pkt.dst_addr) == (1, HOST_ADDR):
            return "proxy"
        if sandboxed:
            self.violations.append(f"a sandbox user's SYN to {dst}:{dport} (pid {pid}) passed unchanged")
        return "direct"

    def divert_crash(self) -> None:
        """WinDivert's driver unloaded under the loop: every handle is invalid from now on."""
        for h in self.divert_handles:
            h.close()

    def wait_until(self, cond: Any, timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True
