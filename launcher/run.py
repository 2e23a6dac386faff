"""`sandgate run`: the launch sequence, top to bottom.

  policy -> state + lock -> veth -> proxy up -> nftables -> fork sandbox
  (new net/mount/pid namespaces; net configured; mounts; privileges dropped; exec CMD)
  -> wait, forward signals, watch the proxy, record dropped packets -> tear down -> summary

Processes, and why each exists:
  sandgate (root, host namespaces)  owns the veth, the nft table and the proxy; removes them
  proxy    (child of sandgate)      the only decision point; dies with sandgate (PDEATHSIG)
  holder   (child of sandgate)      unshares net+mount+pid; its netns receives the veth
  init     (pid 1 of the sandbox)   forwards signals, reaps orphans; when it exits the kernel
                                    kills every process left in the pid namespace (daemons
                                    included), and with the last one the netns and veth vanish
  CMD      (child of init)          the user's command, in the terminal's foreground group
A SIGKILLed sandgate takes holder and init with it (PDEATHSIG chain); the next run or
`sandgate cleanup` removes the table, link and state it left.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pwd
import select
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fsguard import landlock, mounts, process, seccomp
from fsguard import policy as fspolicy
from launcher import approvals, whoasked
from launcher import policy as lpolicy
from netguard import netns, nft
from netguard.audit import AuditLog, decision_record, policy_record, read_records

STATE_DIR = Path("/run/sandgate")
REGULAR_PORT, TRANSPARENT_PORT, DNS_PORT = 3128, 3129, 53
PROXY_START_TIMEOUT = 30.0
EXIT_ERROR = 125

# Signals a user sends to sandgate that CMD should get. Terminal-generated ones (Ctrl-C, Ctrl-\)
# already reach CMD directly because it is in the terminal's foreground process group.
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGQUIT,
             signal.SIGCONT)
TTY_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


#: Test-only: sandgate verify's self-test sets this to weaken ONE mechanism and prove that the
#: matching probes then fail. Not a command-line option; announced loudly; never passed inside.
WEAKEN_ENV = "SANDGATE_INTERNAL_WEAKEN"
WEAKENINGS = frozenset({"firewall", "git-hooks"})


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
    policy_args: list[str]  # --policy/--allow/--deny, re-passed to the proxy process verbatim
    cmd: list[str]
    audit_path: Path
    user: User | None
    policy: lpolicy.Policy = field(default_factory=lambda: lpolicy.Policy(lpolicy.netpolicy.NetworkPolicy(), ()))
    write: tuple[str, ...] = ()  # --write
    read_deny: tuple[str, ...] = ()  # --read-deny
    require_landlock: bool = False
    learn: bool = False  # let default-deny names through, recorded as would: deny
    ask: bool = False  # every default-deny name is a question for a human
    ask_timeout: float = 60.0
    approvals: str | None = None  # unix socket path for an embedding tool; None: the terminal
    quiet: bool = False
    verbose: bool = False
    net_range: str = netns.DEFAULT_RANGE
    task: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


@dataclass(frozen=True)
class Confinement:
    """Everything the sandbox's processes apply, computed in the launcher before anything starts."""

    mounts: mounts.MountPlan
    landlock: landlock.Plan | None  # None: the kernel has no Landlock (and it was not required)
    env: dict[str, str]
    env_dropped: list[str]


# ---- the sequence -------------------------------------------------------------------------


