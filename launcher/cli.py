"""`sandgate` command line, the entry: the parser of `run`, `proxy`, `verify` and `completion`, and
dispatch (bodies live in their rooms); errors become one line here. The less used commands' parsers are
in launcher/cliparsers.py, imported only when one of them runs; what both share, in launcher/cliargs.py.

argparse stops here (and in those two): each command's body gets typed frozen records, made from the
parsed namespace in one call (`cliargs.typed`), never the namespace itself."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from launcher import errors, gcpause, timings
from launcher.cliargs import (
    Parser,
    Subparsers,
    policy_args,
    run_args,
    run_options,
    typed,
    typed_policy,
    upstream_proxy_args,
)
from launcher.config.errors import PolicyFileError
from launcher.errors import UsageError
from netguard.hosts import split_host_port
from sgbase import dataclasscache


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
    if args.dry_run:  # the boundary only: nothing is started, on any platform
        from launcher import explain

        return explain.main(run_args(args))
    if sys.platform == "win32":  # before the Linux room, whose modules import pwd, fcntl, termios
        from launcher.run.windows import runner

        return runner.run(run_args(args))  # seam.run_in with the Windows backend (docs/windows.md)
    from launcher.run import launch

    timings.mark("imports")
    dataclasscache.save()  # a no-op unless a record class was compiled (a first run, an edited module)
    return launch.main(run_args(args))  # it resumes the collector once the policy is compiled


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
    Parser.building = True
    p = Parser(prog="sandgate", description="Run untrusted commands behind a kernel-enforced allowlist.")
    p.full = build_parser if only is not None else None  # an error's usage line is the full one
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in [only] if only is not None else [_adder(n) for n in dict.fromkeys(_COMMANDS.values())]:
        add(sub)
    Parser.building = False
    return p


def _add_proxy(sub: Subparsers) -> None:
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


def _add_run(sub: Subparsers) -> None:
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


def _add_verify(sub: Subparsers) -> None:
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


def _completion(args: argparse.Namespace) -> int:
    from launcher import completion

    return completion.main(args.shell, build_parser())  # the whole parser: every command is completed


def _add_completion(sub: Subparsers) -> None:
    """`sandgate completion bash|zsh|fish`."""
    co = sub.add_parser(
        "completion",
        help="print a shell completion script (e.g. sandgate completion bash > ~/.local/share/bash-completion/completions/sandgate)",
    )
    co.add_argument("shell", choices=("bash", "zsh", "fish"))
    co.set_defaults(func=_completion)


# Each command's first word -> the name of what adds its parser (one adder may add several commands).
# `run`, `proxy`, `verify` and `completion` are here (they need this module's build_parser and cmd_verify);
# the others in launcher/cliparsers.py, imported only when one of them runs.
_COMMANDS = {"proxy": "_add_proxy", "run": "_add_run", "explain": "add_explain", "verify": "_add_verify"}
_COMMANDS.update(audit="_add_audit", cleanup="_add_housekeeping", cache="_add_housekeeping")
_COMMANDS.update(daemon="_add_housekeeping", trust="_add_trust", allowlists="_add_trust", setup="_add_setup")
_COMMANDS.update(completion="_add_completion", export="add_export")


def _adder(name: str) -> Callable[[Subparsers], None]:
    if name in globals():
        found: Callable[[Subparsers], None] = globals()[name]
        return found
    from launcher import cliparsers

    found = getattr(cliparsers, name)
    return found


#: Parsers built ahead, by the first word of a command line: a fork server's (launcher/forkserver/)
#: `run` parser, built once and used by each worker it forks (each parses one command line, in its own copy).
PREBUILT: dict[str | None, argparse.ArgumentParser] = {}


def main(argv: Sequence[str] | None = None) -> int:
    timings.mark("cli-imported")
    first = next(iter(sys.argv[1:] if argv is None else argv), None)
    args = (PREBUILT.get(first) or build_parser(first)).parse_args(argv)
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
