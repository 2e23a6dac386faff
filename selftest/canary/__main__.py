"""`python -m selftest.canary KIND ...`: one canary server (see the package docstring)."""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socketserver
import sys
import threading

from selftest import canary
from selftest.canary.dns_canary import DNSAnswerer, serve_dns
from selftest.canary.http_canary import FakeHTTPServer, make_tls_context
from selftest.canary.log import JsonLog
from selftest.canary.socket_canary import serve_tcp, serve_udp, serve_unix, unlink_on_sigterm
from selftest.canary.upstream_canary import serve_upstream

IP_KINDS = ("http", "https", "dns", "udp", "tcp", "upstream", "git")
TLS_KINDS = ("https", "upstream", "git")
UNIX_KINDS = ("unix", "abstract")
KINDS = IP_KINDS + UNIX_KINDS


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when the World's process dies, so a `kill -9`'d run leaves no servers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # parent already gone before prctl took effect
        os._exit(1)


def _parser() -> argparse.ArgumentParser:
    doc = (canary.__doc__ or "").splitlines()[0]
    ap = argparse.ArgumentParser(prog="python -m selftest.canary", description=doc)
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--ip", help="listen address (all kinds but unix/abstract)")
    ap.add_argument("--port", type=int, help="listen port (all kinds but unix/abstract)")
    ap.add_argument("--path", help="unix: socket path; abstract: name (without the leading NUL)")
    ap.add_argument("--log", required=True)
    ap.add_argument("--name", default="")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--records")
    ap.add_argument("--git-root", help="git: the directory holding the repositories served")
    ap.add_argument("--parent-pid", type=int)
    return ap


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What each kind needs; argparse exits with usage otherwise."""
    if args.kind in UNIX_KINDS:
        if not args.path or "\0" in args.path:
            ap.error(f"{args.kind} needs --path (without NUL bytes)")
        if args.kind == "unix" and not os.path.isabs(args.path):
            ap.error("unix needs an absolute --path")
    elif args.ip is None or args.port is None:
        ap.error(f"{args.kind} needs --ip and --port")
    if args.kind in TLS_KINDS and not (args.cert and args.key):
        ap.error(f"{args.kind} needs --cert and --key")
    if args.kind == "git" and not args.git_root:
        ap.error("git needs --git-root")
    if args.kind == "dns" and not args.records:
        ap.error("dns needs --records")


def _servers(args: argparse.Namespace, name: str, log: JsonLog) -> list[socketserver.BaseServer]:
    if args.kind in UNIX_KINDS:
        servers = [serve_unix(args.kind, args.path, log)]
        if args.kind == "unix":
            unlink_on_sigterm(args.path)
        return servers
    if args.kind in ("http", "https"):
        ctx = make_tls_context(args.cert, args.key) if args.kind == "https" else None
        return [FakeHTTPServer((args.ip, args.port), log, name, ctx)]
    if args.kind in ("upstream", "git"):
        return [serve_upstream(args.ip, args.port, log, name, make_tls_context(args.cert, args.key), args.git_root)]
    if args.kind == "dns":
        return serve_dns(args.ip, args.port, DNSAnswerer(args.records, log))
    if args.kind == "udp":
        return [serve_udp(args.ip, args.port, log)]
    return [serve_tcp(args.ip, args.port, log)]


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    _check(ap, args)
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.kind in UNIX_KINDS:
        name = args.name or ("@" + args.path if args.kind == "abstract" else args.path)
    else:
        name = args.name or args.ip
    for srv in _servers(args, name, JsonLog(args.log, name)):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    threading.Event().wait()  # until SIGTERM/SIGKILL from the World
    return 0


if __name__ == "__main__":
    sys.exit(main())
