"""`sandgate run`: the launch sequence, top to bottom (v2: nothing in the host's namespaces).

  policy (parsed once, here) -> daemon: connect, or spawn without waiting
  -> state + lock: stale cleanup, placeholders
  -> holder: own user+net+mount+pid+ipc+uts namespaces; we write its uid/gid maps; it builds
     lo + nftables + listeners inside and hands us the listeners
  -> the daemon gets a typed spec and the listeners (now, or as soon as it is up)
  -> init + CMD (launcher/sandbox.py) -> wait, forward signals, record dropped packets,
     notice a dead daemon -> end the binding -> summary -> tear down

Whoever starts sandgate, CMD holds no capability over the host (fsguard/userns.py says how ids
map). If the daemon dies, the listeners die with it: the sandbox has no network, by construction.
A SIGKILLed launcher takes the holder and init with it (PDEATHSIG chain), its control
connection closes so the daemon drops the binding, and the next run or `sandgate cleanup`
removes the placeholders and state it left.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import select
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fsguard import env as fsenv
from fsguard import homeoverlay, landlock, mounts, userns
from fsguard import policy as fspolicy
from launcher import daemonctl, runstate, sandbox
from launcher.config import bundled as allowlists
from launcher.config import load as lpolicy
from launcher.config.errors import PolicyFileError
from netguard import rules
from netguard import policy as netpolicy
from netguard.audit import AuditLog, decision_record, policy_record, read_records
from netguard.nft import Ports
from netguard.proxy import control
from netguard.proxy.spec import BindingSpec

if TYPE_CHECKING:  # imported when used: most runs never ask a human (a fast start matters)
    from launcher.approvals import broker as approvals

EXIT_ERROR = 125
PORTS = Ports()

# Signals a user sends to sandgate that CMD should get. Terminal-generated ones (Ctrl-C, Ctrl-\)
# already reach CMD directly because it is in the terminal's foreground process group.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGCONT,
)
TTY_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


#: Test-only: sandgate verify's self-test sets this to weaken ONE mechanism and prove that the
#: matching probes then fail. Not a command-line option; announced loudly; never passed inside.
WEAKEN_ENV = "SANDGATE_INTERNAL_WEAKEN"
WEAKENINGS = frozenset({"firewall", "git-hooks", "netadmin"})


def weakened() -> frozenset[str]:
    value = os.environ.get(WEAKEN_ENV, "")
    names = frozenset(x for x in value.split(",") if x)
    if names - WEAKENINGS:
        raise RunError(f"{WEAKEN_ENV} names unknown weakenings {sorted(names - WEAKENINGS)}")
    return names


class RunError(Exception):
    """Setup failed before CMD started; one line for the user, exit 125."""


@dataclass
class User:
    uid: int
    gid: int
    name: str
    home: str
    groups: list[int] = field(default_factory=list)


@dataclass
class RunOptions:
    cmd: list[str]
    audit_path: Path
    user: User | None  # the host user CMD runs as; None: whoever started sandgate
    policy: lpolicy.Policy = field(default_factory=lambda: lpolicy.Policy(netpolicy.NetworkPolicy(), ()))
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
    task: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


@dataclass(frozen=True)
class Confinement:
    """Everything the sandbox's processes apply, computed in the launcher before anything starts."""

    mounts: mounts.MountPlan
    landlock: landlock.Plan | None  # None: the kernel has no Landlock (and it was not required)
    env: dict[str, str]
    env_dropped: list[str]
    home: str


# ---- the sequence -------------------------------------------------------------------------


def run(opts: RunOptions) -> int:
    try:
        rt = control.runtime_dir()
    except control.ControlError as e:
        raise RunError(str(e)) from None
    daemon = daemonctl.Daemon(rt)  # first: a cold daemon starts while we set up the sandbox
    paths = runstate.RunPaths(rt, uuid.uuid4().hex[:8])
    audit = _open_audit(opts.audit_path)
    placeholders: list[str] = []
    broker: approvals.Broker | None = None
    status = EXIT_ERROR
    try:
        runstate.make_dirs(paths)
        if opts.ask or opts.policy.network.ask:
            # Before planning the mounts: its socket must exist to be hidden from the sandbox.
            from launcher.approvals import broker as approvals

            broker = approvals.Broker(
                paths.dir / "approvals.sock",
                audit,
                opts.task,
                opts.ask_timeout,
                channel=opts.approvals,
                policy_file=opts.policy_file,
            )
        with runstate.lock(rt):
            runstate.cleanup_stale(rt)  # first: a killed run's placeholders must not be taken for the workspace's
            conf = _confinement(opts, audit, rt)
            runstate.write_state(paths, [p for p, _ in conf.mounts.placeholders])
            placeholders = mounts.create_placeholders(conf.mounts)
        ins = _inside(opts, conf, paths)
        if broker is not None:
            _tell_terminal(broker.banner())
        status = _launch(opts, ins, daemon, audit, broker, paths)
    finally:
        if broker is not None:
            broker.stop()
        daemon.close()
        mounts.remove_placeholders(placeholders)
        runstate.remove(paths)
        audit.close()
    if not opts.quiet:
        print(summary(opts.audit_path, opts.task), file=sys.stderr)
    return status


