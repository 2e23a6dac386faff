"""mitmproxy with only the Proxyserver and sandgate's Gate: the one setup the daemon and `sandgate proxy` share."""

from __future__ import annotations

from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.master import Master
from mitmproxy.options import Options

from netguard.decision import headlimit
from netguard.decision.binding import Binding
from netguard.decision.gate import Gate
from netguard.decision.tlsinspect import TlsInspect
from netguard.relay import nofile


def make_master(bindings: dict[int, Binding], modes: list[str]) -> tuple[Master, Proxyserver, Gate]:
    """The master, its Proxyserver and the Gate deciding for `bindings` (slot -> sandbox).

    mitmproxy's TLS addon is not loaded, so it never creates its CA or touches its confdir (~/.mitmproxy):
    nothing is written outside the audit log (tests check the home directory stays empty). TLS for
    inspected hosts comes from TlsInspect, before the Gate so flow errors are final when it audits them.
    Must be called with an event loop running.
    """
    nofile.raise_nofile()  # thousands of connections, each two to four fds
    opts = Options(mode=modes)
    master = Master(opts)
    # mitmproxy leaves these unannotated (no-untyped-call): the types are the ones named here.
    proxyserver = Proxyserver()  # type: ignore[no-untyped-call]
    gate = Gate(bindings)
    gate.handlers = proxyserver.connections  # decided flows leave mitmproxy for the kernel relay
    headlimit.install(gate.head_refused)  # no request head grows the shared daemon without bound
    tlsinspect = TlsInspect(bindings)
    gate.sessions = tlsinspect.sessions  # an inspected body's takeover reuses mitmproxy's own TLS sessions
    master.addons.add(proxyserver, tlsinspect, gate)  # type: ignore[no-untyped-call]
    opts.update(  # type: ignore[no-untyped-call]
        connection_strategy="lazy",  # decide on the name (SNI/Host) before any upstream connection exists
        # Allowed bodies are streamed by Gate from the first byte; this bounds what a *refused* request's
        # body may make the proxy hold before its 403 (a body of unknown length is read to its end first).
        stream_large_bodies="1m",
        store_streamed_bodies=False,
    )
    return master, proxyserver, gate
