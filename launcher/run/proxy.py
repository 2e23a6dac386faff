"""`sandgate proxy`: the allowlisting proxy alone, on TCP listeners, for containers and CI jobs routed through it.

Readiness is machine-readable: with --ready-fd N, one JSON line goes to fd N, which is then
closed, once every listener accepts connections:
  {"ready": true, "listen": ["regular@127.0.0.1:3128", ...], "audit": "/path/audit.jsonl"}
The `sandgate: proxy ready on ...` line on stderr is for humans; nothing should parse it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from launcher.audit import logs as auditlogs
from launcher.errors import UsageError
from launcher.run import policyargs

#: The command line's HOST:PORT parser, passed in by the CLI (this room does not import the CLI).
AddrParser = Callable[[str], tuple[str, int]]


class Ready(TypedDict):
    """The one line written to --ready-fd."""

    ready: bool
    listen: list[str]
    audit: str


def main(args: argparse.Namespace, parse_addr: AddrParser) -> int:
    """Serve until SIGINT/SIGTERM; the exit line counts what was allowed and denied."""
    import asyncio

    from netguard import rules
    from netguard.asking import Approver
    from netguard.audit import AuditLog
    from netguard.proxy import standalone as proxy
    from netguard.proxy.binding import Binding

    pol = policyargs.policy_from_args(args)
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
    approver = Approver(args.approval_socket, args.ask_timeout) if args.approval_socket else None
    binding = Binding(
        args.task or uuid.uuid4().hex[:12],
        rules.compile_policy(pol.network),
        audit,
        learn=args.learn,
        ask_all=args.ask_all,
        approver=approver,
    )
    where = [spec for spec, _ in listeners.modes()]

    def ready() -> None:
        if ready_fd is not None:
            _announce(ready_fd, Ready(ready=True, listen=where, audit=str(audit_path)))
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
            loop.add_signal_handler(sig, stop.set)
        await proxy.serve([(listeners, binding)], ready=ready, stop=stop)

    try:
        asyncio.run(serve())
    except proxy.ProxyError as e:
        raise UsageError(str(e)) from None
    finally:
        audit.close()
    if not args.quiet:
        c = audit.counts
        print(f"sandgate: {c.get('allow', 0)} allowed, {c.get('deny', 0)} denied -> {audit_path}", file=sys.stderr)
    return 0


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