def _inside(opts: RunOptions, conf: Confinement, paths: runstate.RunPaths) -> sandbox.Inside:
    target = (opts.user.uid, opts.user.gid, tuple(opts.user.groups)) if opts.user else None
    try:
        ident = userns.plan(os.getuid(), os.getgid(), target, opts.root_inside, helpers=_root_helpers())
    except userns.UsernsError as e:
        raise RunError(str(e)) from None
    weak = weakened()
    own_netns = "firewall" not in weak
    (paths.dir / "resolv.conf").write_text(
        "# written by sandgate: the sandbox's only resolver is its DNS listener\nnameserver 127.0.0.1\noptions edns0\n"
    )
    (paths.dir / "resolv.conf").chmod(0o644)
    (paths.dir / "empty").touch(0o444)
    (paths.dir / "hosttmp").mkdir(0o700, exist_ok=True)
    return sandbox.Inside(
        tuple(opts.cmd),
        conf.env,
        ident,
        conf.mounts,
        conf.landlock,
        paths.dir,
        PORTS,
        own_netns=own_netns,
        keep_net_admin="netadmin" in weak,
        make_dirs=_hidden_home(conf),
    )


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


def _hidden_home(conf: Confinement) -> tuple[str, ...]:
    """A home under the host's /tmp vanishes in the private /tmp: give the task an empty one in its place."""
    m = conf.mounts
    return (conf.home,) if mounts.left_out_by_private_tmp(conf.home, m.private_tmp, m.tmp_rebinds) else ()


def _launch(
    opts: RunOptions,
    ins: sandbox.Inside,
    daemon: daemonctl.Daemon,
    audit: AuditLog,
    broker: approvals.Broker | None,
    paths: runstate.RunPaths,
) -> int:
    """Fork the holder, map its ids, take its listeners, hand them on, let CMD start, supervise."""
    holder, chan = sandbox.start_holder(os.getpid(), ins)
    try:
        _expect_msg(chan, b"U", holder)
        try:
            userns.write_maps(holder, ins.ident)
        except OSError as e:
            raise RunError(f"cannot map ids into the sandbox's user namespace: {e.strerror}") from None
        chan.send(b"M")
        msg, fds, _, _ = socket.recv_fds(chan, 4096, 8)
        if not msg.startswith(b"L") or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            _fail_from(msg, holder)
        spec = BindingSpec(
            task=opts.task,
            policy=opts.policy.network,
            learn=opts.learn,
            ask_all=opts.ask,
            approval_socket=str(paths.dir / "approvals.sock") if broker else None,
            ask_timeout=opts.ask_timeout,
        )
        pending = _Handover(daemon, spec, [os.open(opts.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC), *fds])
        try:
            pending.try_bind()
        except daemonctl.DaemonError as e:
            raise RunError(str(e)) from None
        if broker is not None:
            broker.who = lambda ip, port: _asker(holder, ip, port)
            broker.start()  # threads only after the fork
        chan.send(b"G")
        return _supervise(holder, chan, pending, audit, opts.task)
    finally:
        chan.close()
        daemon.end()


def _expect_msg(chan: socket.socket, what: bytes, holder: int) -> None:
    msg = chan.recv(4096)
    if msg != what:
        _fail_from(msg, holder)


def _fail_from(msg: bytes, holder: int) -> None:
    os.waitpid(holder, 0)
    text = msg[1:].decode(errors="replace").strip() if msg[:1] == b"E" else ""
    raise RunError(text or "sandbox setup failed")


