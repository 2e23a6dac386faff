"""`sandgate run`: the launch sequence, top to bottom, in one function (v2: nothing in the host's namespaces).

  parse the command line -> policy (parsed once, here) -> workspace checks
  -> daemon: connect, or spawn without waiting
  -> state + lock: stale cleanup; filesystem, home overlay, Landlock, environment; placeholders
  -> holder: own user+net+mount+pid+ipc+uts namespaces; we write its uid/gid maps; it builds
     lo + nftables + listeners inside and hands us the listeners
  -> the daemon gets a typed spec and the listeners (now, or as soon as it is up)
  -> init + CMD (sandbox.py) -> supervise: wait, forward signals, record dropped packets,
     notice a dead daemon -> end the binding -> tear down -> summary

Whoever starts sandgate, CMD holds no capability over the host (fsguard/userns.py says how ids
map). If the daemon dies, the listeners die with it: the sandbox has no network, by construction.
A SIGKILLed launcher takes the holder and init with it (PDEATHSIG chain), its control
connection closes so the daemon drops the binding, and the next run or `sandgate cleanup`
removes the placeholders and state it left.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fsguard import mounts, userns
from launcher.config import parsecache
from launcher.errors import EXIT_ERROR, RunError
from launcher.run import confinement, daemonctl, options, policyargs, runstate, sandbox, summary, supervise, workspace
from netguard import nft, sandboxnet
from netguard.audit import AuditLog
from netguard.proxy.spec import BindingSpec, CaPair

if TYPE_CHECKING:  # imported when used: most runs never ask a human, nor inspect (a fast start matters)
    from launcher.approvals import broker as approvals
    from launcher.platform import seam
    from launcher.run import brokered, inspection

PORTS = nft.Ports()


@dataclass(frozen=True)
class Terminating:
    """A run whose policy inspects TLS or brokers credentials: its CA (the key goes to the daemon
    only) and its credentials (real values for the daemon, sentinels for the sandbox)."""

    ca: CaPair
    brokered: brokered.Brokered


def _terminating(opts: options.RunOptions) -> Terminating | None:
    """None for most runs: then nothing here runs and `cryptography` is never imported."""
    net = opts.policy.network
    if not (net.credentials or any(r.inspect for r in net.allow)):  # inspection.needed, without importing it
        return None
    from launcher.run import brokered, inspection

    creds = brokered.resolve(net.credentials)  # first: a missing secret fails before a key is made
    return Terminating(inspection.new_ca(opts.task, inspection.inspected_names(net)), creds)


def main(args: argparse.Namespace) -> int:
    """`sandgate run`, every step in order; any failure before CMD starts is one line and exit 125."""
    _this_platform()  # never run a command unconfined on an OS without a backend (Windows: launcher.cli)
    cmd = options.command(args)  # parse
    rt = runstate.runtime_dir()
    parsecache.CACHE_DIR = rt / "policy-cache"  # hidden from every sandbox
    pol = policyargs.policy_from_args(args)  # parsed once, here: the daemon gets the compiled result, never YAML
    opts = options.from_args(args, cmd, pol)
    workspace.check(opts, args.user)  # never `/` or a home writable
    tls = _terminating(opts)
    daemon = daemonctl.Daemon(rt)  # first: a cold daemon starts while we set up the sandbox
    paths = runstate.RunPaths(rt, uuid.uuid4().hex[:8])
    audit = _open_audit(opts.audit_path)
    placeholders: list[str] = []
    broker: approvals.Broker | None = None
    status = EXIT_ERROR
    try:
        runstate.make_dirs(paths)
        broker = _broker(opts, paths, audit)  # before planning the mounts: its socket must be hidden
        with runstate.lock(rt):
            runstate.cleanup_stale(rt)  # first: a killed run's placeholders must not be taken for the workspace's
            conf = confinement.plan(opts, audit, rt, tls.brokered if tls else None)  # files, Landlock, env
            runstate.write_state(paths, [p for p, _ in conf.mounts.placeholders])
            placeholders = mounts.create_placeholders(conf.mounts)
        ins = _inside(opts, conf, paths, tls)
        if broker is not None:
            _tell_terminal(broker.banner())
        holder, chan = sandbox.start_holder(os.getpid(), ins)  # namespaces
        try:
            fds = sandbox.handshake(holder, chan, ins.ident)  # id maps; the listeners born inside
            audit_fd = os.open(opts.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            handover = daemonctl.Handover(daemon, _spec(opts, paths, broker, tls), [audit_fd, *fds])
            handover.try_bind()  # the daemon binding: now, or as soon as it is up
            if broker is not None:
                broker.who = lambda ip, port: _asker(holder, ip, port)
                broker.start()  # threads only after the fork
            chan.send(b"G")  # init + CMD
            status = supervise.supervise(holder, chan, handover, audit, opts.task)
        finally:
            chan.close()
            daemon.end()
    except (nft.NftError, sandboxnet.SandboxNetError) as e:
        raise RunError(str(e)) from None
    except mounts.MountError as e:
        raise RunError(e.strerror or str(e)) from None
    finally:
        if broker is not None:
            broker.stop()
        daemon.close()
        mounts.remove_placeholders(placeholders)
        runstate.remove(paths)
        audit.close()
    if not opts.quiet:
        print(summary.summary(opts.audit_path, opts.task), file=sys.stderr)
    return status


def _this_platform() -> seam.PlatformName:
    """Linux runs the sequence below (Windows was dispatched before, in launcher.cli); any other OS is refused."""
    from launcher.platform import seam

    try:
        return seam.platform_name(sys.platform)
    except NotImplementedError as e:
        raise RunError(str(e)) from None


def _open_audit(path: Path) -> AuditLog:
    try:
        return AuditLog(path)
    except OSError as e:
        raise RunError(f"cannot open audit log {path}: {e.strerror}; choose another --audit-log") from None


def _broker(opts: options.RunOptions, paths: runstate.RunPaths, audit: AuditLog) -> approvals.Broker | None:
    """The approval broker when a human may be asked (--ask, or `ask:` in the policy), else None."""
    if not (opts.ask or opts.policy.network.ask):
        return None
    from launcher.approvals import broker as approvals

    return approvals.Broker(
        paths.dir / "approvals.sock",
        audit,
        opts.task,
        opts.ask_timeout,
        channel=opts.approvals,
        policy_file=opts.policy_file,
    )


def _spec(
    opts: options.RunOptions, paths: runstate.RunPaths, broker: approvals.Broker | None, tls: Terminating | None
) -> BindingSpec:
    """What the daemon enforces for this sandbox: typed and compiled, never YAML or command-line strings."""
    return BindingSpec(
        task=opts.task,
        policy=opts.policy.network,
        learn=opts.learn,
        ask_all=opts.ask,
        approval_socket=str(paths.dir / "approvals.sock") if broker else None,
        ask_timeout=opts.ask_timeout,
        ca=tls.ca if tls else None,
        upstream_ca=opts.upstream_ca,
        secrets=tls.brokered.secrets if tls else (),
    )


def _inside(
    opts: options.RunOptions, conf: confinement.Confinement, paths: runstate.RunPaths, tls: Terminating | None
) -> sandbox.Inside:
    """Everything the holder, init and CMD need, and the files bound into the sandbox."""
    target = (opts.user.uid, opts.user.gid, tuple(opts.user.groups)) if opts.user else None
    try:
        ident = userns.plan(os.getuid(), os.getgid(), target, opts.root_inside, helpers=_root_helpers())
    except userns.UsernsError as e:
        raise RunError(str(e)) from None
    weak = options.weakened()
    own_netns = "firewall" not in weak
    (paths.dir / "resolv.conf").write_text(
        "# written by sandgate: the sandbox's only resolver is its DNS listener\nnameserver 127.0.0.1\noptions edns0\n"
    )
    (paths.dir / "resolv.conf").chmod(0o644)
    (paths.dir / "empty").touch(0o444)
    (paths.dir / "hosttmp").mkdir(0o700, exist_ok=True)
    trust = _trust(opts, paths, tls) if tls else None
    return sandbox.Inside(
        tuple(opts.cmd),
        {**conf.env, **trust.env} if trust else conf.env,
        ident,
        conf.mounts,
        conf.landlock,
        paths.dir,
        PORTS,
        own_netns=own_netns,
        keep_net_admin="netadmin" in weak,
        make_dirs=_hidden_home(conf),
        files=trust.binds if trust else (),
    )


def _trust(opts: options.RunOptions, paths: runstate.RunPaths, tls: Terminating) -> inspection.Trust:
    """The combined bundle in the run directory (the CA's certificate only, never its key)."""
    from launcher.run import inspection

    trust = inspection.install(paths.dir, tls.ca.cert, os.environ)
    if opts.verbose:
        names = ", ".join(inspection.inspected_names(opts.policy.network))
        print(
            f"sandgate: inspecting TLS to {names}; the run's CA is trusted inside via {trust.env['SSL_CERT_FILE']}",
            file=sys.stderr,
        )
    return trust


def _root_helpers() -> tuple[tuple[int, int], ...]:
    """Accounts that root tools drop privileges to (apt downloads as `_apt`, group nogroup)."""
    out = []
    for name in ("_apt",):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        out.append((pw.pw_uid, pw.pw_gid))
    return tuple(out)


def _hidden_home(conf: confinement.Confinement) -> tuple[str, ...]:
    """A home under the host's /tmp vanishes in the private /tmp: give the task an empty one in its place."""
    m = conf.mounts
    return (conf.home,) if mounts.left_out_by_private_tmp(conf.home, m.private_tmp, m.tmp_rebinds) else ()


def _tell_terminal(text: str) -> None:
    """Straight to the terminal when there is one: the sandbox may be able to read a redirected stderr."""
    try:
        fd = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        print(text, file=sys.stderr)
        return
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def _asker(netns_pid: int, ip: str, port: int) -> str | None:
    from launcher.approvals import whoasked

    found = whoasked.find_asker(netns_pid, ip, port)
    return f"{found.name}[{found.pid}]" if found else None
