"""The Windows entry points of `sandgate run`, `sandgate setup [--remove]` and `sandgate cleanup`.

`run` turns the command line into a SandboxRequest (the policy parsed once, the environment
filtered by fsguard's own rules) and hands it to seam.run_in with the Windows backend; the
network policy goes to the standalone proxy child as the same flags the user gave. Every OS
effect is the WinApi's (`make_api` is what tests replace with a fake). Options that need the
Linux daemon's unix sockets or user namespaces are refused in one line, not half-honoured.
"""

from __future__ import annotations

import dataclasses
import ntpath
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fsguard import env as fsenv
from fsguard import policy as fspolicy
from fsguard.windows import aclapply
from launcher.errors import RunError, UsageError
from launcher.run import seam
from launcher.run.windows import setup as winsetup
from launcher.run.windows.winapi import WinApi
from launcher.run.windowsbackend import WindowsBackend
from sgbase.windows import state
from sgbase.windows.api import WinApiError

if TYPE_CHECKING:
    from launcher.run.options import RunArgs

EXIT_NOT_HERE = 2  # `sandgate setup` on Linux: a usage mistake, not a failed sandbox


def make_api() -> WinApi:
    """The real WinApi (imported here: it loads ctypes' Windows parts on first call only)."""
    from launcher.run.windows.realapi import RealWinApi

    return RealWinApi()


def _say(line: str) -> None:
    print(f"sandgate: {line}", file=sys.stderr)


def run(args: RunArgs) -> int:
    """`sandgate run -- CMD` on Windows: CMD's exit status, or one error line (exit 125)."""
    from launcher.run import options, policyargs

    for flag, given in (("--ask", args.ask), ("--approvals", args.approvals), ("--user", args.user)):
        if given:
            raise RunError(f"{flag} is not available on Windows yet (docs/windows.md); run without it")
    cmd = options.command(args)
    pol = policyargs.policy_from_args(args.policy)
    api = make_api()
    task = uuid.uuid4().hex[:12]
    try:
        appdata = api.local_appdata()
        audit = args.audit_log or ntpath.join(state.audit_dir(appdata), f"audit-{task}.jsonl")
        fs = pol.filesystem
        write = (*(fs.write if fs.write is not None else fspolicy.DEFAULT_WRITE), *args.write)
        fs = dataclasses.replace(fs, write=write, read_deny=(*fs.read_deny, *args.read_deny))
        env, _dropped = fsenv.filter_env(api.environ(), pol.env)
        request = seam.SandboxRequest(tuple(cmd), api.cwd(), env, dataclasses.replace(pol, filesystem=fs), task)
        argv = _proxy_argv(api, args, task, audit) if pol.sources else None
        status = seam.run_in(WindowsBackend(api, argv, _say, transparent=args.transparent), request)
    except WinApiError as e:
        raise RunError(str(e)) from None
    if not args.quiet and argv is not None:
        from launcher.run import summary

        print(summary.summary(Path(audit), task), file=sys.stderr)
    return status


def _proxy_argv(api: WinApi, args: RunArgs, task: str, audit: str) -> tuple[str, ...]:
    """`sandgate proxy` with the run's own policy flags: the same policy, parsed again by the child
    (the daemon's typed spec needs the unix control socket, which Windows' CPython lacks)."""
    out = [api.python(), "-m", "launcher.cli", "proxy", "--ready-fd", "1", "-q", "--task", task, "--audit-log", audit]
    given = args.policy
    for flag, values in (("--policy", given.policy), ("--allow", given.allow), ("--deny", given.deny)):
        for value in values:
            out += [flag, value]
    if given.allow_wide_cidr:
        out.append("--allow-wide-cidr")
    if args.learn:
        out.append("--learn")
    if args.upstream_ca:
        out += ["--upstream-ca", args.upstream_ca]
    return tuple(out)


def setup(remove: bool = False, transparent: bool = False, platform: str | None = None) -> int:
    """`sandgate setup [--remove] [--transparent]`: Windows only; elsewhere one line and exit 2."""
    if (platform or sys.platform) != "win32":
        print(
            "sandgate: error: 'sandgate setup' is for Windows only; Linux needs no setup (run 'sandgate run' directly)",
            file=sys.stderr,
        )
        return EXIT_NOT_HERE
    api = make_api()
    try:
        if remove:
            winsetup.remove(api, _say)
        else:
            winsetup.setup(api, _say, transparent=transparent)
    except WinApiError as e:
        raise UsageError(str(e)) from None
    return 0


def cleanup(say: Callable[[str], None] = _say) -> int:
    """`sandgate cleanup` on Windows: the ACL journals of killed runs, replayed and removed."""
    api = make_api()
    try:
        done = aclapply.replay_left(api, api.local_appdata(), lambda line: say(f"warning: {line}"))
    except WinApiError as e:
        raise UsageError(str(e)) from None
    for item in done:
        say(f"removed {item}")
    if not done:
        say("nothing to clean up")
    return 0
