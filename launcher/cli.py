"""`sandgate` command line: argument parsing and the one place where errors become one line + exit 125."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import NoReturn

from launcher.config import bundled as allowlists
from launcher.config import checks as policychecks
from launcher.config import load as lpolicy
from launcher.config import parsecache, yamlfile
from launcher.config.errors import PolicyFileError
from netguard.hosts import split_host_port

EXIT_SANDGATE_ERROR = 125  # like env(1)/timeout(1): the tool failed, not the command


class UsageError(Exception):
    """A user mistake outside policy files (bad address, missing privilege...)."""


def _fail(message: str) -> NoReturn:
    print(f"sandgate: error: {message}", file=sys.stderr)
    sys.exit(EXIT_SANDGATE_ERROR)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2; a wrapper tool must not collide with CMD's codes
        self.print_usage(sys.stderr)
        _fail(message)


def parse_addr(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or PORT."""
    host, port = split_host_port(text)
    if port is None and not text.startswith("["):
        host, port = default_host, text  # PORT alone
    if port is None or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"invalid address '{text}': expected HOST:PORT with a port from 1 to 65535")
    return host, int(port)


def default_audit_path() -> Path:
    from launcher.audit import logs as auditlogs

    return auditlogs.new_path()


def _policy_from_args(args: argparse.Namespace) -> lpolicy.Policy:
    """--policy files and --allow/--deny; with neither, ./.sandgate.yaml, which only narrows until trusted."""
    from launcher.config import trust

    files = [Path(p) for p in args.policy]
    implicit = not files and not args.allow and os.path.lexists(".sandgate.yaml")
    if not files and not args.allow and not implicit:
        if args.command != "run":
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
    )
    if pol.narrowed is not None and pol.narrowed.ignored:
        print(pol.narrowed.notice(), file=sys.stderr)
    return pol


