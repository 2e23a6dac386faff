"""`sandgate run` on Linux: parse and check, then the sandbox through the platform seam, then the exit line.

  parse the command line -> policy (parsed once, here) -> workspace checks -> the run's CA, if any
  -> daemon: connect, or spawn without waiting (first: a cold daemon starts while the sandbox is built)
  -> seam.run_in(LinuxBackend): make (state + lock: stale cleanup; filesystem, home overlay, Landlock,
     environment; placeholders; holder: own user+net+mount+pid+ipc+uts namespaces, uid/gid maps,
     lo + nftables + listeners inside; the daemon gets a typed spec and the listeners, now or as
     soon as it is up), start (init + CMD, sandbox.py), wait (supervise: forward signals, record
     dropped packets, notice a dead daemon), teardown (end the binding, remove what make made)
  -> summary

The steps themselves are linuxbackend.py's; Windows takes the same seam (launcher/run/windowsbackend.py).
Whoever starts sandgate, CMD holds no capability over the host (fsguard/userns.py says how ids
map). If the daemon dies, the listeners die with it: the sandbox has no network, by construction.
A SIGKILLed launcher takes the holder and init with it (PDEATHSIG chain), its control
connection closes so the daemon drops the binding, and the next run or `sandgate cleanup`
removes the placeholders and state it left.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fsguard import gitguard, mounts
from launcher import gcpause, timings
from launcher.config import parsecache
from launcher.errors import RunError
from launcher.run import daemonctl, livedenials, options, otlpenv, runstate, seam, summary, workspace
from launcher.run.linuxbackend import LinuxBackend, LinuxRun, Terminating
from netguard import nft, sandboxnet
from netguard.audit import AuditLog

if TYPE_CHECKING:  # imported at exit: a fast start matters
    from launcher.audit import bydesign


def _terminating(opts: options.RunOptions) -> Terminating | None:
    """None for most runs: then nothing here runs and `cryptography` is never imported."""
    net = opts.policy.network
    if not (net.credentials or any(r.inspect for r in net.allow)):  # inspection.needed, without importing it
        return None
    from launcher.run import brokered, inspection

    creds = brokered.resolve(net.credentials)  # first: a missing secret fails before a key is made
    return Terminating(inspection.new_ca(opts.task, inspection.inspected_names(net)), creds)


def main(args: options.RunArgs) -> int:
    """`sandgate run`: parse and check, then the seam; any failure before CMD starts is one line and exit 125."""
    _this_platform()  # never run a command unconfined on an OS without a backend (Windows: launcher.cli)
    options.command(args)  # no CMD: one line, before any daemon is started
    rt = runstate.runtime_dir()
    # First: a cold daemon starts while the policy is read and the sandbox is built (it is what the first
    # connection waits for; launcher/prestart.py spawned it even earlier).
    daemon = daemonctl.Daemon(rt)
    timings.mark("daemon-connect")
    try:
        return _run(args, rt, daemon)
    except BaseException:
        daemon.abandon()  # failed before its bind: a daemon this run spawned must not idle on for nobody
        raise


def _run(args: options.RunArgs, rt: Path, daemon: daemonctl.Daemon) -> int:
    parsecache.CACHE_DIR = rt / "policy-cache"  # hidden from every sandbox
    gitguard.SCAN_CACHE = str(rt / "gitscan")  # hidden from every sandbox: what it remembers decides what is protected
    opts = options.build(args)  # the policy parsed once, here: the daemon gets the compiled result, never YAML
    workspace.check(opts, args.user)  # never `/` or a home writable
    otlpenv.settings()  # OTEL_* read once, here: a setting sandgate cannot honour fails before any sandbox
    if opts.verbose:  # the network part of the boundary (confinement prints the filesystem part)
        from launcher import explain

        explain.verbose(opts)
    tls = _terminating(opts)
    timings.mark("policy")
    gcpause.resume()  # paused through the imports and the policy's compile (launcher/gcpause.py)
    paths = runstate.RunPaths(rt, os.urandom(4).hex())  # not uuid: its import (platform, ctypes) is ~1.5 ms
    audit = _open_audit(opts.audit_path)
    # The environment goes in unfiltered: confinement.plan filters it at make, under the run lock,
    # where the names it drops are recorded in the run's policy record.
    request = seam.SandboxRequest(tuple(opts.cmd), os.getcwd(), os.environ, opts.policy, opts.task)
    notices = paths.dir if opts.notices else None  # --notices: launcher/run/notices.py
    live = livedenials.follower(opts.audit_path, opts.task, opts.quiet, notices)  # denials as they happen
    try:
        status = seam.run_in(
            livedenials.Following(LinuxBackend(LinuxRun(opts, paths, daemon, audit, tls)), live), request
        )
    except (nft.NftError, sandboxnet.SandboxNetError) as e:
        raise RunError(str(e)) from None
    except mounts.MountError as e:
        raise RunError(e.strerror or str(e)) from None
    timings.mark("teardown")
    if not opts.quiet:
        print(summary.exit_report(opts.audit_path, opts.task, _facts(opts, status)), file=sys.stderr)
    return status


def _facts(opts: options.RunOptions, status: int) -> bydesign.Facts:
    """What the exit's hints about refusals by design may go on (launcher.audit.bydesign)."""
    from launcher.audit import bydesign

    home = opts.user.home if opts.user else os.environ.get("HOME", "/")
    root_inside = opts.root_inside or (os.geteuid() == 0 and opts.user is None)
    return bydesign.Facts(tuple(opts.cmd), os.getcwd(), home, status, root_inside)


def _this_platform() -> seam.PlatformName:
    """Linux runs the backend below (Windows was dispatched before, in launcher.cli); any other OS is refused."""
    try:
        return seam.platform_name(sys.platform)
    except NotImplementedError as e:
        raise RunError(str(e)) from None


def _open_audit(path: Path) -> AuditLog:
    try:
        return AuditLog(path)
    except OSError as e:
        raise RunError(f"cannot open audit log {path}: {e.strerror}; choose another --audit-log") from None
