"""The Linux backend behind the platform seam: `sandgate run`'s sandbox, made, started, awaited, torn down.

  make:     1. the run directory
            2. the approval broker, if a human may be asked (before the mounts are planned: its
               socket must be hidden); on a terminal, the command's pty
            3. the holder forked with what it needs first (sandbox.Early): it makes its
               user+net+mount+pid+ipc+uts namespaces and the network inside while we go on
            4. under the run lock: a killed run's state and the placeholders no run holds removed
               (first: they must not be taken for the workspace's), the confinement planned (files,
               Landlock, env), this run's state written, earlier live runs' placeholders used and
               the missing ones created, and the state rewritten to name the placeholders it uses
               (planned again if the workspace changed meanwhile; launcher/run/placeholdershare.py)
            5. the handshake (uid/gid maps written, the listeners born inside taken)
            6. the listeners and the audit fd handed to the daemon (now, or once it is up); the
               broker's threads (only after the fork)
  start:    7. the go, with the rest of the plan (sandbox.Inside): the holder starts init, and init CMD
  wait:     8. supervise: signals forwarded, a late daemon bound, a dead one reported, drops recorded
  teardown: the channel closed and the binding ended (only if the holder was started), the broker
            stopped, the daemon connection closed, the run state removed and with it its references
            (under the run lock), the placeholders no live run uses any more removed, the audit
            log closed. Each undo clears what it undid, so a second teardown does nothing; a
            failure inside make tears down exactly what make had made before it is raised.

The request is OS-neutral; what only Linux needs (the run's options, its runtime paths, the
daemon connection started early so a cold daemon boots while the sandbox is built, the audit log,
the run's CA) comes in `LinuxRun`, made by launch.main before anything is touched.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import socket
import sys
from typing import TYPE_CHECKING

from fsguard import mounts, placeholders, userns
from launcher import ctty, timings
from launcher.errors import RunError
from launcher.run import confinement, daemonctl, options, otlpenv, placeholdershare, runstate, sandbox, supervise
from launcher.run.seam import PlatformName, SandboxRequest
from netguard import nft
from netguard.audit import AuditLog
from netguard.spec import BindingSpec, CaPair

if TYPE_CHECKING:  # imported when used: most runs never ask a human, nor inspect (a fast start matters)
    from pathlib import Path

    from fsguard.sandboxpty import PtyPlan
    from launcher.approvals import broker as approvals
    from launcher.run import brokered, inspection
    from launcher.run.ptyrelay import Relay

PORTS = nft.Ports()
PLAN_TRIES = 3  # plans made again when another user's run changes the workspace's placeholders meanwhile

# The records below are plain classes, not dataclasses: creating a dataclass costs a few hundred
# microseconds at import, and every `sandgate run` pays this module's import before CMD starts.


class Terminating:
    """A run whose policy inspects TLS or brokers credentials: its CA (the key goes to the daemon
    only) and its credentials (real values for the daemon, sentinels for the sandbox)."""

    def __init__(self, ca: CaPair, brokered: brokered.Brokered) -> None:
        self.ca, self.brokered = ca, brokered


class LinuxRun:
    """What the Linux backend needs besides the request; the backend owns `daemon` and `audit` from
    here on (teardown closes them)."""

    def __init__(
        self,
        opts: options.RunOptions,
        paths: runstate.RunPaths,
        daemon: daemonctl.Daemon,
        audit: AuditLog,
        tls: Terminating | None,
    ) -> None:
        self.opts, self.paths, self.daemon, self.audit, self.tls = opts, paths, daemon, audit, tls


class LinuxSandbox:
    """One run's made pieces; teardown undoes those that are set and clears them (idempotent)."""

    def __init__(self, request: SandboxRequest, run: LinuxRun) -> None:
        self.request, self.run = request, run
        self.dirs: runstate.RunPaths | None = None  # the run directory and state file, once made
        self.broker: approvals.Broker | None = None
        self.refs: placeholders.Refs | None = None  # flocks on another user's placeholders it binds
        self.holder: int | None = None
        self.chan: socket.socket | None = None  # set once the holder is forked: then the binding is ended too
        self.handover: daemonctl.Handover | None = None
        self.relay: Relay | None = None  # on a terminal: the command's pty, relayed (launcher/run/ptyrelay.py)
        self.tty: PtyPlan | None = None  # and its plan, the holder's and init's
        self.inside: sandbox.Inside | None = None  # what init and CMD get with the go
        self.open = True  # the daemon connection, until teardown closes it


