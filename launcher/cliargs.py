"""What several commands' parsers share, below both launcher/cli.py (the entry, `run` and `proxy`) and
launcher/cliparsers.py (the less used commands): the parser class, the option groups `run`, `explain`,
`proxy` and `export` have in common, and the namespace as typed records (`typed`), made in one call.

argparse stops here and in those two: each command's body gets typed frozen records, never the namespace."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from launcher import errors

if TYPE_CHECKING:
    from launcher.run.options import RunArgs
    from launcher.run.policyargs import PolicyArgs


class Parser(argparse.ArgumentParser):
    building = False  # while the CLI builds its parser (class-wide: the subcommands' parsers too)
    full: Callable[[], argparse.ArgumentParser] | None = None  # built for one command only: the full one, for usage

    def error(self, message: str) -> NoReturn:  # argparse exits 2; a wrapper tool must not collide with CMD's codes
        if "invalid choice" in message:  # a typo of a subcommand: one line with the closest name
            from launcher import didyoumean

            if (guessed := didyoumean.invalid_choice(message)) is not None:
                errors.fail(guessed)
        (self.full() if self.full is not None else self).print_usage(sys.stderr)
        errors.fail(message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        """While building, a fixed width: add_argument formats each option as a check (not the terminal's, via shutil)."""
        return argparse.HelpFormatter(self.prog, width=80) if Parser.building else super()._get_formatter()


type Subparsers = argparse._SubParsersAction[Parser]


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


# ---- the option groups -------------------------------------------------------------------------


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
    if sys.platform == "win32":  # Windows-only flags; off Windows, never added
        windows_run_args(rn)


def windows_run_args(rn: argparse.ArgumentParser) -> None:
    """`sandgate run`'s Windows-only options (added only on Windows: Linux captures transparently always)."""
    rn.add_argument(
        "--transparent",
        action="store_true",
        help="also capture connections that ignore HTTP(S)_PROXY into the proxy (WinDivert; elevated "
        "terminal and 'sandgate setup --transparent' needed)",
    )


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