def run(opts: RunOptions) -> int:
    if os.geteuid() != 0:
        raise RunError("sandgate run needs root to build namespaces and firewall rules; run it with sudo "
                       "(the command itself runs as you)")
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    state = STATE_DIR / f"{run_id}.json"
    audit = _open_audit(opts.audit_path)  # before planning: its directory (.sandgate) is then protected too
    placeholders: list[str] = []
    link: netns.Link | None = None
    proxy: subprocess.Popen[bytes] | None = None
    broker: approvals.Broker | None = None
    table = f"{nft.TABLE_PREFIX}{run_id}"
    status = EXIT_ERROR
    dropped_seen: set[tuple[str, str, int | None]] = set()
    try:
        if opts.ask or opts.policy.network.ask:
            # Before planning the mounts: its sockets must exist to be hidden from the sandbox.
            _run_dir(run_id).mkdir(mode=0o700, parents=True, exist_ok=True)
            broker = approvals.Broker(_run_dir(run_id) / "approvals.sock", audit, opts.task, opts.ask_timeout,
                                      channel=opts.approvals, policy_file=_first_policy_file(opts))
        with lock():
            cleanup_stale()  # first: a killed run's placeholders must not be mistaken for the workspace's files
            conf = _confinement(opts, audit)
            link = netns.create_link(run_id, opts.net_range)
            _write_state(state, run_id, link.host_if, table, None, conf.mounts.placeholders)
            placeholders = mounts.create_placeholders(conf.mounts)
        proxy = _start_proxy(opts, run_id, link, broker is not None)
        _write_state(state, run_id, link.host_if, table, proxy.pid, conf.mounts.placeholders)
        nft.apply(nft.SandboxNet(run_id, link.host_if, link.gateway, REGULAR_PORT, TRANSPARENT_PORT, DNS_PORT),
                  open_firewall="firewall" in weakened())
        if broker is not None:
            _tell_terminal(broker.banner())
        holder, ctl = _spawn_sandbox(opts, conf, run_id, link)
        if broker is not None:
            broker.who = lambda ip, port: _asker(holder, ip, port)
            broker.start()  # threads only after the fork
        status = _supervise(holder, ctl, proxy, table, audit, opts.task, dropped_seen)
    finally:
        if broker is not None:
            broker.stop()
        if link is not None:
            _record_drops(table, audit, opts.task, dropped_seen)
        nft.remove(table)
        if link is not None:
            netns.remove_link(link.host_if)
        if proxy is not None:
            _stop(proxy)
        mounts.remove_placeholders(placeholders)
        state.unlink(missing_ok=True)
        _rm_run_dir(run_id)
        audit.close()
    if not opts.quiet:
        print(summary(opts.audit_path, opts.task), file=sys.stderr)
    return status


def _confinement(opts: RunOptions, audit: AuditLog) -> Confinement:
    """Plan the filesystem and process boundary; refuse what cannot be enforced as asked."""
    home = opts.user.home if opts.user else os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    # sandgate's own state (the proxy's approval socket) and an embedding tool's approval socket
    # are never the sandbox's business: it must not be able to answer its own questions.
    own = (str(STATE_DIR), *((opts.approvals,) if opts.approvals else ()))
    eff = fspolicy.effective(opts.policy.filesystem, cwd=os.getcwd(), home=home, extra_write=opts.write,
                             extra_read_deny=(*opts.read_deny, *own))
    weak = weakened()
    if weak:
        print(f"sandgate: WARNING: boundary deliberately weakened for a self-test: {', '.join(sorted(weak))}",
              file=sys.stderr)
    if "git-hooks" in weak:
        eff = dataclasses.replace(eff, protect=tuple(p for p in eff.protect if not p[0].endswith("/.git/hooks")))
    try:
        mplan = mounts.plan(eff)
    except mounts.MountError as e:
        raise RunError(e.strerror or str(e)) from None
    warnings = list(mplan.notes)
    abi = landlock.abi_version()
    lplan: landlock.Plan | None = None
    if abi == 0:
        if opts.require_landlock:
            raise RunError("this kernel has no Landlock (disabled or too old), and --require-landlock was given")
        warnings.append("Landlock is not available on this kernel: writes are NOT restricted to the writable paths")
    else:
        lplan = landlock.plan(mplan.write_roots, abi=abi)
    env, dropped = fspolicy.filter_env({k: v for k, v in os.environ.items() if k != WEAKEN_ENV}, opts.policy.env)
    audit.write(policy_record(
        opts.task, write=list(mplan.write_roots), private_tmp=mplan.private_tmp,
        protect=[*mplan.protect, *(p for p, _ in mplan.placeholders)], hidden=[*mplan.hide_dirs, *mplan.hide_files],
        env_dropped=dropped, landlock_abi=abi, warnings=warnings))
    for w in warnings:
        print(f"sandgate: warning: {w}", file=sys.stderr)
    if opts.verbose:
        tmp = " (private)" if mplan.private_tmp else ""
        print(f"sandgate: writable: {', '.join(r + (tmp if r == '/tmp' else '') for r in mplan.write_roots)}",
              file=sys.stderr)
        print(f"sandgate: read-only: {', '.join([*mplan.protect, *(p for p, _ in mplan.placeholders)]) or '-'}",
              file=sys.stderr)
        print(f"sandgate: hidden: {', '.join([*mplan.hide_dirs, *mplan.hide_files]) or '-'}", file=sys.stderr)
        print(f"sandgate: environment dropped: {', '.join(dropped) or '-'}", file=sys.stderr)
        print(f"sandgate: landlock ABI {abi}", file=sys.stderr)
    return Confinement(mplan, lplan, env, dropped)


