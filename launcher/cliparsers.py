"""The parsers and dispatch of sandgate's less used commands (audit, housekeeping, trust, setup, explain,
export): built only when one of them runs (launcher/cli.py, the entry, imports this module then), so
`sandgate run` never pays for them. Each dispatcher hands its body typed values (launcher.cliargs.typed),
never the namespace."""

from __future__ import annotations

import argparse

from launcher.cliargs import Parser, Subparsers, policy_args, run_args, run_options, typed, typed_policy


def _housekeeping(args: argparse.Namespace) -> int:
    from launcher.run import housekeeping

    if args.command == "cleanup":
        return housekeeping.cleanup()
    if args.command == "cache":
        return housekeeping.cache_clear(args.user, args.wait)
    return housekeeping.daemon(args.daemon_command, args.json)


def _setup(args: argparse.Namespace) -> int:
    from launcher.run.windows import runner

    return runner.setup(remove=args.remove, transparent=args.transparent)


def _audit(args: argparse.Namespace) -> int:
    from launcher.audit import command

    return command.main(
        args.audit_command,
        tuple(getattr(args, "logs", ())),  # `sandgate audit` alone has no LOG, --json...
        as_json=getattr(args, "json", False),
        as_markdown=getattr(args, "markdown", False),
        name=getattr(args, "name", None),
    )


def _config(args: argparse.Namespace) -> int:
    from launcher.config import commands

    if args.command == "trust":
        return commands.trust(args.file, revoke=args.revoke, list_all=args.list)
    return commands.list_bundled()


def _add_audit(sub: Subparsers) -> None:
    """`sandgate audit [summary|suggest]`."""
    au = sub.add_parser(
        "audit",
        help="read audit logs: what a task reached, and the policy it needed (alone: list the recent runs' logs)",
    )
    au.set_defaults(func=_audit)
    au_sub = au.add_subparsers(dest="audit_command", parser_class=Parser)
    su = au_sub.add_parser("summary", help="one row per destination, riskiest first (default: the last run)")
    su.add_argument("logs", nargs="*", metavar="LOG")
    su.add_argument("--json", action="store_true")
    su.add_argument("--markdown", action="store_true", help="as Markdown, for a CI job summary ($GITHUB_STEP_SUMMARY)")
    su.set_defaults(func=_audit)
    sg = au_sub.add_parser(
        "suggest", help="print a policy that allows exactly what the runs needed (default: the last run)"
    )
    sg.add_argument("logs", nargs="*", metavar="LOG")
    sg.add_argument("--name", help="description for the suggested policy")
    sg.set_defaults(func=_audit)


def _add_housekeeping(sub: Subparsers) -> None:
    """`sandgate cleanup`, `cache clear`, `daemon status|stop|start`."""
    cl = sub.add_parser("cleanup", help="remove what killed runs left: placeholders, state, a dead daemon's socket")
    cl.set_defaults(func=_housekeeping)

    ca = sub.add_parser("cache", help="the sandbox's home (caches): writes under ~ kept apart from the real home")
    ca_sub = ca.add_subparsers(dest="cache_command", required=True, parser_class=Parser)
    cc = ca_sub.add_parser("clear", help="forget everything sandboxed runs wrote under ~")
    cc.add_argument("--user", metavar="USER", help="the home of USER's sandboxed runs (root only)")
    cc.add_argument("--wait", action="store_true", help="wait for running sandboxes to end (default: refuse)")
    cc.set_defaults(func=_housekeeping)

    dm = sub.add_parser("daemon", help="the proxy daemon that serves every sandbox (started on demand)")
    dm_sub = dm.add_subparsers(dest="daemon_command", required=True, parser_class=Parser)
    for name, text in (
        ("status", "is it running, and for which sandboxes"),
        ("stop", "stop it (running sandboxes lose their network: fail closed)"),
        ("start", "start it now instead of on demand"),
    ):
        d = dm_sub.add_parser(name, help=text)
        d.add_argument("--json", action="store_true", help=argparse.SUPPRESS if name != "status" else "as JSON")
        d.set_defaults(func=_housekeeping)


def _add_trust(sub: Subparsers) -> None:
    """`sandgate trust` and `sandgate allowlists`."""
    tr = sub.add_parser("trust", help="let ./.sandgate.yaml (or FILE) widen the defaults, until its content changes")
    tr.add_argument("file", nargs="?", metavar="FILE", help="the policy file (default ./.sandgate.yaml)")
    which = tr.add_mutually_exclusive_group()
    which.add_argument("--revoke", action="store_true", help="forget FILE: it only narrows again")
    which.add_argument("--list", action="store_true", help="every trusted file, and whether it changed since")
    tr.set_defaults(func=_config)

    al = sub.add_parser("allowlists", help="list the bundled allowlists")
    al.set_defaults(func=_config)


def _add_setup(sub: Subparsers) -> None:
    """`sandgate setup [--remove]`: Windows' one-time, elevated setup (Linux needs none)."""
    st = sub.add_parser("setup", help="Windows only, as administrator: the sandbox user and its WFP filters")
    st.add_argument("--remove", action="store_true", help="remove the firewall rules, WFP filters and sandbox user")
    st.add_argument(
        "--transparent",
        action="store_true",
        help="also allow what 'sandgate run --transparent' needs (the proxy's inbound port 3129, this user only)",
    )
    st.set_defaults(func=_setup)


def _explain(args: argparse.Namespace) -> int:
    from launcher import explain

    return explain.main(run_args(args))


def add_explain(sub: Subparsers) -> None:
    """`sandgate explain [run options] [-- CMD]`: the boundary `run` would enforce, nothing started."""
    ex = sub.add_parser(
        "explain",
        help="print the boundary 'sandgate run' would enforce with these options (network too); run nothing",
        usage="sandgate explain [run options] [--json] [-- CMD [ARGS...]]",
    )
    run_options(ex)
    ex.add_argument("--json", action="store_true", help="one JSON document instead of text")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")
    ex.set_defaults(func=_explain, dry_run=True)


def _export(args: argparse.Namespace) -> int:
    from launcher import exportcmd

    return exportcmd.main(typed(exportcmd.ExportArgs, args, policy=typed_policy(args)))


def add_export(sub: Subparsers) -> None:
    """`sandgate export cilium|smokescreen|cnp [policy options]`: the policy for another egress engine."""
    ex = sub.add_parser(
        "export",
        help="print the policy's network allowlist for another egress engine (Cilium, Smokescreen) as YAML",
        usage="sandgate export {cilium,smokescreen,cnp} [--policy FILE | --allow X]... [options]",
    )
    ex.add_argument("engine", choices=("cilium", "smokescreen", "cnp"), help="the engine (cnp: not yet, says why)")
    policy_args(ex)
    ex.add_argument("--learn", action="store_true", help="as for a --learn run (Smokescreen: action report)")
    ex.add_argument("--name", help="the CiliumNetworkPolicy's name, or the Smokescreen service's")
    ex.add_argument("--namespace", metavar="NS", help="cilium: the policy's namespace")
    ex.add_argument(
        "--selector", action="append", default=[], metavar="LABEL=VALUE", help="cilium: the pods it applies to"
    )
    ex.add_argument(
        "--cilium-version", metavar="X.Y", help="cilium: the target version (default 1.19: '**.' wildcards)"
    )
    ex.add_argument("--project", help="smokescreen: the service's project (owner; default sandgate)")
    ex.set_defaults(func=_export)