class _Handover:
    """The listeners (and audit fd) on their way to the daemon; ours are closed once it holds them."""

    def __init__(self, daemon: daemonctl.Daemon, spec: BindingSpec, fds: list[int]) -> None:
        self.daemon, self.spec, self.fds = daemon, spec, fds
        self.done = False

    def try_bind(self) -> None:
        if self.done or self.daemon.pending:
            return
        try:
            self.daemon.bind(self.spec, self.fds)
        finally:
            self.close()
        self.done = True

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _confinement(opts: RunOptions, audit: AuditLog, rt: Path) -> Confinement:
    """Plan the filesystem and process boundary; refuse what cannot be enforced as asked."""
    home = opts.user.home if opts.user else os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    # sandgate's own state (the daemon's control socket, the approval socket, the trusted policy
    # records) and an embedding tool's approval socket are never the sandbox's business: it must
    # not be able to answer its own questions, bind itself a wider policy, or learn what is trusted.
    from launcher.audit import logs as auditlogs
    from launcher.config import trust

    own = (str(rt), str(trust.state_dir()), str(auditlogs.log_dir()), *((opts.approvals,) if opts.approvals else ()))
    eff = fspolicy.effective(
        opts.policy.filesystem,
        cwd=os.getcwd(),
        home=home,
        extra_write=opts.write,
        extra_read_deny=(*opts.read_deny, *own),
    )
    # The audit log, wherever it lives, is never writable or removable from inside (the threat: a
    # task forging or erasing its own record). Inside a writable root it is bound read-only over
    # itself (a mount point cannot be unlinked or renamed, and its directories are pinned).
    # Outside every writable root Landlock already refuses it (and a private /tmp hides it).
    log = str(opts.audit_path)
    if any(log.startswith(r.rstrip("/") + "/") for r in eff.write if r != "/tmp"):
        eff = dataclasses.replace(eff, protect=(*eff.protect, (log, False)))
    weak = weakened()
    if weak:
        print(
            f"sandgate: WARNING: boundary deliberately weakened for a self-test: {', '.join(sorted(weak))}",
            file=sys.stderr,
        )
    if "git-hooks" in weak:
        eff = dataclasses.replace(eff, protect=tuple(p for p in eff.protect if not p[0].endswith("/.git/hooks")))
    try:
        mplan = mounts.plan(eff)
    except mounts.MountError as e:
        raise RunError(e.strerror or str(e)) from None
    try:
        overlay = homeoverlay.plan(
            home, mplan.write_roots, uid=opts.user.uid if opts.user else os.getuid(), owner=os.geteuid()
        )
    except homeoverlay.HomeOverlayError as e:
        raise RunError(e.strerror or str(e)) from None
    mplan = dataclasses.replace(mplan, home=overlay)
    warnings = list(mplan.notes)
    abi = landlock.abi_version()
    lplan: landlock.Plan | None = None
    if abi == 0:
        if opts.require_landlock:
            raise RunError("this kernel has no Landlock (disabled or too old), and --require-landlock was given")
        warnings.append("Landlock is not available on this kernel: writes are NOT restricted to the writable paths")
    else:
        lplan = landlock.plan((*mplan.write_roots, *((overlay.home,) if overlay else ())), abi=abi)
    env, dropped = fsenv.filter_env({k: v for k, v in os.environ.items() if k != WEAKEN_ENV}, opts.policy.env)
    audit.write(
        policy_record(
            opts.task,
            write=list(mplan.write_roots),
            private_tmp=mplan.private_tmp,
            protect=[*mplan.protect, *(p for p, _ in mplan.placeholders)],
            hidden=[*mplan.hide_dirs, *mplan.hide_files],
            env_dropped=dropped,
            landlock_abi=abi,
            warnings=warnings,
        )
    )
    for w in warnings:
        print(f"sandgate: warning: {w}", file=sys.stderr)
    if opts.verbose:
        tmp = " (private)" if mplan.private_tmp else ""
        print(
            f"sandgate: writable: {', '.join(r + (tmp if r == '/tmp' else '') for r in mplan.write_roots)}",
            file=sys.stderr,
        )
        print(
            f"sandgate: read-only: {', '.join([*mplan.protect, *(p for p, _ in mplan.placeholders)]) or '-'}",
            file=sys.stderr,
        )
        print(f"sandgate: hidden: {', '.join([*mplan.hide_dirs, *mplan.hide_files]) or '-'}", file=sys.stderr)
        print(f"sandgate: environment dropped: {', '.join(dropped) or '-'}", file=sys.stderr)
        print(f"sandgate: landlock ABI {abi}", file=sys.stderr)
        if overlay is not None:
            print(
                f"sandgate: home: {overlay.home} writable inside, writes kept in {overlay.upper} "
                "(the real home never changes; sandgate cache clear)",
                file=sys.stderr,
            )
    return Confinement(mplan, lplan, env, dropped, home)


