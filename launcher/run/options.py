"""What one `sandgate run` was asked to do: the command line as typed values (made by launcher/cli.py,
the one place argparse reaches) and, checked once in one call (`build`), the record every step after it reads."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.audit import logs as auditlogs
from launcher.config import load as lpolicy
from launcher.errors import RunError, UsageError
from launcher.run.policyargs import PolicyArgs, policy_from_args
from netguard.policy import NetworkPolicy
from netguard.upstreamproxy import Upstream

#: Test-only: sandgate verify's self-test sets this to weaken ONE mechanism and prove that the
#: matching probes then fail. Not a command-line option; announced loudly; never passed inside.
#: Read here only (`Weakenings.read`); every other module gets the record, in RunOptions.
WEAKEN_ENV = "SANDGATE_INTERNAL_WEAKEN"
WEAKENINGS = frozenset({"firewall", "git-hooks", "netadmin", "nested-userns"})


@dataclass(frozen=True)
class Weakenings:
    """The self-test's deliberate holes for this run (none in any real run)."""

    firewall: bool = False  # no network namespace of its own (so no nftables table either)
    git_hooks: bool = False  # .git/hooks writable from inside
    netadmin: bool = False  # CAP_NET_ADMIN kept inside: the command could rewrite its own table
    nested_userns: bool = False  # user namespaces of its own allowed, as --allow-nested-userns

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> Weakenings:
        """The weakenings WEAKEN_ENV names; RunError for a name that is none (a typo must not pass as no hole)."""
        names = frozenset(x for x in environ.get(WEAKEN_ENV, "").split(",") if x)
        if names - WEAKENINGS:
            raise RunError(f"{WEAKEN_ENV} names unknown weakenings {sorted(names - WEAKENINGS)}")
        return cls(**{n.replace("-", "_"): True for n in names})

    def names(self) -> tuple[str, ...]:
        """As WEAKEN_ENV spells them, sorted: for the loud warning."""
        return tuple(sorted(n for n in WEAKENINGS if getattr(self, n.replace("-", "_"))))


@dataclass(frozen=True)
class RunArgs:
    """`sandgate run`'s (and `explain`'s) command line as given: typed, not yet checked."""

    policy: PolicyArgs
    cmd: tuple[str, ...] = ()  # CMD and its arguments, after an optional `--`
    audit_log: str | None = None
    user: str | None = None
    write: tuple[str, ...] = ()
    read_deny: tuple[str, ...] = ()
    expose_socket: tuple[str, ...] = ()
    require_landlock: bool = False
    verbose: bool = False
    learn: bool = False
    ask: bool = False
    ask_timeout: float = 60.0
    approvals: str | None = None
    upstream_ca: str | None = None
    upstream_proxy: str | None = None
    upstream_proxy_by_name: bool = False
    fresh_home: bool = False
    allow_nested_userns: bool = False
    notices: bool = False
    quiet: bool = False
    dry_run: bool = False
    json: bool = False  # explain --json
    transparent: bool = False  # Windows only: WinDivert capture


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
    weak: Weakenings = Weakenings()  # the self-test's deliberate holes (WEAKEN_ENV); none in a real run
    task: str = field(default_factory=lambda: os.urandom(6).hex())  # 12 random hex digits, as uuid4's first 12


def command(args: RunArgs) -> list[str]:
    """CMD and its arguments; a run without one is a usage error."""
    if not args.cmd:
        raise UsageError("no command given: sandgate run [options] -- CMD [ARGS...]")
    return list(args.cmd)


def build(args: RunArgs) -> RunOptions:
    """The run's options in one call: the policy parsed (once, here), every option checked."""
    pol = policy_from_args(args.policy)
    files = list(pol.files)  # --policy files or a trusted ./.sandgate.yaml: "always" answers go to the first
    root_inside = args.user in ("0", "root")
    return RunOptions(
        cmd=list(args.cmd),
        audit_path=(Path(args.audit_log) if args.audit_log else auditlogs.new_path()).absolute(),
        user=None if root_inside and os.geteuid() != 0 else resolve_user(args.user),
        policy=pol,
        policy_file=files[0] if files else None,
        root_inside=root_inside,
        write=args.write,
        read_deny=args.read_deny,
        require_landlock=args.require_landlock,
        quiet=args.quiet,
        verbose=args.verbose,
        learn=args.learn,
        ask=args.ask,
        ask_timeout=args.ask_timeout,
        approvals=_approvals_path(args.approvals),
        upstream_ca=_upstream_ca(args.upstream_ca),
        upstream_ca_file=args.upstream_ca,
        expose=_expose_sockets(args.expose_socket),
        fresh_home=args.fresh_home,
        nested_userns=args.allow_nested_userns,
        upstream_proxy=upstream_proxy(args.upstream_proxy, args.upstream_proxy_by_name),
        notices=args.notices,
        weak=Weakenings.read(),
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
