"""`sandgate proxy`: the allowlisting proxy alone, on TCP listeners, for containers and CI jobs routed through it.

Readiness is machine-readable: with --ready-fd N, one JSON line goes to fd N, which is then
closed, once every listener accepts connections:
  {"ready": true, "listen": ["regular@127.0.0.1:3128", ...], "audit": "/path/audit.jsonl"}
and, when the policy inspects TLS (an `inspect:`/`http:` allow entry or a credential), also
  "ca": "/path/audit.ca.pem"
the certificate of this proxy's own CA (made in memory at start; its key is never written), which
clients must trust for the inspected hosts (--ca-cert FILE, default: the audit log's name with .ca.pem).
The `sandgate: proxy ready on ...` line on stderr is for humans; nothing should parse it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from launcher.audit import logs as auditlogs
from launcher.config import load as lpolicy
from launcher.errors import UsageError
from launcher.run import inspection, options, policyargs
from launcher.run.policyargs import PolicyArgs

if TYPE_CHECKING:
    from netguard.audit import AuditLog
    from netguard.credentials import Secret
    from netguard.decision.binding import Binding
    from netguard.spec import CaPair

#: The command line's HOST:PORT parser, passed in by the CLI (this room does not import the CLI).
AddrParser = Callable[[str], tuple[str, int]]


@dataclass(frozen=True)
class ProxyArgs:
    """`sandgate proxy`'s command line as given (typed by launcher/cli.py), checked as it is used."""

    policy: PolicyArgs
    listen: str = "127.0.0.1:3128"
    transparent: str | None = None
    dns: str | None = None
    audit_log: str | None = None
    task: str | None = None
    quiet: bool = False
    learn: bool = False
    ready_fd: int | None = None
    upstream_ca: str | None = None
    upstream_proxy: str | None = None
    upstream_proxy_by_name: bool = False
    ca_cert: str | None = None
    ask_all: bool = False  # `sandgate run --ask`
    approval_socket: str | None = None  # the launcher's approval broker
    ask_timeout: float = 60.0


class Ready(TypedDict):
    """The one line written to --ready-fd."""

    ready: bool
    listen: list[str]
    audit: str
    ca: NotRequired[str]  # only when the policy inspects: the CA certificate clients must trust


def main(args: ProxyArgs, parse_addr: AddrParser) -> int:
    """Serve until SIGINT/SIGTERM; the exit line counts what was allowed, denied and refused."""
    import asyncio

    from netguard.audit import AuditLog
    from netguard.daemon import standalone as proxy

    pol = policyargs.policy_from_args(args.policy)
    listeners = proxy.Listeners(
        regular=parse_addr(args.listen),
        transparent=parse_addr(args.transparent) if args.transparent else None,
        dns=parse_addr(args.dns) if args.dns else None,
    )
    ready_fd = _ready_fd(args.ready_fd)
    audit_path = Path(args.audit_log) if args.audit_log else auditlogs.new_path()
    try:
        audit = AuditLog(audit_path)
    except OSError as e:
        raise UsageError(f"cannot open audit log {audit_path}: {e.strerror}; choose another --audit-log") from None
    binding, ca_path = _binding(args, pol, audit, audit_path)
    where = [spec for spec, _ in listeners.modes()]

    def ready() -> None:
        if ready_fd is not None:
            line = Ready(ready=True, listen=where, audit=str(audit_path))
            if ca_path is not None:
                line["ca"] = str(ca_path)
            _announce(ready_fd, line)
        if not args.quiet:
            print(
                f"sandgate: proxy ready on {', '.join(where)}; policy: {', '.join(pol.sources)}; audit: {audit_path}",
                file=sys.stderr,
                flush=True,
            )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except NotImplementedError:  # Windows' event loop has none: Ctrl+C ends asyncio.run there
                break
        await proxy.serve([(listeners, binding)], ready=ready, stop=stop)

    try:
        asyncio.run(serve(), loop_factory=proxy.loop_factory())  # Windows: a selector loop (standalone.py)
    except proxy.ProxyError as e:
        raise UsageError(str(e)) from None
    finally:
        audit.close()
    if not args.quiet:
        from launcher.run import summary  # the same exit line as `sandgate run`: leaks and refused requests too

        print(summary.summary(audit_path, binding.task), file=sys.stderr)
    return 0


def _binding(args: ProxyArgs, pol: lpolicy.Policy, audit: AuditLog, audit_path: Path) -> tuple[Binding, Path | None]:
    """The one binding this proxy serves, and where its CA certificate was written (None: nothing inspected)."""
    from netguard import rules
    from netguard.asking import Approver
    from netguard.decision.binding import Binding

    approver = Approver(args.approval_socket, args.ask_timeout) if args.approval_socket else None
    task = args.task or uuid.uuid4().hex[:12]
    upstream_ca = inspection.read_upstream_ca(args.upstream_ca)
    ca, secrets, ca_path = _inspection(task, args, pol, audit_path)
    binding = Binding(
        task,
        rules.compile_policy(pol.network),
        audit,
        learn=args.learn,
        ask_all=args.ask_all,
        approver=approver,
        ca=ca,
        upstream_ca=upstream_ca,
        secrets=secrets,
        upstream_proxy=options.upstream_proxy(args.upstream_proxy, args.upstream_proxy_by_name),
    )
    return binding, ca_path


def _inspection(
    task: str, args: ProxyArgs, pol: lpolicy.Policy, audit_path: Path
) -> tuple[CaPair | None, tuple[Secret, ...], Path | None]:
    """When the policy inspects: this proxy's CA (key in memory only), its certificate written for
    clients to trust, and the brokered credentials' secrets. Otherwise nothing (and no cryptography)."""
    from launcher.run import brokered

    if not inspection.needed(pol.network):
        return None, (), None
    creds = brokered.resolve(pol.network.credentials)
    ca = inspection.new_ca(task, inspection.inspected_names(pol.network))
    path = Path(args.ca_cert) if args.ca_cert else audit_path.with_suffix(".ca.pem")
    try:
        nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # neither exists on Windows (win-py P6)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(ca.cert)
    except OSError as e:
        raise UsageError(f"cannot write the CA certificate {path}: {e.strerror}; choose another --ca-cert") from None
    if not args.quiet:
        print(
            f"sandgate: TLS to {', '.join(inspection.inspected_names(pol.network))} is inspected: "
            f"clients must trust the CA certificate {path}",
            file=sys.stderr,
        )
    return ca, creds.secrets, path


def _ready_fd(fd: int | None) -> int | None:
    """--ready-fd, checked before anything listens: a wrong number is a usage error, not a crash at ready."""
    if fd is None:
        return None
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"--ready-fd {fd} is not an open file descriptor") from None
    os.set_inheritable(fd, False)  # nothing the proxy might start holds the starter's pipe open
    return fd


def _announce(fd: int, ready: Ready) -> None:
    """One JSON line, then close: the reader sees the line, then EOF."""
    try:
        os.write(fd, (json.dumps(ready) + "\n").encode())
    except OSError:
        pass  # the starter stopped listening: serving on is still right
    finally:
        os.close(fd)