class LinuxBackend:
    """Namespaces, Landlock, seccomp and the per-user daemon: the sequence launch.main ran inline.

    launch.main builds the request and `run.opts` from one RunOptions, so the steps read the command,
    policy and task from `opts` as before; the environment and working directory are the
    launcher's own, read by confinement.plan (it filters the environment and records what it drops).
    """

    name: PlatformName = "linux"

    def __init__(self, run: LinuxRun) -> None:
        self.run = run

    def make(self, request: SandboxRequest) -> LinuxSandbox:
        box = LinuxSandbox(request, self.run)
        try:
            _fork_holder(box)  # 1-3
            conf = _prepare(box)  # 4
            timings.mark("prepare")
            _enter(box, conf)  # 5-6
        except BaseException:  # Ctrl-C included: nothing of a failed make is left behind
            self.teardown(box)
            raise
        return box

    def start(self, sandbox: object) -> None:
        box = _box(sandbox)
        if box.chan is None or box.handover is None or box.inside is None:
            raise RunError("internal: start before make finished")  # a seam misuse: never start unconfined
        _go(box.chan, box.inside)  # 7: init + CMD
        timings.mark("go")

    def wait(self, sandbox: object) -> int:
        box = _box(sandbox)
        if box.holder is None or box.chan is None or box.handover is None:
            raise RunError("internal: wait before make finished")
        status = supervise.supervise(
            box.holder, box.chan, box.handover, box.run.audit, box.run.opts.task, box.relay
        )  # 8
        timings.mark("cmd-exited")
        return status

    def teardown(self, sandbox: object) -> None:
        box = _box(sandbox)
        run = box.run
        if box.relay is not None:
            relay, box.relay = box.relay, None
            relay.close()  # the user's terminal modes back, whatever happened
        if box.chan is not None:
            chan, box.chan = box.chan, None
            chan.close()
            run.daemon.end()  # the daemon's records are complete before the summary reads them
        if box.broker is not None:
            broker, box.broker = box.broker, None
            broker.stop()
        if box.open:
            box.open = False
            run.daemon.close()
        if box.refs is not None:
            refs, box.refs = box.refs, None
            refs.close()
            runstate.release(run.paths)  # then the placeholders no other live run uses are removed
        if box.dirs is not None:
            dirs, box.dirs = box.dirs, None
            runstate.remove(dirs)
        run.audit.close()  # idempotent itself


_go = sandbox.go  # (the seam's methods name their argument `sandbox`)


def _box(sandbox: object) -> LinuxSandbox:
    if not isinstance(sandbox, LinuxSandbox):
        raise TypeError("not a Linux sandbox")
    return sandbox


def _fork_holder(box: LinuxSandbox) -> None:
    """Steps 1-3: the run directory, the broker, the terminal; the holder forked, making its namespaces
    and network while the launcher plans the confinement (the rest of its plan comes with the go)."""
    run = box.run
    opts, paths = run.opts, run.paths
    box.dirs = paths
    runstate.make_dirs(paths)
    box.broker = _broker(opts, paths, run.audit)  # before planning the mounts: its socket must be hidden
    if os.isatty(0) or os.isatty(1):  # the command gets a terminal of the sandbox's own devpts
        box.tty = _terminal(box)
    if box.broker is not None:
        _tell_terminal(box.broker.banner())
    nested = opts.nested_userns or opts.weak.nested_userns  # the weakening: verify's own control
    early = sandbox.Early(PORTS, own_netns=not opts.weak.firewall, nested_userns=nested, tty=box.tty)
    try:
        box.holder, box.chan = sandbox.start_holder(os.getpid(), early)  # namespaces
    finally:
        if box.tty is not None:
            os.close(box.tty.sock)  # init's end: only init may hold it (its death reads as EOF here)


