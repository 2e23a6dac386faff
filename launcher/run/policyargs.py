"""--policy, --allow and --deny (or, with none, ./.sandgate.yaml) -> the one Policy a run or a proxy enforces."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.config import checks as policychecks
from launcher.config import load as lpolicy
from launcher.config import userconfig
from launcher.errors import UsageError


@dataclass(frozen=True)
class PolicyArgs:
    """The policy options as given (`run`, `explain`, `proxy`, `export`), and the few others it depends on."""

    command: str  # the subcommand: only run and explain may go without any policy
    policy: tuple[str, ...] = ()  # --policy FILE...
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    allow_wide_cidr: bool = False
    user: str | None = None  # run --user: whose home the checks resolve ~ in
    write: tuple[str, ...] = ()  # run --write: the trust list must not be writable from inside
    learn: bool = False  # for the no-policy notice
    quiet: bool = False


def policy_from_args(args: PolicyArgs) -> lpolicy.Policy:
    """--policy files and --allow/--deny; with neither, ./.sandgate.yaml, which only narrows until trusted."""
    files = [Path(p) for p in args.policy]
    # A directory there is another live run's placeholder (fsguard.policy.SANDGATE_PROTECT), not a policy.
    implicit = (
        not files and not args.allow and os.path.lexists(".sandgate.yaml") and not os.path.isdir(".sandgate.yaml")
    )
    user = userconfig.find()  # the user's own defaults, trusted: below everything else
    if not files and not args.allow and not implicit and user is None:
        _no_policy(args)
    checks = policychecks.Checks.current(allow_wide_cidr=args.allow_wide_cidr, user=args.user)
    store = None
    if implicit:  # only a workspace file pays for the trust list
        from launcher.config import trust

        writable = tuple(Path(os.path.expanduser(w)).absolute() for w in args.write)  # run --write
        store = trust.Store.default(writable)
    pol = lpolicy.build_policy(
        files,
        list(args.allow),
        list(args.deny),
        workspace=Path(".sandgate.yaml") if implicit else None,
        store=store,
        checks=checks,
        user=user,
    )
    if pol.narrowed is not None and pol.narrowed.ignored:
        print(pol.narrowed.notice(), file=sys.stderr)
    return pol


def _no_policy(args: PolicyArgs) -> None:
    """No policy at all: a proxy would reach nothing (refused); a run gets no network (said once)."""
    if args.command not in ("run", "explain"):  # explain: what a run with these options would get
        raise UsageError(
            "no policy: give --policy FILE or --allow NAME (see 'sandgate allowlists'); nothing would be reachable"
        )
    if args.learn:
        print(
            "sandgate: no policy given: learn mode lets every destination through and records it "
            "(then: sandgate audit suggest LOG)",
            file=sys.stderr,
        )
    elif not args.quiet:
        print(
            "sandgate: no policy given: the command gets no network (allow destinations with --allow NAME "
            "or --policy FILE; see 'sandgate allowlists')",
            file=sys.stderr,
        )
