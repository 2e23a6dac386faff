"""`sandgate` command line: parsing and dispatch (bodies live in their rooms); errors become one line here."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from launcher import errors
from launcher.config import load as lpolicy
from launcher.config.errors import PolicyFileError
from launcher.errors import UsageError
from netguard.hosts import split_host_port


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2; a wrapper tool must not collide with CMD's codes
        self.print_usage(sys.stderr)
        errors.fail(message)


if TYPE_CHECKING:
    _Subparsers = argparse._SubParsersAction[_Parser]


def parse_addr(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or PORT."""
    host, port = split_host_port(text)
    if port is None and not text.startswith("["):
        host, port = default_host, text  # PORT alone
    if port is None or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"invalid address '{text}': expected HOST:PORT with a port from 1 to 65535")
    return host, int(port)


# ---- dispatch: each subcommand's body lives in its room, imported only when it runs ----------


def _run(args: argparse.Namespace) -> int:
    if sys.platform == "win32":  # before the Linux room, whose modules import pwd, fcntl, termios
        from launcher.platform.windows import runner

        return runner.run(args)  # seam.run_in with the Windows backend (docs/windows.md)
    from launcher.run import launch

    return launch.main(args)


def _proxy(args: argparse.Namespace) -> int:
    from launcher.run import proxy

    return proxy.main(args, parse_addr)


def _housekeeping(args: argparse.Namespace) -> int:
    from launcher.run import housekeeping

    body = {"cleanup": housekeeping.cleanup, "cache": housekeeping.cache_clear, "daemon": housekeeping.daemon}
    return body[args.command](args)


def _setup(args: argparse.Namespace) -> int:
    from launcher.platform.windows import runner

    return runner.setup(args)


def _audit(args: argparse.Namespace) -> int:
    from launcher.audit import command

    return command.main(args)


def _trust(args: argparse.Namespace) -> int:
    from launcher.config import commands

    return commands.trust(args)


def _allowlists(args: argparse.Namespace) -> int:
    from launcher.config import commands

    return commands.list_bundled(args)


def cmd_verify(args: argparse.Namespace) -> int:
    from launcher.selftest import selection, verify

    try:
        only = selection.parse_only(args.only)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for p in args.policy:
        lpolicy.build_policy([Path(p)], [], [])  # a policy error is reported before any namespace exists
    # An ordinary user's PATH often lacks the sbin directories, where nft (and on some systems ip) live.
    path = os.environ.get("PATH", "").split(":")
    os.environ["PATH"] = ":".join([*path, *(d for d in ("/usr/sbin", "/sbin") if d not in path)])
    if shutil.which("nft") is None:
        raise UsageError("nft not found; install nftables (apt-get install nftables)")
    try:
        return verify.main([Path(p) for p in args.policy], args.json, only)
    except verify.VerifyError as e:
        raise UsageError(str(e)) from None


class _Version(argparse.Action):
    """--version, read from the installed metadata only when asked (importlib.metadata is slow to import)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib import metadata

        try:
            version = metadata.version("sandgate")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        print(f"sandgate {version}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's options; each sets `func`, the room that does the work."""
    p = _Parser(prog="sandgate", description="Run untrusted commands behind a kernel-enforced allowlist.")
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    for add in (_add_proxy, _add_run, _add_verify, _add_audit, _add_housekeeping, _add_trust, _add_setup):
        add(sub)
    return p