def summary(path: Path, task: str) -> str:
    counts = {"allow": 0, "deny": 0, "would": 0}
    try:
        for r in read_records(path):
            if r.get("task") == task and r.get("event") == "decision":
                counts[r["action"]] = counts.get(r["action"], 0) + 1
                counts["would"] += r.get("would") == "deny"
    except OSError:
        pass
    would = f" ({counts['would']} would have been denied)" if counts["would"] else ""
    return f"sandgate: {counts['allow']} allowed{would}, {counts['deny']} denied -> {path}"


def _first_policy_file(opts: RunOptions) -> Path | None:
    args = opts.policy_args
    return Path(args[args.index("--policy") + 1]) if "--policy" in args else None


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
    found = whoasked.find_asker(netns_pid, ip, port)
    return f"{found.name}[{found.pid}]" if found else None


# ---- state, locking, stale runs -----------------------------------------------------------


class lock:
    """Serialises subnet choice and stale cleanup between concurrent runs."""

    def __enter__(self) -> None:
        self.fd = os.open(STATE_DIR / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _netns_inode() -> int:
    return os.stat("/proc/self/ns/net").st_ino


def _starttime(pid: int) -> str | None:
    """Process start time (clock ticks since boot): a pid plus this identifies one process, even after reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _write_state(path: Path, run_id: str, host_if: str, table: str, proxy_pid: int | None,
                 placeholders: tuple[tuple[str, bool], ...]) -> None:
    data = {"id": run_id, "pid": os.getpid(), "start": _starttime(os.getpid()), "netns": _netns_inode(),
            "host_if": host_if, "table": table, "proxy_pid": proxy_pid,
            "proxy_start": _starttime(proxy_pid) if proxy_pid else None,
            "placeholders": [p for p, _ in placeholders]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def cleanup_stale() -> list[str]:
    """Remove what killed runs left in this network namespace: tables, links, proxies, state files.

    A run is alive while its sandgate process (pid + start time) is; only dead runs are touched,
    and only tables/links with our prefix whose run id has no live owner.
    """
    removed: list[str] = []
    live_ids: set[str] = set()
    me = _netns_inode()
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("netns") != me:
            continue  # another network namespace's run: not ours to judge
        if _starttime(int(data["pid"])) == data.get("start"):
            live_ids.add(data["id"])
            continue
        pp = data.get("proxy_pid")
        if pp and _starttime(int(pp)) == data.get("proxy_start"):
            os.kill(int(pp), signal.SIGKILL)
            removed.append(f"proxy pid {pp}")
        mounts.remove_placeholders(list(data.get("placeholders", [])))
        for ph in data.get("placeholders", []):
            if not os.path.lexists(ph):
                removed.append(f"placeholder {ph}")
        path.unlink(missing_ok=True)
        _rm_run_dir(data["id"])
    for table in nft.list_tables():
        if table[len(nft.TABLE_PREFIX):] not in live_ids and nft.remove(table):
            removed.append(f"nftables table inet {table}")
    for ifname in netns.list_links("sg"):
        rid = ifname[2:-1]
        if ifname.endswith("h") and len(rid) == 8 and rid not in live_ids and netns.remove_link(ifname):
            removed.append(f"link {ifname}")
    return removed


def _run_dir(run_id: str) -> Path:
    return STATE_DIR / run_id


def _rm_run_dir(run_id: str) -> None:
    d = _run_dir(run_id)
    if d.is_dir():
        for f in d.iterdir():
            if f.is_dir():
                f.rmdir()  # the /tmp staging mount point, empty outside the sandbox's namespace
            else:
                f.unlink(missing_ok=True)
        d.rmdir()


def _open_audit(path: Path) -> AuditLog:
    try:
        return AuditLog(path)
    except OSError as e:
        raise RunError(f"cannot open audit log {path}: {e.strerror}; choose another --audit-log") from None


# ---- the proxy process --------------------------------------------------------------------


def _start_proxy(opts: RunOptions, run_id: str, link: netns.Link, asking: bool) -> subprocess.Popen[bytes]:
    """The proxy in its own process: a crash there cannot take the launcher's cleanup with it."""
    d = _run_dir(run_id)
    d.mkdir(mode=0o700, exist_ok=True)
    log = open(d / "proxy.log", "wb")
    r, w = os.pipe()
    gw = link.gateway
    argv = [sys.executable, "-m", "launcher.cli", "proxy", *opts.policy_args, "-q",
            "--listen", f"{gw}:{REGULAR_PORT}", "--transparent", f"{gw}:{TRANSPARENT_PORT}",
            "--dns", f"{gw}:{DNS_PORT}", "--audit-log", str(opts.audit_path.resolve()), "--task", opts.task,
            "--ready-fd", str(w), *(["--learn"] if opts.learn else []), *(["--ask-all"] if opts.ask else []),
            *(["--approval-socket", str(d / "approvals.sock"), "--ask-timeout", str(opts.ask_timeout)] if asking else [])]
    me = os.getpid()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(w,),
                            preexec_fn=lambda: process.die_with_parent(me))  # noqa: PLW1509 - no threads here
    os.close(w)
    log.close()
    ready, _, _ = select.select([r], [], [], PROXY_START_TIMEOUT)
    ok = bool(ready) and os.read(r, 16).startswith(b"ready")
    os.close(r)
    if not ok:
        _stop(proxy_proc := proc)
        tail = (d / "proxy.log").read_text(errors="replace").strip().splitlines()
        raise RunError(f"proxy did not start (exit {proxy_proc.returncode}): {tail[-1] if tail else 'no output'}")
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- the sandbox processes ----------------------------------------------------------------


