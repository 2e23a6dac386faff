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
from fsguard.windows import aclapply, sweep
from launcher.errors import RunError, UsageError
from launcher.run import seam
from launcher.run.windows import setup as winsetup
from launcher.run.windows.winapi import WinApi
from launcher.run.windowsbackend import WindowsBackend, sweep_left
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
    return exit_status(status)


def exit_status(code: int) -> int:
    """CMD's exit code (GetExitCodeProcess: a DWORD) as the C int os._exit takes: an NTSTATUS such as
    0xC0000005 (a crash) or 0xC000013A (Ctrl+C) would raise OverflowError there (win-py P8). ExitProcess
    takes a UINT, so the caller still sees CMD's exact 32 bits (PowerShell prints -1073741819)."""
    code &= 0xFFFFFFFF
    return code - (1 << 32) if code >= 1 << 31 else code


def _proxy_argv(api: WinApi, args: RunArgs, task: str, audit: str) -> tuple[str, ...]:
    """`sandgate proxy` with the run's own policy flags: the same policy, parsed again by the child
    (the daemon's typed spec needs the unix control socket, which Windows' CPython lacks)."""
    # -P: `python -m` would put the current directory (the workspace, which the sandbox user may write) first on
    # sys.path, and a json.py planted there would run as the real user in the proxy at the next run (win-py P7).
    out = [api.python(), "-P", "-m", "launcher.cli", "proxy", "--ready-fd", "1", "-q", "--task", task]
    out += ["--audit-log", audit]
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
    """`sandgate cleanup` on Windows: the ACL journals of killed runs, replayed and removed; then
    the sweep those runs left pending (their command's tasks and escaped processes, sweep.py).
    Exit 1 when something survived the sweep (said in one line)."""
    api = make_api()
    try:
        appdata = api.local_appdata()
        if sweep.pending(api, state.journal_dir(appdata))[1]:  # a live run: its ACEs are the same SID's (r3-day D9)
            say("another sandgate run is live: nothing cleaned up; run 'sandgate cleanup' again when it has ended")
            return 1
        done = aclapply.replay_left(api, appdata, lambda line: say(f"warning: {line}"))
        left = _sweep_left(api, appdata)
    except WinApiError as e:
        raise UsageError(str(e)) from None
    for item in done:
        say(f"removed {item}")
    if left is not None and left.clean:
        say(f"swept {len(left.killed)} process(es) and {len(left.deleted)} scheduled task(s) of killed runs")
    elif left is not None:
        say(f"warning: {sweep.describe(left)}; end them as administrator, then run 'sandgate cleanup' again")
        return 1
    if not done and left is None:
        say("nothing to clean up")
    return 0


def _sweep_left(api: WinApi, appdata: str) -> sweep.Swept | None:
    try:
        ready = winsetup.check(api)
    except winsetup.NotSetUp:
        return None  # no sandbox user: nothing of it can run
    return sweep_left(api, ready, appdata)
