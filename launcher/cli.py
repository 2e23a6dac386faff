"""`sandgate` command line: argument parsing and the one place where errors become one line + exit 125."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from launcher import policy as lpolicy

EXIT_SANDGATE_ERROR = 125  # like env(1)/timeout(1): the tool failed, not the command


class UsageError(Exception):
    """A user mistake outside policy files (bad address, missing privilege...)."""


def _fail(message: str) -> NoReturn:
    print(f"sandgate: error: {message}", file=sys.stderr)
    sys.exit(EXIT_SANDGATE_ERROR)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2; a wrapper tool must not collide with CMD's codes
        self.print_usage(sys.stderr)
        _fail(message)


def parse_addr(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or PORT."""
    host, port = default_host, text
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"invalid address '{text}': expected HOST:PORT with a port from 1 to 65535")
    return host, int(port)


def default_audit_path() -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(".sandgate") / f"audit-{stamp}-{uuid.uuid4().hex[:6]}.jsonl"


def _policy_from_args(args: argparse.Namespace) -> lpolicy.Policy:
    files = [Path(p) for p in args.policy]
    if not files and not args.allow and Path(".sandgate.yaml").exists():
        files = [Path(".sandgate.yaml")]
    if not files and not args.allow:
        raise UsageError("no policy: give --policy FILE or --allow NAME (see 'sandgate allowlists'); nothing would be reachable")
    return lpolicy.build_policy(files, args.allow, args.deny)


def cmd_proxy(args: argparse.Namespace) -> int:
    """Run the allowlisting proxy alone until Ctrl-C, for containers or CI jobs routed through it."""
    from netguard import proxy, rules
    from netguard.audit import AuditLog

    pol = _policy_from_args(args)
    listeners = proxy.Listeners(
        regular=parse_addr(args.listen),
        transparent=parse_addr(args.transparent) if args.transparent else None,
        dns=parse_addr(args.dns) if args.dns else None,
    )
    audit_path = Path(args.audit_log) if args.audit_log else default_audit_path()
    try:
        audit = AuditLog(audit_path)
    except OSError as e:
        raise UsageError(f"cannot open audit log {audit_path}: {e.strerror}; choose another --audit-log") from None
    binding = proxy.Binding(args.task or uuid.uuid4().hex[:12], rules.compile_policy(pol.network), audit)
    confdir = Path(tempfile.mkdtemp(prefix="sandgate-proxy-"))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready() -> None:
            where = ", ".join(spec for spec, _ in listeners.modes())
            print(f"sandgate: proxy ready on {where}; policy: {', '.join(pol.sources)}; audit: {audit_path}",
                  file=sys.stderr, flush=True)

        await proxy.serve([(listeners, binding)], confdir, ready=ready, stop=stop)

    try:
        asyncio.run(main())
    except proxy.ProxyError as e:
        raise UsageError(str(e)) from None
    finally:
        shutil.rmtree(confdir, ignore_errors=True)
        audit.close()
    if not args.quiet:
        c = audit.counts
        print(f"sandgate: {c.get('allow', 0)} allowed, {c.get('deny', 0)} denied -> {audit_path}", file=sys.stderr)
    return 0


def cmd_allowlists(args: argparse.Namespace) -> int:
    rows = lpolicy.describe_bundled()
    width = max(len(n) for n, _, _ in rows)
    for name, desc, count in rows:
        print(f"{name:<{width}}  {count:>2} hosts  {desc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sandgate", description="Run untrusted commands behind a kernel-enforced allowlist.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    px = sub.add_parser("proxy", help="run the allowlisting egress proxy alone (explicit mode) until Ctrl-C")
    _policy_args(px)
    px.add_argument("--listen", default="127.0.0.1:3128", metavar="HOST:PORT",
                    help="explicit proxy listener (default 127.0.0.1:3128)")
    px.add_argument("--transparent", metavar="HOST:PORT", help="also accept nftables-redirected TCP here")
    px.add_argument("--dns", metavar="HOST:PORT", help="also answer DNS here (allowed names only)")
    px.add_argument("--audit-log", metavar="PATH", help="JSON-lines audit log (default .sandgate/audit-<time>.jsonl)")
    px.add_argument("--task", metavar="ID", help="task id written in every audit record (default: random)")
    px.add_argument("-q", "--quiet", action="store_true", help="no summary line at exit")
    px.set_defaults(func=cmd_proxy)

    al = sub.add_parser("allowlists", help="list the bundled allowlists")
    al.set_defaults(func=cmd_allowlists)
    return p


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", action="append", default=[], metavar="FILE", help="policy file (repeatable)")
    p.add_argument("--allow", action="append", default=[], metavar="NAME|HOST[:PORT]",
                   help="a bundled allowlist name or a host to allow (repeatable)")
    p.add_argument("--deny", action="append", default=[], metavar="HOST[:PORT]", help="a host to deny (repeatable)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except lpolicy.PolicyFileError as e:
        _fail(f"{e}")
    except UsageError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