def _prepare(box: LinuxSandbox) -> confinement.Confinement:
    """Step 4: the run's host-side state, placeholders created under the lock."""
    run = box.run
    opts, paths, rt = run.opts, run.paths, run.paths.root
    with runstate.lock(rt):
        runstate.cleanup_stale(rt)  # first: a killed run's placeholders must not be taken for the workspace's
        box.refs = placeholders.Refs()  # from here on teardown sweeps what this run made
        for _ in range(PLAN_TRIES):
            conf = confinement.plan(opts, run.audit, rt, run.tls.brokered if run.tls else None)  # files, Landlock, env
            runstate.write_state(paths, [p for p, _ in conf.mounts.placeholders])  # a kill now: swept by name
            try:
                plan, box.refs, used = placeholdershare.take(rt, conf.mounts)
            except placeholders.Stale:
                runstate.write_state(paths, [])
                runstate.sweep(rt)  # what this try made
                continue
            runstate.write_state(paths, used)  # while this run lives, no run of this user removes them
            return dataclasses.replace(conf, mounts=plan)
    raise RunError("the workspace's protected paths kept changing while sandgate planned its mounts; run it again")


def _enter(box: LinuxSandbox, conf: confinement.Confinement) -> None:
    """Steps 5-6: the holder's uid/gid maps, the listeners born inside on their way to the daemon."""
    run = box.run
    opts, paths = run.opts, run.paths
    if box.holder is None or box.chan is None:
        raise RunError("internal: no holder")
    box.inside = ins = dataclasses.replace(_inside(opts, conf, paths, run.tls), tty=box.tty)
    fds = sandbox.handshake(box.holder, box.chan, ins.ident)  # id maps; the listeners born inside
    timings.mark("handshake")
    audit_fd = os.open(opts.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    box.handover = daemonctl.Handover(run.daemon, _spec(opts, paths, box.broker, run.tls), [audit_fd, *fds])
    box.handover.try_bind()  # the daemon binding: now, or as soon as it is up
    timings.mark("bind")
    if box.broker is not None:
        holder = box.holder
        box.broker.who = lambda ip, port: _asker(holder, ip, port)
        box.broker.start()  # threads only after the fork


def _terminal(box: LinuxSandbox) -> PtyPlan | None:
    """The pty's plan and the relay that will carry it, when stdin or stdout is the user's terminal."""
    from launcher.run import ptyrelay

    outer = ptyrelay.probe()
    if outer is None:
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    box.relay = ptyrelay.Relay(outer, mine, box.broker.prompting if box.broker else None)
    return ptyrelay.plan(outer, theirs.detach(), mine.fileno())


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
        upstream_proxy=opts.upstream_proxy,
        otlp=otlpenv.settings(),  # read and checked at the run's start (launch.py)
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
    (paths.dir / "resolv.conf").write_text(
        "# written by sandgate: the sandbox's only resolver is its DNS listener\nnameserver 127.0.0.1\noptions edns0\n"
    )
    (paths.dir / "resolv.conf").chmod(0o644)
    (paths.dir / "empty").touch(0o444)
    (paths.dir / "hosttmp").mkdir(0o700, exist_ok=True)
    trust = _trust(opts, paths, tls) if tls else None
    env = {**conf.env, **trust.env} if trust else dict(conf.env)
    files = _notices(opts, paths, env, trust.binds if trust else ())
    return sandbox.Inside(
        tuple(opts.cmd),
        env,
        ident,
        conf.mounts,
        conf.landlock,
        paths.dir,
        PORTS,
        own_netns=not opts.weak.firewall,
        keep_net_admin=opts.weak.netadmin,
        make_dirs=_hidden_home(conf),
        files=files,
        nested_userns=opts.nested_userns or opts.weak.nested_userns,  # the weakening: verify's own control
    )


def _notices(
    opts: options.RunOptions, paths: runstate.RunPaths, env: dict[str, str], files: tuple[tuple[str, Path], ...]
) -> tuple[tuple[str, Path], ...]:
    """--notices: the run's notices file, bound read-only inside and named in `env` (launcher/run/notices.py).
    Without it no SANDGATE_NOTICES reaches the command, whatever the caller's environment held."""
    env.pop("SANDGATE_NOTICES", None)
    if not opts.notices:
        return files
    from launcher.run import notices

    return (*files, notices.share(paths.dir, env))


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
        fd = ctty.open_tty(os.O_WRONLY)
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
    return found.label() if found else None
