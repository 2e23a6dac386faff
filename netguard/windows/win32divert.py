"""The transparent path on Windows, wired: two WinDivert handles (pydivert) feed redirect.Redirector,
the loop's dynamic WFP session holds the transparent permits, and the proxy's transparent listener
asks the loop where a reflected connection was going (ResolverServer on 127.0.0.1:8085, which the
proxy child's mitmproxy Resolver queries).

Threat answered: WinDivert fails open. When its NETWORK handle closes, packets are no longer
diverted, and the sandbox user's SYNs would leave directly under the transparent permits. So the
permits live only as long as the loop (wfp.transparent_permits, FWPM_SESSION_FLAG_DYNAMIC via
win32wfp.open_dynamic): they are added after both handles are open and removed before either is
closed; a handle that fails (recv raises, the driver is unloaded) ends the loop, which removes the
permits first, so the persistent hard block applies again (fail closed), then tells the run
(`on_fail`). If the process dies, BFE ends its dynamic session with it. WinDivert needs an
elevated process, and so does the dynamic session: transparent mode runs only elevated.

pydivert is imported lazily and only on Windows: it loads WinDivert's DLL and driver.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from netguard.windows import divertpump, owners, redirect, wfp
from netguard.windows.divertfilter import DivertFilters


class DivertError(OSError):
    """The transparent path cannot run (not Windows, not elevated, no WinDivert driver)."""


class Handle(redirect.DivertHandle, Protocol):
    def close(self) -> None: ...


Opener = Callable[[DivertFilters], tuple[Handle, Handle]]


def _platform() -> str:
    return sys.platform  # read at call time (tests set it), and opaque to mypy's platform narrowing


def open_handles(filters: DivertFilters) -> tuple[Handle, Handle]:
    """(network, socket_events): the NETWORK handle diverts outbound off-host TCP, the SOCKET
    handle only sniffs connect events (SNIFF | RECV_ONLY: it can neither block nor inject; RECV_ONLY
    is that layer's mandatory flag). https://reqrypt.org/windivert-doc.html#divert_open
    Each is pumped (divertpump.py): the pydivert Windows gets has no recv timeout. Any failure is one
    DivertError: pydivert raises OSError from WinDivertOpen, TypeError when its DLL does not load, and
    RuntimeError when a handle that never opened is closed, and none of that may be a traceback."""
    if _platform() != "win32":
        raise DivertError("the transparent path needs WinDivert, which exists only on Windows")
    try:
        import pydivert  # lazily: its import loads nothing, its open() loads WinDivert's driver

        events = pydivert.WinDivert(
            filters.socket, layer=pydivert.Layer.SOCKET, flags=pydivert.Flag.SNIFF | pydivert.Flag.RECV_ONLY
        )
        network = pydivert.WinDivert(filters.network, layer=pydivert.Layer.NETWORK)
        events.open()
        try:
            network.open()
        except BaseException:
            events.close()  # opened: closing it is allowed (a never-opened one raises RuntimeError)
            raise
    except Exception as e:
        raise DivertError(f"WinDivert: {e}; {open_hint(e)}") from None
    return divertpump.Pumped(network, "network"), divertpump.Pumped(events, "events")


#: WinDivertOpen's documented errors (https://reqrypt.org/windivert-doc.html#divert_open) and what to
#: do about each. 2 on a default Windows 11 is most likely Microsoft Defender (or another antivirus)
#: having quarantined the WinDivert64.sys that pydivert bundles: it flags WinDivert as a hack tool.
_OPEN_HINTS = {
    2: "WinDivert64.sys is missing: an antivirus may have quarantined pydivert's bundled driver; "
    "restore it (or allow it) and run again, or run without --transparent",
    5: "WinDivert needs an elevated (administrator) terminal",
    577: "WinDivert64.sys has no signature Windows accepts here; run without --transparent",
    654: "another program loaded an incompatible WinDivert driver; close it (or reboot) and run again",
    1275: "the WinDivert driver is blocked (security software, or a virtual machine without drivers); "
    "run without --transparent",
    1753: "the Base Filtering Engine service is disabled; start it (it is Windows' firewall) and run again",
}


def open_hint(error: BaseException) -> str:
    """What to do when the handles cannot open, by WinDivertOpen's Windows error code (OSError.winerror)."""
    code = getattr(error, "winerror", None)
    hint = _OPEN_HINTS.get(code) if isinstance(code, int) else None
    return hint or "transparent mode needs an elevated terminal and WinDivert's driver"


@dataclass(frozen=True)
class Permits:
    """The dynamic WFP session (win32wfp.open_dynamic / close_dynamic in production)."""

    open: Callable[[wfp.WfpPlan, tuple[wfp.WfpFilter, ...]], int]
    close: Callable[[int], None]


class TransparentPath:
    """One run's transparent capture: start(), then the proxy resolves through original_addr();
    stop() (or a failed handle) ends it, permits first."""

    def __init__(
        self,
        plan: wfp.WfpPlan,
        sid: str,
        filters: DivertFilters,
        proxy_port: int,
        look: Callable[[int], owners.Held],
        *,
        permits: Permits,
        release: Callable[[int], None] = lambda _: None,
        opener: Opener = open_handles,
        on_fail: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`look(pid)`: a connect's owner (win32owner.look against the run's job), `release` closes
        the process handle it kept; `sid`: the sandbox user's (its permits, and whose flows outside
        the job are dropped)."""
        self._plan, self._sid, self._filters, self._port = plan, sid, filters, proxy_port
        self._look, self._release = look, release
        self._permits, self._opener, self._on_fail = permits, opener, on_fail
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._session: int | None = None
        self._handles: tuple[Handle, ...] = ()
        self._thread: threading.Thread | None = None
        self.redirector: redirect.Redirector | None = None
        self.failure: str | None = None

    def start(self) -> None:
        """Handles first (diverted, nothing leaves undecided), then the permits, then the loop."""
        network, events = self._opener(self._filters)
        self._handles = (network, events)
        who = owners.Owners(self._look, self._sid, self._release)
        self.redirector = redirect.Redirector(network, events, self._port, who)
        try:
            self._session = self._permits.open(self._plan, wfp.transparent_permits(self._sid))
        except BaseException:
            self._close()
            raise
        self._thread = threading.Thread(target=self._run, name="sandgate-divert", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._session is not None

    def _run(self) -> None:
        assert self.redirector is not None
        try:
            self.redirector.serve(self._stop)
        except BaseException as e:  # a closed or failed handle: WinDivert would now fail open
            if not self._stop.is_set():  # stop() closes the handles under recv: that is no failure
                self.failure = f"the transparent redirect loop stopped: {e}"
        try:
            self._close()
        except BaseException as e:  # the permits stay until this process exits; say so
            self.failure = f"{self.failure or 'the transparent redirect loop stopped'}; its permits: {e}"
        if self.failure is not None:
            self._on_fail(self.failure)

    def _close(self) -> None:
        """Permits out first (the persistent block applies again), then the handles. Idempotent."""
        with self._lock:
            session, self._session = self._session, None
            handles, self._handles = self._handles, ()
        if session is not None:
            try:
                self._permits.close(session)
            except BaseException:
                with self._lock:  # kept, so stop() retries; the handles stay open (packets queued,
                    self._session, self._handles = session, handles  # never re-sent): closing them
                raise  # with the permits live would fail open
        for h in handles:
            try:
                h.close()
            except OSError:
                pass  # already closed: that may be why we are here

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._close()  # before the join: never a moment with permits and no loop
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def original_addr(self, conn: socket.socket) -> tuple[str, int]:
        """mitmproxy.platform.original_addr for the transparent listener: where the reflected
        connection accepted on `conn` was going. A peer the loop did not reflect (anyone on the
        network reaching the transparent port through its inbound allow) is refused."""
        peer = conn.getpeername()
        if not isinstance(peer, tuple) or self.redirector is None:
            raise DivertError(f"{peer!r} is not a connection the redirect loop reflected")
        original = self.redirector.original(str(peer[0]), int(peer[1]))
        if original is None or not self.running:
            raise DivertError(f"{peer[0]}:{peer[1]} is not a connection the redirect loop reflected")
        return original.dst_addr, original.dst_port


#: mitmproxy.platform.windows.REDIRECT_API_HOST/PORT: where the proxy's original_addr asks.
RESOLVER_ADDR = ("127.0.0.1", 8085)


class ResolverServer:
    """The loop's NAT table, served in the protocol the proxy child already speaks on Windows:
    mitmproxy.platform.original_addr there is mitmproxy.platform.windows.Resolver, which connects
    to 127.0.0.1:8085, sends its pid, then one JSON `[ip, port]` line per accepted connection and
    reads `[host, port]` or `null` back. So the proxy (netguard.daemon.frontdoor's transparent
    listener, mitmproxy's own) learns original destinations with no change, across processes.
    Threats: it must listen BEFORE the proxy starts, else mitmproxy's TransparentProxy.setup()
    would find the port free and start its own WinDivert redirector (it reflects everything, for
    everyone); and it answers only flows this loop reflected (null otherwise). The sandbox user
    cannot reach it: WFP permits it loopback TCP to the proxy's ports only."""

    def __init__(self, path: TransparentPath, addr: tuple[str, int] = RESOLVER_ADDR) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if hasattr(socket, "SO_EXCLUSIVEADDRUSE"):  # Windows: no other socket may bind it after us
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        self._sock.bind(addr)  # fails if someone holds it already: then the run must not go on
        self._sock.listen()
        self.addr: tuple[str, int] = self._sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, name="sandgate-resolver", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rfile, conn.makefile("wb") as wfile:
            if not rfile.readline().strip():  # the client's pid: mitmproxy exempts it; owners.py does
                return
            for line in rfile:
                wfile.write(json.dumps(self._lookup(line)).encode() + b"\n")
                wfile.flush()

    def _lookup(self, line: bytes) -> list[str | int] | None:
        try:
            ip, port = json.loads(line)
            original = self._path.redirector.original(str(ip), int(port)) if self._path.redirector else None
        except (ValueError, TypeError):
            return None
        if original is None or not self._path.running:
            return None
        return [original.dst_addr, original.dst_port]

    def close(self) -> None:
        self._sock.close()