def _spawn_sandbox(opts: RunOptions, conf: Confinement, run_id: str, link: netns.Link) -> tuple[int, int]:
    """Fork the holder; give its new netns the veth; returns (holder pid, control pipe write end)."""
    up_r, up_w = os.pipe()  # holder -> sandgate: "U" unshared, or an error line
    go_r, go_w = os.pipe()  # sandgate -> holder/init: "G" go, then signal numbers to forward
    run_dir = _run_dir(run_id)
    resolv = run_dir / "resolv.conf"
    resolv.write_text(f"# written by sandgate: the sandbox's only resolver is its DNS listener\n"
                      f"nameserver {link.gateway}\noptions edns0\n")
    resolv.chmod(0o644)
    (run_dir / "empty").touch(0o444)
    (run_dir / "hosttmp").mkdir(0o700, exist_ok=True)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # holder
        try:
            os.close(up_r)
            os.close(go_w)
            _holder(parent, up_w, go_r, opts, conf, link, run_dir)
        except BaseException as e:  # noqa: BLE001 - a forked child must never return into the parent's code
            os.write(2, f"sandgate: error: {e}\n".encode())
        os._exit(EXIT_ERROR)
    os.close(up_w)
    os.close(go_r)
    msg = os.read(up_r, 4096)
    os.close(up_r)
    if msg != b"U":
        os.waitpid(pid, 0)
        raise RunError(msg.decode(errors="replace").strip() or "sandbox setup failed")
    netns.move_into(link, pid)
    os.write(go_w, b"G")
    return pid, go_w


def _holder(parent: int, up_w: int, go_r: int, opts: RunOptions, conf: Confinement, link: netns.Link,
            run_dir: Path) -> None:
    process.die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for CMD; reset before exec
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        os.unshare(os.CLONE_NEWNET | os.CLONE_NEWNS | os.CLONE_NEWPID)
    except OSError as e:
        os.write(up_w, f"cannot create namespaces: {e.strerror}".encode())
        os._exit(EXIT_ERROR)
    os.write(up_w, b"U")
    os.close(up_w)
    if os.read(go_r, 1) != b"G":
        os._exit(EXIT_ERROR)  # sandgate gave up
    init = os.fork()
    if init == 0:
        try:
            _init(go_r, opts, conf, link, run_dir)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"sandgate: error: sandbox setup: {e}\n".encode())
        os._exit(EXIT_ERROR)
    os.close(go_r)
    _, status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else EXIT_ERROR)


def _init(ctl: int, opts: RunOptions, conf: Confinement, link: netns.Link, run_dir: Path) -> None:
    """pid 1 of the sandbox: set up inside, start CMD, forward signals, reap, exit with CMD's status."""
    process.die_with_parent(None)  # our parent (the holder) is outside this pid namespace: getppid() is 0
    netns.configure_inside(link)
    mounts.make_private()
    mounts.fresh_proc_sys()
    mounts.build(conf.mounts, run_dir, {"/etc/resolv.conf": run_dir / "resolv.conf"})
    env = _sandbox_env(conf.env, link, opts.user)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    cmd = os.fork()
    if cmd == 0:
        _exec_cmd(opts, conf, env)
    status = None
    while status is None:
        ready, _, _ = select.select([ctl, wake_r], [], [])
        if ctl in ready:
            data = os.read(ctl, 64)
            if not data:  # sandgate is gone: end the sandbox now
                os.kill(-1, signal.SIGKILL)
                os._exit(EXIT_ERROR)
            for b in data:
                os.kill(cmd, b)
        if wake_r in ready:
            os.read(wake_r, 4096)
        while True:  # reap every exited child; orphaned daemons are re-parented to us
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == cmd:
                status = st
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)  # dying by signal N reads as 128+N, as in a shell