def _add_proxy(sub: _Subparsers) -> None:
    """`sandgate proxy`: explicit mode on TCP listeners."""
    px = sub.add_parser("proxy", help="run the allowlisting egress proxy alone (explicit mode) until Ctrl-C")
    _policy_args(px)
    px.add_argument(
        "--listen",
        default="127.0.0.1:3128",
        metavar="HOST:PORT",
        help="explicit proxy listener (default 127.0.0.1:3128)",
    )
    px.add_argument("--transparent", metavar="HOST:PORT", help="also accept nftables-redirected TCP here")
    px.add_argument("--dns", metavar="HOST:PORT", help="also answer DNS here (allowed names only)")
    px.add_argument(
        "--audit-log",
        metavar="PATH",
        help="JSON-lines audit log (default: ~/.local/state/sandgate/audit/, root: /var/log/sandgate/)",
    )
    px.add_argument("--task", metavar="ID", help="task id written in every audit record (default: random)")
    px.add_argument("-q", "--quiet", action="store_true", help="no ready/summary lines")
    px.add_argument(
        "--learn",
        action="store_true",
        help="let names the policy would deny through, recorded as would: deny (to learn a policy)",
    )
    px.add_argument(
        "--ready-fd",
        type=int,
        metavar="N",
        help='once listening, write one JSON line {"ready": true, "listen": [...], "audit": PATH} to fd N and close it',
    )
    px.add_argument(
        "--upstream-ca",
        metavar="FILE",
        help="PEM roots to trust for inspected upstreams besides the host's store (a private registry's CA)",
    )
    px.add_argument(
        "--ca-cert",
        metavar="FILE",
        help="when the policy inspects: write this proxy's CA certificate here for clients to trust "
        "(default: next to the audit log, AUDIT.ca.pem)",
    )
    px.add_argument("--ask-all", action="store_true", help=argparse.SUPPRESS)  # `sandgate run --ask`
    px.add_argument("--approval-socket", help=argparse.SUPPRESS)  # the launcher's approval broker
    px.add_argument("--ask-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    px.set_defaults(func=_proxy)


def _add_run(sub: _Subparsers) -> None:
    """`sandgate run [options] -- CMD`."""
    rn = sub.add_parser(
        "run",
        help="run CMD in a sandbox whose only way out is the allowlisting proxy",
        usage="sandgate run [options] -- CMD [ARGS...]",
    )
    _policy_args(rn)
    rn.add_argument(
        "--audit-log",
        metavar="PATH",
        help="JSON-lines audit log (default: ~/.local/state/sandgate/audit/, root: /var/log/sandgate/)",
    )
    rn.add_argument(
        "--user",
        metavar="USER",
        help="run CMD as USER (root only; default: the sudo caller, else you); "
        "--user 0 or root: uid 0 inside the sandbox's own user namespace, no host privilege",
    )
    _boundary_args(rn)
    rn.add_argument("-v", "--verbose", action="store_true", help="print the effective boundary at start")
    rn.add_argument(
        "--learn",
        action="store_true",
        help="audit-only for destinations: let through what the policy would deny, and record it "
        "(files, direct IPs and UDP stay enforced); then use 'sandgate audit suggest'",
    )
    rn.add_argument("--ask", action="store_true", help="ask a human about every destination the policy does not allow")
    rn.add_argument(
        "--ask-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="deny a question nobody answered in this time (default 60)",
    )
    rn.add_argument(
        "--approvals",
        metavar="unix:PATH",
        help="serve approval questions to a tool on this unix socket instead of the terminal",
    )
    rn.add_argument(
        "--upstream-ca",
        metavar="FILE",
        help="PEM roots to trust for inspected upstreams besides the host's store (a private registry's CA)",
    )
    rn.add_argument(
        "--fresh-home",
        action="store_true",
        help="start ~ from the real home alone, without this workspace's layer; drop what the run writes there",
    )
    rn.add_argument("--allow-nested-userns", action="store_true", help="let CMD make user namespaces of its own")
    rn.add_argument("-q", "--quiet", action="store_true", help="no summary line at exit")
    rn.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")
    rn.set_defaults(func=_run)


def _boundary_args(p: argparse.ArgumentParser) -> None:
    """What `run` may write and must not read, beyond the policy."""
    p.add_argument(
        "--write",
        action="append",
        default=[],
        metavar="PATH",
        help="also writable (repeatable); default writable: the current directory and a private /tmp",
    )
    p.add_argument(
        "--read-deny",
        action="append",
        default=[],
        metavar="PATH",
        help="also hidden from the command (repeatable); ~/.ssh, ~/.aws... are hidden by default",
    )
    p.add_argument(
        "--expose-socket",
        action="append",
        default=[],
        metavar="PATH",
        help="show this unix socket inside at the same path, though its directory is hidden "
        "(repeatable; e.g. an ssh-agent under /run/user/UID; never sandgate's own)",
    )
    p.add_argument(
        "--require-landlock",
        action="store_true",
        help="refuse to run when the kernel has no Landlock (default: warn and run)",
    )


def _add_verify(sub: _Subparsers) -> None:
    """`sandgate verify`: the self-test."""
    vf = sub.add_parser("verify", help="prove the boundary on this machine: permitted and blocked actions")
    vf.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FILE",
        help="also apply this policy (its filesystem/env sections; repeatable)",
    )
    vf.add_argument("--json", action="store_true", help="one JSON document with every row")
    vf.add_argument(
        "--only",
        metavar="NAMES",
        help="only these groups (network, filesystem, process) or probes, comma-separated",
    )
    vf.set_defaults(func=cmd_verify)