def summary(path: Path, task: str) -> str:
    """The exit line, then (when something was refused) the denied destinations and what would allow each."""
    counts = {"allow": 0, "deny": 0, "would": 0}
    records: list[dict[str, object]] = []
    try:
        records = [r for r in read_records(path) if r.get("task") == task]
    except (OSError, ValueError):
        pass
    for r in records:
        if r.get("event") == "decision":
            action = str(r.get("action"))
            counts[action] = counts.get(action, 0) + 1
            counts["would"] += r.get("would") == "deny"
    would = f" ({counts['would']} would have been denied)" if counts["would"] else ""
    line = f"sandgate: {counts['allow']} allowed{would}, {counts['deny']} denied -> {path}"
    if not counts["deny"]:
        return line
    from launcher.audit import denials

    return "\n".join([line, *denials.lines(records, task, _bundled_rulesets())])


def _bundled_rulesets() -> dict[str, rules.Ruleset]:
    """Each bundled allowlist compiled, to say which one would allow a denied host (parse cache: fast)."""
    out: dict[str, rules.Ruleset] = {}
    for name in allowlists.bundled_names():
        path = allowlists.bundled_path(name)
        if path is None:
            continue
        try:
            sections = lpolicy.load_policy_file(path)
        except PolicyFileError:
            continue
        out[name] = rules.compile_policy(netpolicy.merge([s.network for s in sections]))
    return out


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


# ---- while it runs -----------------------------------------------------------------------


def _supervise(holder: int, chan: socket.socket, handover: _Handover, audit: AuditLog, task: str) -> int:
    """Wait for the sandbox; forward signals; hand over to a late daemon; report a dead one; record drops."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    pending: list[int] = []

    def on_signal(sig: int, _frame: object) -> None:
        pending.append(sig)

    old_wakeup = signal.set_wakeup_fd(wake_w)
    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    holder_fd = os.pidfd_open(holder)
    daemon = handover.daemon
    daemon_fd = daemon.wait_fd()
    chan_open = True
    try:
        while True:
            fds = [holder_fd, wake_r, *([chan] if chan_open else []), *([daemon_fd] if daemon_fd is not None else [])]
            ready, _, _ = select.select(fds, [], [], 1.0 if daemon.pending else None)
            if wake_r in ready:
                os.read(wake_r, 4096)
            while pending:
                sig = pending.pop(0)
                if sig in TTY_SIGNALS and _terminal_owns_us():
                    continue  # the terminal already delivered it to CMD's process group
                if chan_open:
                    chan.send(f"S{sig}".encode())
            if daemon_fd is not None and (daemon_fd in ready or daemon.pending):
                daemon_fd = _daemon_event(handover)
            if chan_open and chan in ready:
                chan_open = _drops(chan, audit, task)
            if holder_fd in ready:
                while chan_open:  # the holder's last report of dropped packets
                    chan_open = _drops(chan, audit, task)
                _, status = os.waitpid(holder, 0)
                code = os.waitstatus_to_exitcode(status)
                return 128 - code if code < 0 else code
    finally:
        os.close(holder_fd)
        handover.close()
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)


def _daemon_event(handover: _Handover) -> int | None:
    """The daemon became ready (bind now), failed to start, or died: returns the next fd to watch."""
    daemon = handover.daemon
    if daemon.pending:
        try:
            if not daemon.poll_ready():
                return daemon.wait_fd()
            handover.try_bind()
            return daemon.wait_fd()
        except daemonctl.DaemonError as e:
            handover.close()  # the waiting connections are reset: no network (fail closed)
            print(f"sandgate: error: {e}; the sandbox has no network (fail closed)", file=sys.stderr)
            return None
    print(
        "sandgate: error: the proxy daemon exited; the sandbox has no network from now on (fail closed)",
        file=sys.stderr,
    )
    daemon.close()
    return None


def _drops(chan: socket.socket, audit: AuditLog, task: str) -> bool:
    """One `kind: packet` record per (destination, protocol, port) the sandbox's table dropped; False at EOF."""
    try:
        msg = chan.recv(4096)
    except OSError:
        return False
    if not msg:
        return False
    if msg[:1] == b"D":
        dst, proto, port = msg[1:].decode(errors="replace").split(" ")
        audit.write(
            decision_record(
                task,
                uuid.uuid4().hex[:12],
                "packet",
                "deny",
                dst,
                int(port) if port.isdigit() else None,
                proto=proto,
                reason=f"{proto} packet dropped by the sandbox firewall",
            )
        )
    elif msg[:1] == b"E":
        print(f"sandgate: error: {msg[1:].decode(errors='replace')}", file=sys.stderr)
    return True


def _terminal_owns_us() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _open_audit(path: Path) -> AuditLog:
    try:
        return AuditLog(path)
    except OSError as e:
        raise RunError(f"cannot open audit log {path}: {e.strerror}; choose another --audit-log") from None


def resolve_user(spec: str | None) -> User | None:
    """--user NAME|UID, else the sudo caller (SUDO_UID), else None (stay root)."""
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
