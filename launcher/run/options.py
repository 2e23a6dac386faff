"""What one `sandgate run` was asked to do, as a typed record built once from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.audit import logs as auditlogs
from launcher.config import load as lpolicy
from launcher.errors import RunError, UsageError
from netguard.policy import NetworkPolicy
from netguard.upstreamproxy import Upstream

#: Test-only: sandgate verify's self-test sets this to weaken ONE mechanism and prove that the
#: matching probes then fail. Not a command-line option; announced loudly; never passed inside.
WEAKEN_ENV = "SANDGATE_INTERNAL_WEAKEN"
WEAKENINGS = frozenset({"firewall", "git-hooks", "netadmin", "nested-userns"})


def weakened() -> frozenset[str]:
    value = os.environ.get(WEAKEN_ENV, "")
    names = frozenset(x for x in value.split(",") if x)
    if names - WEAKENINGS:
        raise RunError(f"{WEAKEN_ENV} names unknown weakenings {sorted(names - WEAKENINGS)}")
    return names


@dataclass
class User:
    """The host account CMD runs as."""

    uid: int
    gid: int
    name: str
    home: str
    groups: list[int] = field(default_factory=list)


@dataclass
class RunOptions:
    """`sandgate run`'s command line, parsed and checked once, for every step after it."""

    cmd: list[str]
    audit_path: Path
    user: User | None  # the host user CMD runs as; None: whoever started sandgate
    policy: lpolicy.Policy = field(default_factory=lambda: lpolicy.Policy(NetworkPolicy(), ()))
    policy_file: Path | None = None  # the first --policy file: where "always" answers are written
    root_inside: bool = False  # --user 0/root: uid 0 inside the sandbox's user namespace
    write: tuple[str, ...] = ()  # --write
    read_deny: tuple[str, ...] = ()  # --read-deny
    require_landlock: bool = False
    learn: bool = False  # let default-deny names through, recorded as would: deny
    ask: bool = False  # every default-deny name is a question for a human
    ask_timeout: float = 60.0
    approvals: str | None = None  # unix socket path for an embedding tool; None: the terminal
    quiet: bool = False
    verbose: bool = False
    upstream_ca: str | None = None  # --upstream-ca: PEM roots for inspected upstreams, besides the host's
    upstream_ca_file: str | None = None  # --upstream-ca FILE as named: held read-only inside (run/configfiles.py)
    expose: tuple[str, ...] = ()  # --expose-socket: absolute paths of unix sockets shown inside though hidden
    fresh_home: bool = False  # --fresh-home: ~ is the real home under an empty layer, dropped at exit
    nested_userns: bool = False  # --allow-nested-userns: the command may make user namespaces of its own
    upstream_proxy: Upstream | None = None  # --upstream-proxy or HTTPS_PROXY...: the daemon's corporate proxy
    notices: bool = False  # --notices: the run's denials as JSON lines the command reads (run/notices.py)
    task: str = field(default_factory=lambda: os.urandom(6).hex())  # 12 random hex digits, as uuid4's first 12


def command(args: argparse.Namespace) -> list[str]:
    """CMD and its arguments, after an optional `--`."""
    cmd: list[str] = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given: sandgate run [options] -- CMD [ARGS...]")
    return cmd


def from_args(args: argparse.Namespace, cmd: list[str], pol: lpolicy.Policy) -> RunOptions:
    """The run's options; the policy was already parsed (once, by the caller)."""
    files = list(pol.files)  # --policy files or a trusted ./.sandgate.yaml: "always" answers go to the first
    root_inside = args.user in ("0", "root")
    return RunOptions(
        cmd=cmd,
        audit_path=(Path(args.audit_log) if args.audit_log else auditlogs.new_path()).absolute(),
        user=None if root_inside and os.geteuid() != 0 else resolve_user(args.user),
        policy=pol,
        policy_file=files[0] if files else None,
        root_inside=root_inside,
        write=tuple(args.write),
        read_deny=tuple(args.read_deny),
        require_landlock=args.require_landlock,
        quiet=args.quiet,
        verbose=args.verbose,
        learn=args.learn,
        ask=args.ask,
        ask_timeout=args.ask_timeout,
        approvals=_approvals_path(args.approvals),
        upstream_ca=_upstream_ca(getattr(args, "upstream_ca", None)),
        upstream_ca_file=getattr(args, "upstream_ca", None),
        expose=_expose_sockets(getattr(args, "expose_socket", None) or ()),
        fresh_home=bool(getattr(args, "fresh_home", False)),
        nested_userns=bool(getattr(args, "allow_nested_userns", False)),
        upstream_proxy=upstream_proxy(
            getattr(args, "upstream_proxy", None), getattr(args, "upstream_proxy_by_name", False)
        ),
        notices=bool(getattr(args, "notices", False)),
    )


def upstream_proxy(option: str | None, by_name: bool = False) -> Upstream | None:
    """The corporate proxy the daemon tunnels this run's allowed flows through: `--upstream-proxy URL|none`,
    else HTTPS_PROXY / HTTP_PROXY / NO_PROXY of sandgate's own environment (netguard.upstreamproxy).
    `by_name` (--upstream-proxy-by-name): the CONNECT names the host, for proxies that must resolve it."""
    from netguard import upstreamproxy

    try:
        up = upstreamproxy.choose(option, os.environ)
    except upstreamproxy.UpstreamError as e:
        raise UsageError(f"{e} (or --upstream-proxy none to go direct)") from None
    return dataclasses.replace(up, by_name=True) if up is not None and by_name else up


def _expose_sockets(paths: Sequence[str]) -> tuple[str, ...]:
    """--expose-socket paths, absolute; checked here (before a daemon starts) to be unix sockets.
    Whether one may be exposed at all (never a daemon's) is confinement.py's, with the runtime dirs."""
    out = []
    for p in paths:
        try:
            is_sock = stat.S_ISSOCK(os.stat(p).st_mode)
        except (OSError, ValueError):
            is_sock = False
        if not is_sock:
            raise UsageError(f"--expose-socket {p}: not an existing unix socket")
        out.append(os.path.abspath(p))
    return tuple(dict.fromkeys(out))


def _upstream_ca(path: str | None) -> str | None:
    if path is None:
        return None
    from launcher.run import inspection

    return inspection.read_upstream_ca(path)


def _approvals_path(spec: str | None) -> str | None:
    if spec is None:
        return None
    if not spec.startswith("unix:") or not spec[5:].startswith("/"):
        raise UsageError(f"invalid --approvals '{spec}': use unix:/absolute/path/to/socket")
    if not Path(spec[5:]).parent.is_dir():
        raise UsageError(f"--approvals: directory {Path(spec[5:]).parent} does not exist")
    return spec[5:]


def resolve_user(spec: str | None) -> User | None:
    """--user NAME|UID, else the sudo caller (SUDO_UID), else None (stay root)."""
    import pwd  # here: this module is also the Windows runner's (launcher/run/windows), which has no pwd

    try:
        if spec is not None:
            pw = pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
        elif os.geteuid() == 0 and os.environ.get("SUDO_UID", "0") not in ("", "0"):
            pw = pwd.getpwuid(int(os.environ["SUDO_UID"]))
        else:
            return None
    except (KeyError, ValueError):
        raise RunError(f"unknown user '{spec}'; give a user name or uid that exists on this machine") from None
    return User(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir, os.getgrouplist(pw.pw_name, pw.pw_gid))