def _exec_cmd(opts: RunOptions, conf: Confinement, env: dict[str, str]) -> None:
    try:
        process.reset_signals()
        if opts.user is not None:
            os.setgroups(opts.user.groups)
            os.setgid(opts.user.gid)
            os.setuid(opts.user.uid)
        process.no_new_privs()  # setuid binaries cannot regain what we dropped; Landlock needs it too
        if conf.landlock is not None:
            for warning in landlock.apply(conf.landlock):
                os.write(2, f"sandgate: warning: {warning}\n".encode())
        seccomp.install()
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
        os.execvpe(opts.cmd[0], opts.cmd, env)
    except FileNotFoundError:
        os.write(2, f"sandgate: error: {opts.cmd[0]}: command not found\n".encode())
        os._exit(127)
    except PermissionError as e:
        os.write(2, f"sandgate: error: {opts.cmd[0]}: {e.strerror}\n".encode())
        os._exit(126)
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"sandgate: error: cannot start {opts.cmd[0]}: {e}\n".encode())
    os._exit(EXIT_ERROR)


def _sandbox_env(filtered: dict[str, str], link: netns.Link, user: User | None) -> dict[str, str]:
    """The filtered environment plus the proxy variables (a convenience: the boundary is nftables)."""
    env = dict(filtered)
    proxy = f"http://{link.gateway}:{REGULAR_PORT}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    if user is not None:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        for k in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
            env.pop(k, None)
    return env


# ---- while it runs -----------------------------------------------------------------------


def _supervise(holder: int, ctl: int, proxy: subprocess.Popen[bytes], table: str, audit: AuditLog, task: str,
               seen: set[tuple[str, str, int | None]]) -> int:
    """Wait for the sandbox; forward signals; report a dead proxy; turn dropped packets into records."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    pending: list[int] = []

    def on_signal(sig: int, _frame: object) -> None:
        pending.append(sig)

    old_wakeup = signal.set_wakeup_fd(wake_w)
    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    holder_fd = os.pidfd_open(holder)
    proxy_fd: int | None = os.pidfd_open(proxy.pid)
    try:
        while True:
            fds = [holder_fd, wake_r] + ([proxy_fd] if proxy_fd is not None else [])
            ready, _, _ = select.select(fds, [], [], 1.0)
            if wake_r in ready:
                os.read(wake_r, 4096)
            while pending:
                sig = pending.pop(0)
                if sig in TTY_SIGNALS and _terminal_owns_us():
                    continue  # the terminal already delivered it to CMD's process group
                try:
                    os.write(ctl, bytes([sig]))
                except OSError:
                    pass
            if proxy_fd is not None and proxy_fd in ready:
                proxy.wait()
                os.close(proxy_fd)
                proxy_fd = None
                print(f"sandgate: error: the proxy exited (code {proxy.returncode}); the sandbox has no network "
                      "from now on (fail closed)", file=sys.stderr)
            _record_drops(table, audit, task, seen)
            if holder_fd in ready:
                _, status = os.waitpid(holder, 0)
                code = os.waitstatus_to_exitcode(status)
                return 128 - code if code < 0 else code
    finally:
        os.close(holder_fd)
        if proxy_fd is not None:
            os.close(proxy_fd)
        os.close(ctl)
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)


def _terminal_owns_us() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _record_drops(table: str, audit: AuditLog, task: str, seen: set[tuple[str, str, int | None]]) -> None:
    """One `kind: packet` record per (destination, protocol, port) the kernel dropped."""
    for dst, proto, port, _packets in nft.dropped(table):
        key = (dst, proto, port)
        if key in seen:
            continue
        seen.add(key)
        audit.write(decision_record(task, uuid.uuid4().hex[:12], "packet", "deny", dst, port, proto=proto,
                                    reason=f"{proto} packet dropped by the sandbox firewall"))


def resolve_user(spec: str | None) -> User | None:
    """--user NAME|UID, else the sudo caller (SUDO_UID), else None (stay root)."""
    try:
        if spec is not None:
            pw = pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
        elif os.environ.get("SUDO_UID", "0") not in ("", "0"):
            pw = pwd.getpwuid(int(os.environ["SUDO_UID"]))
        else:
            return None
    except (KeyError, ValueError):
        raise RunError(f"unknown user '{spec}'; give a user name or uid that exists on this machine") from None
    return User(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir, os.getgrouplist(pw.pw_name, pw.pw_gid))