def cmd_proxy(args: argparse.Namespace) -> int:
    """Run the allowlisting proxy alone until Ctrl-C, for containers or CI jobs routed through it."""
    import asyncio

    from netguard import rules
    from netguard.audit import AuditLog
    from netguard.proxy import standalone as proxy
    from netguard.proxy.binding import Binding

    pol = _policy_from_args(args)
    listeners = proxy.Listeners(
        regular=parse_addr(args.listen),
        transparent=parse_addr(args.transparent) if args.transparent else None,
        dns=parse_addr(args.dns) if args.dns else None,
    )
    audit_path = Path(args.audit_log) if args.audit_log else default_audit_path()
    try:
        audit = AuditLog(audit_path)
    except OSError as e:
        raise UsageError(f"cannot open audit log {audit_path}: {e.strerror}; choose another --audit-log") from None
    from netguard.asking import Approver

    approver = Approver(args.approval_socket, args.ask_timeout) if args.approval_socket else None
    binding = Binding(
        args.task or uuid.uuid4().hex[:12],
        rules.compile_policy(pol.network),
        audit,
        learn=args.learn,
        ask_all=args.ask_all,
        approver=approver,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready() -> None:
            if args.ready_fd is not None:  # the launcher waits on this pipe
                os.write(args.ready_fd, b"ready\n")
                os.close(args.ready_fd)
            if not args.quiet:
                where = ", ".join(spec for spec, _ in listeners.modes())
                print(
                    f"sandgate: proxy ready on {where}; policy: {', '.join(pol.sources)}; audit: {audit_path}",
                    file=sys.stderr,
                    flush=True,
                )

        await proxy.serve([(listeners, binding)], ready=ready, stop=stop)

    try:
        asyncio.run(main())
    except proxy.ProxyError as e:
        raise UsageError(str(e)) from None
    finally:
        audit.close()
    if not args.quiet:
        c = audit.counts
        print(f"sandgate: {c.get('allow', 0)} allowed, {c.get('deny', 0)} denied -> {audit_path}", file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from fsguard import mounts
    from fsguard import policy as fspolicy
    from launcher import run
    from netguard import nft, sandboxnet
    from netguard.policyerror import PolicyError

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given: sandgate run [options] -- CMD [ARGS...]")
    from netguard.proxy import control

    try:
        parsecache.CACHE_DIR = control.runtime_dir() / "policy-cache"  # hidden from every sandbox
    except control.ControlError as e:
        raise UsageError(str(e)) from None
    pol = _policy_from_args(args)  # parsed once, here: the daemon gets the compiled result, never YAML
    files = list(pol.files)  # --policy files or a trusted ./.sandgate.yaml: "always" answers go to the first
    root_inside = args.user in ("0", "root")
    opts = run.RunOptions(
        cmd=cmd,
        audit_path=(Path(args.audit_log) if args.audit_log else default_audit_path()).absolute(),
        user=None if root_inside and os.geteuid() != 0 else run.resolve_user(args.user),
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
    )
    for p in (*args.write, *args.read_deny):
        try:
            fspolicy.check_path(p, None, must_not_be_root=True)
        except PolicyError as e:
            raise UsageError(f"--write/--read-deny {e}") from None
    _check_write_roots(args, pol)
    try:
        return run.run(opts)
    except (run.RunError, nft.NftError, sandboxnet.SandboxNetError) as e:
        raise UsageError(str(e)) from None
    except mounts.MountError as e:
        raise UsageError(e.strerror or str(e)) from None


def _check_write_roots(args: argparse.Namespace, pol: lpolicy.Policy) -> None:
    """Never `/`, a home or a directory holding one as a writable root, by default or by --write.

    The threat: from `cd / && sandgate run` or `cd ~`, the default writable workspace would let a
    command plant ~/.bashrc, ~/.ssh/authorized_keys or /etc files that run outside the sandbox.
    """
    checks = policychecks.Checks.current(user=getattr(args, "user", None))
    if pol.filesystem.write is None and (problem := policychecks.write_root_problem(".", checks)) is not None:
        raise UsageError(
            f"the current directory {os.getcwd()} would be writable, and it is "
            f"{problem.split(' is ', 1)[1].split(':', 1)[0]}; run sandgate from a project directory, "
            "or name what the command may write with --write or a policy's filesystem.write"
        )
    for w in args.write:
        if (problem := policychecks.write_root_problem(w, checks)) is not None:
            raise UsageError(f"--write {problem.split('entry ', 1)[1]}")


def _approvals_path(spec: str | None) -> str | None:
    if spec is None:
        return None
    if not spec.startswith("unix:") or not spec[5:].startswith("/"):
        raise UsageError(f"invalid --approvals '{spec}': use unix:/absolute/path/to/socket")
    if not Path(spec[5:]).parent.is_dir():
        raise UsageError(f"--approvals: directory {Path(spec[5:]).parent} does not exist")
    return spec[5:]


def cmd_audit(args: argparse.Namespace) -> int:
    from launcher.audit import logs as auditlogs
    from launcher.audit import suggest, summary
    from netguard import audit, rules

    if args.audit_command is None:  # `sandgate audit`: the recent runs' logs
        logs = auditlogs.recent()
        if not logs:
            print(f"sandgate: no audit logs in {auditlogs.log_dir()}", file=sys.stderr)
        for mtime, size, path in logs:
            stamp = datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {size / 1024:8.1f} KiB  {path}")
        return 0
    paths = [Path(p) for p in args.logs]
    if not paths:
        last = auditlogs.latest()
        if last is None:
            raise UsageError(
                f"no audit logs in {auditlogs.log_dir()}; name one: sandgate audit {args.audit_command} LOG"
            )
        paths = [last]
    try:
        records = auditlogs.read_logs(paths)
    except audit.LogError as e:
        raise UsageError(str(e)) from None
    from netguard import policy as netpolicy

    bundled = {
        n: rules.compile_policy(netpolicy.merge([s.network for s in lpolicy.load_policy_file(p)]))
        for n in allowlists.bundled_names()
        if (p := allowlists.bundled_path(n)) is not None
    }
    if args.audit_command == "summary":
        rows = summary.summarize(records)
        if args.json:
            print(json.dumps(summary.as_json(rows, bundled), indent=1))
        else:
            print(summary.format_table(rows, bundled))
        return 0
    sys.stdout.write(suggest.suggest(records, name=args.name, bundled=bundled))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from launcher.selftest import verify

    for p in args.policy:
        lpolicy.build_policy([Path(p)], [], [])  # a policy error is reported before any namespace exists
    if shutil.which("nft") is None:
        raise UsageError("nft not found; install nftables (apt-get install nftables)")
    try:
        return verify.main([Path(p) for p in args.policy], args.json, args.only)
    except verify.VerifyError as e:
        raise UsageError(str(e)) from None


def cmd_cleanup(args: argparse.Namespace) -> int:
    from launcher import runstate
    from netguard.proxy import control

    try:
        rt = control.runtime_dir()
    except control.ControlError as e:
        raise UsageError(str(e)) from None
    with runstate.lock(rt):  # never between another run's placeholder creation and its state file
        removed = runstate.cleanup_stale(rt)
    for sock in sorted(rt.glob("daemon-*.sock")):  # every netns and code version's daemon
        try:
            control.ControlClient.connect(sock, timeout=2.0).close()
        except (OSError, control.ControlError):
            sock.unlink(missing_ok=True)  # a dead daemon's socket
            removed.append(f"dead daemon socket {sock}")
    if os.geteuid() == 0 and shutil.which("ip"):
        from launcher.selftest import netns as world

        removed += world.cleanup_stale(world.VERIFY_PREFIXES)  # worlds of a killed `sandgate verify`
    for item in removed:
        print(f"sandgate: removed {item}", file=sys.stderr)
    if not removed:
        print("sandgate: nothing to clean up", file=sys.stderr)
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """`sandgate cache clear`: forget what sandboxed runs wrote under ~ (caches, and anything else)."""
    from fsguard import homeoverlay

    user = run_user_uid(args.user)
    try:
        removed = homeoverlay.clear(user, os.geteuid())
    except homeoverlay.HomeOverlayError as e:
        raise UsageError(e.strerror or str(e)) from None
    print(f"sandgate: removed {removed}" if removed else "sandgate: nothing to clear", file=sys.stderr)
    return 0


def run_user_uid(spec: str | None) -> int:
    """The uid whose sandbox home `cache clear` means: --user, else the sudo caller, else you."""
    from launcher import run

    try:
        user = run.resolve_user(spec)
    except run.RunError as e:
        raise UsageError(str(e)) from None
    return user.uid if user else os.getuid()


def cmd_daemon(args: argparse.Namespace) -> int:
    """`sandgate daemon status|stop|start`: the per-user proxy daemon that `sandgate run` starts on demand."""
    from launcher import daemonctl
    from netguard.proxy import control

    try:
        rt = control.runtime_dir()
    except control.ControlError as e:
        raise UsageError(str(e)) from None
    path = control.socket_path(rt)
    if args.daemon_command == "start":
        d = daemonctl.Daemon(rt)
        try:
            d.wait_ready(daemonctl.START_TIMEOUT)
        except daemonctl.DaemonError as e:
            raise UsageError(str(e)) from None
        d.close()
        print(f"sandgate: daemon running ({path})", file=sys.stderr)
        return 0
    try:
        client = control.ControlClient.connect(path, timeout=2.0)
    except (OSError, control.ControlError):
        print(f"sandgate: no daemon running ({path})", file=sys.stderr)
        return 3 if args.daemon_command == "status" else 0
    try:
        if args.daemon_command == "stop":
            client.stop()
            print("sandgate: daemon stopped", file=sys.stderr)
            return 0
        st = client.status()
    finally:
        client.close()
    if args.json:
        print(json.dumps(st))
    else:
        bindings = st.get("bindings", [])
        print(
            f"sandgate: daemon pid {st.get('pid')}, up {float(st.get('uptime', 0)):.0f} s, "
            f"{len(bindings)} sandbox(es); socket {path}"
        )
        for b in bindings:
            print(f"  task {b.get('task')}")
    return 0


def cmd_trust(args: argparse.Namespace) -> int:
    """`sandgate trust [FILE]`: let a workspace policy widen the defaults, until its content changes."""
    from launcher.config import trust

    store = trust.Store.default()
    path = Path(args.file or ".sandgate.yaml")
    try:
        if args.list:
            for key, rec in sorted(store.records().items()):
                try:
                    now: str = trust.status_of({key: rec}, key, trust.read_file(Path(key), yamlfile.MAX_BYTES))
                except trust.Unreadable:
                    now = "unreadable" if os.path.lexists(key) else "missing"
                print(f"{now:<8} {key}  sha256 {rec.sha256[:12]}  since {rec.trusted_at}")
            return 0
        if args.revoke:
            done = store.revoke(path)
            print(f"sandgate: {'no longer trusted' if done else 'was not trusted'}: {trust.key(path)}", file=sys.stderr)
            return 0
        if (problem := store.problem((Path.cwd(), path.absolute().parent))) is not None:
            raise UsageError(problem)
        for key, digest in store.add(lpolicy.trust_chain(path)):
            print(f"sandgate: trusted {key} (sha256 {digest[:12]}); any change to it revokes this", file=sys.stderr)
    except trust.TrustError as e:
        raise UsageError(str(e)) from None
    return 0


def cmd_allowlists(args: argparse.Namespace) -> int:
    rows = allowlists.describe_bundled()
    width = max(len(n) for n, _, _ in rows)
    for name, desc, count in rows:
        print(f"{name:<{width}}  {count:>2} hosts  {desc}")
    return 0


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
    p = _Parser(prog="sandgate", description="Run untrusted commands behind a kernel-enforced allowlist.")
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

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
    px.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # used by `sandgate run`
    px.add_argument("--ask-all", action="store_true", help=argparse.SUPPRESS)  # `sandgate run --ask`
    px.add_argument("--approval-socket", help=argparse.SUPPRESS)  # the launcher's approval broker
    px.add_argument("--ask-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    px.set_defaults(func=cmd_proxy)

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
    rn.add_argument(
        "--write",
        action="append",
        default=[],
        metavar="PATH",
        help="also writable (repeatable); default writable: the current directory and a private /tmp",
    )
    rn.add_argument(
        "--read-deny",
        action="append",
        default=[],
        metavar="PATH",
        help="also hidden from the command (repeatable); ~/.ssh, ~/.aws... are hidden by default",
    )
    rn.add_argument(
        "--require-landlock",
        action="store_true",
        help="refuse to run when the kernel has no Landlock (default: warn and run)",
    )
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
    rn.add_argument("-q", "--quiet", action="store_true", help="no summary line at exit")
    rn.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")
    rn.set_defaults(func=cmd_run)

    vf = sub.add_parser("verify", help="prove the boundary on this machine: permitted and blocked actions")
    vf.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FILE",
        help="also apply this policy (its filesystem/env sections; repeatable)",
    )
    vf.add_argument("--json", action="store_true", help="one JSON document with every row")
    vf.add_argument("--only", choices=("network", "filesystem", "process"), help="only this group of probes")
    vf.set_defaults(func=cmd_verify)

    au = sub.add_parser(
        "audit",
        help="read audit logs: what a task reached, and the policy it needed (alone: list the recent runs' logs)",
    )
    au.set_defaults(func=cmd_audit)
    au_sub = au.add_subparsers(dest="audit_command", parser_class=_Parser)
    su = au_sub.add_parser("summary", help="one row per destination, riskiest first (default: the last run)")
    su.add_argument("logs", nargs="*", metavar="LOG")
    su.add_argument("--json", action="store_true")
    su.set_defaults(func=cmd_audit)
    sg = au_sub.add_parser(
        "suggest", help="print a policy that allows exactly what the runs needed (default: the last run)"
    )
    sg.add_argument("logs", nargs="*", metavar="LOG")
    sg.add_argument("--name", help="description for the suggested policy")
    sg.set_defaults(func=cmd_audit)

    cl = sub.add_parser("cleanup", help="remove what killed runs left: placeholders, state, a dead daemon's socket")
    cl.set_defaults(func=cmd_cleanup)

    ca = sub.add_parser("cache", help="the sandbox's home (caches): writes under ~ kept apart from the real home")
    ca_sub = ca.add_subparsers(dest="cache_command", required=True, parser_class=_Parser)
    cc = ca_sub.add_parser("clear", help="forget everything sandboxed runs wrote under ~")
    cc.add_argument("--user", metavar="USER", help="the home of USER's sandboxed runs (root only)")
    cc.set_defaults(func=cmd_cache)

    dm = sub.add_parser("daemon", help="the proxy daemon that serves every sandbox (started on demand)")
    dm_sub = dm.add_subparsers(dest="daemon_command", required=True, parser_class=_Parser)
    for name, text in (
        ("status", "is it running, and for which sandboxes"),
        ("stop", "stop it (running sandboxes lose their network: fail closed)"),
        ("start", "start it now instead of on demand"),
    ):
        d = dm_sub.add_parser(name, help=text)
        d.add_argument("--json", action="store_true", help=argparse.SUPPRESS if name != "status" else "as JSON")
        d.set_defaults(func=cmd_daemon)

    tr = sub.add_parser("trust", help="let ./.sandgate.yaml (or FILE) widen the defaults, until its content changes")
    tr.add_argument("file", nargs="?", metavar="FILE", help="the policy file (default ./.sandgate.yaml)")
    which = tr.add_mutually_exclusive_group()
    which.add_argument("--revoke", action="store_true", help="forget FILE: it only narrows again")
    which.add_argument("--list", action="store_true", help="every trusted file, and whether it changed since")
    tr.set_defaults(func=cmd_trust)

    al = sub.add_parser("allowlists", help="list the bundled allowlists")
    al.set_defaults(func=cmd_allowlists)
    return p


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
        _fail(f"{e}")
    except UsageError as e:
        _fail(str(e))
    except BrokenPipeError:
        # `sandgate audit summary LOG | head -1`: the reader left; no traceback, and no second error
        # when the interpreter flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
