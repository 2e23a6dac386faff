"""`sandgate` command line: parsing and dispatch (bodies live in their rooms); errors become one line here.

argparse stops here (and in launcher/cliparsers.py): each command's body gets typed frozen records,
made from the parsed namespace in one call (`typed`), never the namespace itself."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from launcher import errors, gcpause, timings
from launcher.config.errors import PolicyFileError
from launcher.errors import UsageError
from netguard.hosts import split_host_port
from sgbase import dataclasscache


class _Parser(argparse.ArgumentParser):
    building = False  # while build_parser runs (class-wide: the subcommands' parsers too)
    partial = False  # built for one command only: an error's usage line is the full one

    def error(self, message: str) -> NoReturn:  # argparse exits 2; a wrapper tool must not collide with CMD's codes
        if "invalid choice" in message:  # a typo of a subcommand: one line with the closest name
            from launcher import didyoumean

            if (guessed := didyoumean.invalid_choice(message)) is not None:
                errors.fail(guessed)
        (build_parser() if self.partial else self).print_usage(sys.stderr)
        errors.fail(message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        """While building, a fixed width: add_argument formats each option as a check (not the terminal's, via shutil)."""
        return argparse.HelpFormatter(self.prog, width=80) if _Parser.building else super()._get_formatter()


if TYPE_CHECKING:
    from launcher.run.options import RunArgs
    from launcher.run.policyargs import PolicyArgs

    _Subparsers = argparse._SubParsersAction[_Parser]


def parse_addr(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or PORT."""
    host, port = split_host_port(text)
    if port is None and not text.startswith("["):
        host, port = default_host, text  # PORT alone
    if port is None or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"invalid address '{text}': expected HOST:PORT with a port from 1 to 65535")
    return host, int(port)


# ---- the namespace as typed records ------------------------------------------------------------


def typed[R](make: Callable[..., R], args: argparse.Namespace, **given: object) -> R:
    """The frozen dataclass `make` from the options it names, in one call: lists become tuples; an
    option this command lacks keeps the record's default; `given` fields are set as passed."""
    names: dict[str, object] = vars(make)["__dataclass_fields__"]
    found = {n: getattr(args, n) for n in names if n not in given and hasattr(args, n)}
    return make(**{n: tuple(v) if isinstance(v, list) else v for n, v in found.items()}, **given)


def typed_policy(args: argparse.Namespace) -> PolicyArgs:
    """--policy/--allow/--deny... of `run`, `explain`, `proxy` or `export`."""
    from launcher.run.policyargs import PolicyArgs

    return typed(PolicyArgs, args)


def run_args(args: argparse.Namespace) -> RunArgs:
    """`run`'s or `explain`'s options; CMD without its `--`."""
    from launcher.run.options import RunArgs

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return typed(RunArgs, args, policy=typed_policy(args), cmd=tuple(cmd))


# ---- dispatch: each subcommand's body lives in its room, imported only when it runs ----------


def _run(args: argparse.Namespace) -> int:
    if args.dry_run:  # the boundary only: nothing is started, on any platform
        from launcher import explain

        return explain.main(run_args(args))
    if sys.platform == "win32":  # before the Linux room, whose modules import pwd, fcntl, termios
        from launcher.run.windows import runner

        return runner.run(run_args(args))  # seam.run_in with the Windows backend (docs/windows.md)
    from launcher.run import launch

    timings.mark("imports")
    dataclasscache.save()  # a no-op unless a record class was compiled (a first run, an edited module)
    gcpause.resume()
    return launch.main(run_args(args))


def _proxy(args: argparse.Namespace) -> int:
    from launcher.run import proxy

    return proxy.main(typed(proxy.ProxyArgs, args, policy=typed_policy(args)), parse_addr)


def cmd_verify(args: argparse.Namespace) -> int:
    """`sandgate verify`: the one place the product reaches the self-test (selftest/, the proof, apart from the run path)."""
    if sys.platform == "win32":  # the Windows probe bodies, run through the Windows backend (issue 28, W3)
        from selftest.windows import verifyrun

        return verifyrun.main(tuple(args.policy), args.json, args.only)
    from selftest import command

    return command.main(tuple(args.policy), args.json, args.only)


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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's options; each sets `func`, the room that does the work. With `command` (the
    first word of the command line, if it names one) only its options: `run` need not build all (~2 ms)."""
    only = _adder(_COMMANDS[command]) if command in _COMMANDS else None
    _Parser.building = True
    p = _Parser(prog="sandgate", description="Run untrusted commands behind a kernel-enforced allowlist.")
    p.partial = only is not None
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in [only] if only is not None else [_adder(n) for n in dict.fromkeys(_COMMANDS.values())]:
        add(sub)
    _Parser.building = False
    return p


def _add_proxy(sub: _Subparsers) -> None:
    """`sandgate proxy`: explicit mode on TCP listeners."""
    px = sub.add_parser("proxy", help="run the allowlisting egress proxy alone (explicit mode) until Ctrl-C")
    policy_args(px)
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
    upstream_proxy_args(px)
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


def upstream_proxy_args(p: argparse.ArgumentParser) -> None:
    """`run` and `proxy`: the corporate proxy the daemon tunnels allowed connections through (docs/upstream-proxy.md)."""
    p.add_argument(
        "--upstream-proxy",
        metavar="URL|none",
        help="tunnel allowed connections through this corporate HTTP proxy (http://[user:pass@]host:port); "
        "default: HTTPS_PROXY/HTTP_PROXY/NO_PROXY of this environment; none: go direct",
    )
    p.add_argument(
        "--upstream-proxy-by-name",
        action="store_true",
        help="ask the upstream proxy for host:port by name (it resolves; the checked-address pin no longer holds)",
    )


def _add_run(sub: _Subparsers) -> None:
    """`sandgate run [options] -- CMD`."""
    rn = sub.add_parser(
        "run",
        help="run CMD in a sandbox whose only way out is the allowlisting proxy",
        usage="sandgate run [options] -- CMD [ARGS...]",
    )
    run_options(rn)
    rn.add_argument(
        "--dry-run", action="store_true", help="print the effective boundary (as 'sandgate explain') and run nothing"
    )
    rn.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")
    rn.set_defaults(func=_run)


def run_options(rn: argparse.ArgumentParser) -> None:
    """Every option of `run` but CMD: `sandgate explain` takes the same, so it explains what run would do."""
    policy_args(rn)
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
    boundary_args(rn)
    rn.add_argument("-v", "--verbose", action="store_true", help="print the effective boundary (network too) at start")
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
    upstream_proxy_args(rn)
    rn.add_argument(
        "--fresh-home",
        action="store_true",
        help="start ~ from the real home alone, without this workspace's layer; drop what the run writes there",
    )
    rn.add_argument("--allow-nested-userns", action="store_true", help="let CMD make user namespaces of its own")
    rn.add_argument(
        "--notices",
        action="store_true",
        help="tell CMD what was denied: one JSON line per denial in the read-only file $SANDGATE_NOTICES",
    )
    rn.add_argument("-q", "--quiet", action="store_true", help="no summary line at exit")
    if sys.platform == "win32":  # Windows-only flags (launcher/cliparsers.py); off Windows, not imported
        from launcher.cliparsers import windows_run_args

        windows_run_args(rn)


def boundary_args(p: argparse.ArgumentParser) -> None:
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


def policy_args(p: argparse.ArgumentParser) -> None:
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


# Each command's first word -> the name of what adds its parser (one adder may add several commands).
# `run` and `proxy` are here; the others in launcher/cliparsers.py, imported only when one of them runs.
_COMMANDS = {"proxy": "_add_proxy", "run": "_add_run", "explain": "add_explain", "verify": "_add_verify"}
_COMMANDS.update(audit="_add_audit", cleanup="_add_housekeeping", cache="_add_housekeeping")
_COMMANDS.update(daemon="_add_housekeeping", trust="_add_trust", allowlists="_add_trust", setup="_add_setup")
_COMMANDS.update(completion="add_completion", export="add_export")


def _adder(name: str) -> Callable[[_Subparsers], None]:
    if name in globals():
        found: Callable[[_Subparsers], None] = globals()[name]
        return found
    from launcher import cliparsers

    found = getattr(cliparsers, name)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    timings.mark("cli-imported")
    args = build_parser(next(iter(sys.argv[1:] if argv is None else argv), None)).parse_args(argv)
    timings.mark("parsed")
    if args.command != "run":
        gcpause.resume()  # `sandgate proxy` serves until Ctrl-C; `run` resumes it after its own imports
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
            timings.mark("exit")
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
