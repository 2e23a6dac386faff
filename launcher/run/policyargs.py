"""--policy, --allow and --deny (or, with none, ./.sandgate.yaml) -> the one Policy a run or a proxy enforces."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from launcher.config import checks as policychecks
from launcher.config import load as lpolicy
from launcher.config import userconfig
from launcher.errors import UsageError


def policy_from_args(args: argparse.Namespace) -> lpolicy.Policy:
    """--policy files and --allow/--deny; with neither, ./.sandgate.yaml, which only narrows until trusted."""
    from launcher.config import trust

    files = [Path(p) for p in args.policy]
    # A directory there is another live run's placeholder (fsguard.policy.SANDGATE_PROTECT), not a policy.
    implicit = (
        not files and not args.allow and os.path.lexists(".sandgate.yaml") and not os.path.isdir(".sandgate.yaml")
    )
    user = userconfig.find()  # the user's own defaults, trusted: below everything else
    if not files and not args.allow and not implicit and user is None:
        _no_policy(args)
    checks = policychecks.Checks.current(
        allow_wide_cidr=getattr(args, "allow_wide_cidr", False), user=getattr(args, "user", None)
    )
    writable = tuple(Path(os.path.expanduser(w)).absolute() for w in getattr(args, "write", ()))  # run --write
    pol = lpolicy.build_policy(
        files,
        args.allow,
        args.deny,
        workspace=Path(".sandgate.yaml") if implicit else None,
        store=trust.Store.default(writable) if implicit else None,
        checks=checks,
        user=user,
    )
    if pol.narrowed is not None and pol.narrowed.ignored:
        print(pol.narrowed.notice(), file=sys.stderr)
    return pol


def _no_policy(args: argparse.Namespace) -> None:
    """No policy at all: a proxy would reach nothing (refused); a run gets no network (said once)."""
    if args.command not in ("run", "explain"):  # explain: what a run with these options would get
        raise UsageError(
            "no policy: give --policy FILE or --allow NAME (see 'sandgate allowlists'); nothing would be reachable"
        )
    if getattr(args, "learn", False):
        print(
            "sandgate: no policy given: learn mode lets every destination through and records it "
            "(then: sandgate audit suggest LOG)",
            file=sys.stderr,
        )
    elif not getattr(args, "quiet", False):
        print(
            "sandgate: no policy given: the command gets no network (allow destinations with --allow NAME "
            "or --policy FILE; see 'sandgate allowlists')",
            file=sys.stderr,
        )
