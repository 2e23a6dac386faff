"""Another sandgate daemon of the command's own uid, its control socket in reach (issue 22).

A user often has two daemons: a login session's `$XDG_RUNTIME_DIR/sandgate` beside a cron run's
`/tmp/sandgate-<uid>`, the user's own beside a `sudo sandgate run`. The sandbox hides its own runtime
directory; verify starts a second daemon whose socket it does not hide (a path in verify's scratch
tree, the worst case) and the probe uses sandgate's own control client on it, as the attacker of the
issue did: `status`, `bind` of a policy allowing the blocked host on listeners made inside on
127.0.0.1 (loopback is not redirected), then a request through them, and `stop`. Every one must be
refused by the daemon itself; a socket out of reach proves nothing about the daemon and is
"unsupported". The permitted twins: the sandbox's own allowed request (judged by the canary), and
verify asking the same daemon `status` from outside before and after (passes.py).

Imports sandgate's control client (netguard) when it runs: the attacker's tool is sandgate's own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from selftest import markers
from selftest.probes.core import Blocked, Ctx, Result, Unsupported, attempt, combine, probe
from selftest.probes.netio import HTTP_TIMEOUT, fetch, http_exchange, http_verdict

#: The command's own context: the peer check looks at the connecting process's namespaces, which every
#: process of the sandbox shares; the other contexts' traffic reaching nothing is the other rows' job.
CONTEXTS = ("child",)
CONTROL_TIMEOUT = 5.0


def _control() -> Any:
    try:
        from netguard.daemon import control
    except ImportError as e:
        raise Unsupported(f"sandgate's control client does not import with this interpreter: {e}") from None
    return control


def on_daemon(path: str, use: Callable[[Any], Result]) -> Result:
    """Connect with sandgate's ControlClient and `use` it: a reply refusing it is Blocked (the daemon said
    no), a socket that cannot be reached is Unsupported (the daemon's own check was never tried)."""
    control = _control()
    try:
        client = control.ControlClient.connect(path, timeout=CONTROL_TIMEOUT)
    except control.ControlError as e:
        raise Unsupported(f"the other daemon's socket is out of reach, its peer check untried: {e}") from None
    try:
        with client:
            return use(client)
    except control.ControlError as e:  # the why, without the daemon's closing advice (the row stays short)
        raise Blocked(str(e).split("; only a launcher")[0].split(" (a sandbox")[0][:100]) from None


def _status(client: Any) -> Result:
    return "permitted", f"status answered: {client.status()}"


def _stop(client: Any) -> Result:
    client.stop()
    return "permitted", "stop accepted"


def _binder(c: Ctx) -> Callable[[Any], Result]:
    """Bind a policy allowing the blocked host on listeners made here, then GET through them (marked)."""

    def use(client: Any) -> Result:
        from netguard.policy import parse_network
        from netguard.spec import BindingSpec

        regular, transparent, dns_tcp = (socket.create_server(("127.0.0.1", 0)) for _ in range(3))
        dns_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dns_udp.bind(("127.0.0.1", 0))
        audit = os.path.join(c.spec.results_dir, f"other-daemon-audit-{c.mark}.jsonl")
        afd = os.open(audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        socks = (regular, transparent, dns_udp, dns_tcp)
        try:
            allow = {"allow": [{"host": c.spec.blocked_host, "ports": [80]}]}
            spec = BindingSpec(f"verify-{c.mark}", parse_network(allow, "other-daemon.yaml"))
            client.bind(spec, [afd, *(s.fileno() for s in socks)])
            with socket.create_connection(regular.getsockname(), timeout=HTTP_TIMEOUT) as s:
                status, body = http_exchange(s, f"http://{c.spec.blocked_host}{c.path}", c.spec.blocked_host)
            return (
                "permitted",
                f"bound a policy allowing {c.spec.blocked_host}; through it HTTP {status}: {body[:60]!r}",
            )
        finally:
            os.close(afd)
            for s in socks:
                s.close()

    return use


@probe("network", "other_daemon_control", "blocked", contexts=CONTEXTS)
def other_daemon_control(c: Ctx) -> Result:
    """Another daemon of the command's uid, its socket in reach: sandgate's own control client asks status, binds a policy allowing the blocked host on listeners made inside, and stops it; a launcher outside is still served."""
    path = c.spec.other_daemon_socket
    if not path:
        raise Unsupported("verify started no other daemon (spec.other_daemon_socket is empty)")
    url = f"http://{c.spec.allowed_host}{markers.control_path(c.mark, c.probe)}"
    twin = attempt(lambda: http_verdict(*fetch(url, c.spec, env_proxy=False)))
    uses = (("status", _status), ("bind", _binder(c)), ("stop", _stop))
    parts = [(op, attempt(on_daemon, path, use)) for op, use in uses]
    observed, detail = combine(parts, need="any")
    return observed, f"{detail}; the sandbox's own allowed request: {twin[1]}"