def _add_audit(sub: _Subparsers) -> None:
    """`sandgate audit [summary|suggest]`."""
    au = sub.add_parser(
        "audit",
        help="read audit logs: what a task reached, and the policy it needed (alone: list the recent runs' logs)",
    )
    au.set_defaults(func=_audit)
    au_sub = au.add_subparsers(dest="audit_command", parser_class=_Parser)
    su = au_sub.add_parser("summary", help="one row per destination, riskiest first (default: the last run)")
    su.add_argument("logs", nargs="*", metavar="LOG")
    su.add_argument("--json", action="store_true")
    su.set_defaults(func=_audit)
    sg = au_sub.add_parser(
        "suggest", help="print a policy that allows exactly what the runs needed (default: the last run)"
    )
    sg.add_argument("logs", nargs="*", metavar="LOG")
    sg.add_argument("--name", help="description for the suggested policy")
    sg.set_defaults(func=_audit)


def _add_housekeeping(sub: _Subparsers) -> None:
    """`sandgate cleanup`, `cache clear`, `daemon status|stop|start`."""
    cl = sub.add_parser("cleanup", help="remove what killed runs left: placeholders, state, a dead daemon's socket")
    cl.set_defaults(func=_housekeeping)

    ca = sub.add_parser("cache", help="the sandbox's home (caches): writes under ~ kept apart from the real home")
    ca_sub = ca.add_subparsers(dest="cache_command", required=True, parser_class=_Parser)
    cc = ca_sub.add_parser("clear", help="forget everything sandboxed runs wrote under ~")
    cc.add_argument("--user", metavar="USER", help="the home of USER's sandboxed runs (root only)")
    cc.add_argument("--wait", action="store_true", help="wait for running sandboxes to end (default: refuse)")
    cc.set_defaults(func=_housekeeping)

    dm = sub.add_parser("daemon", help="the proxy daemon that serves every sandbox (started on demand)")
    dm_sub = dm.add_subparsers(dest="daemon_command", required=True, parser_class=_Parser)
    for name, text in (
        ("status", "is it running, and for which sandboxes"),
        ("stop", "stop it (running sandboxes lose their network: fail closed)"),
        ("start", "start it now instead of on demand"),
    ):
        d = dm_sub.add_parser(name, help=text)
        d.add_argument("--json", action="store_true", help=argparse.SUPPRESS if name != "status" else "as JSON")
        d.set_defaults(func=_housekeeping)


def _add_trust(sub: _Subparsers) -> None:
    """`sandgate trust` and `sandgate allowlists`."""
    tr = sub.add_parser("trust", help="let ./.sandgate.yaml (or FILE) widen the defaults, until its content changes")
    tr.add_argument("file", nargs="?", metavar="FILE", help="the policy file (default ./.sandgate.yaml)")
    which = tr.add_mutually_exclusive_group()
    which.add_argument("--revoke", action="store_true", help="forget FILE: it only narrows again")
    which.add_argument("--list", action="store_true", help="every trusted file, and whether it changed since")
    tr.set_defaults(func=_trust)

    al = sub.add_parser("allowlists", help="list the bundled allowlists")
    al.set_defaults(func=_allowlists)


def _add_setup(sub: _Subparsers) -> None:
    """`sandgate setup [--remove]`: Windows' one-time, elevated setup (Linux needs none)."""
    st = sub.add_parser("setup", help="Windows only, as administrator: the sandbox user and its WFP filters")
    st.add_argument("--remove", action="store_true", help="remove the firewall rules, WFP filters and sandbox user")
    st.set_defaults(func=_setup)


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", action="append", default=[], metavar="FILE", help="policy file (repeatable)")
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="NAME|HOST[:PORT]",
        help="a bundled allowlist name or a host to allow (repeatable)",
    )
    p.add_argument("--deny", action="append", default=[], metavar="HOST[:PORT]", help="a host to deny (repeatable)")
    p.add_argument(
        "--allow-wide-cidr",
        action="store_true",
        help="accept allow/ask cidrs wider than a /8 (IPv4) or /16 (IPv6), or more than four such in all",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        os.getcwd()
    except FileNotFoundError:  # deleted under the shell: every command resolves paths against it
        errors.fail("the current directory no longer exists; cd to an existing directory and run again")
    try:
        code = int(args.func(args))
        if args.command == "run" and argv is None:
            # Skip the interpreter's teardown of every imported module (~10 ms on each run): nothing
            # is left to clean up, and CMD's status should reach the caller as soon as it is known.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except OSError:
                    pass  # a closed pipe: nothing more to say
            os._exit(code)
        return code
    except PolicyFileError as e:
        errors.fail(f"{e}")
    except UsageError as e:
        errors.fail(str(e))
    except BrokenPipeError:
        return errors.broken_pipe()
    except KeyboardInterrupt:
        return errors.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
