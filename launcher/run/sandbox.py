"""The sandbox's own processes, in the order they are made (bubblewrap-style: each step explicit).

  launcher (host namespaces, as whoever started sandgate)
    └─ holder   forked before the launcher plans the confinement, with what it needs first (Early):
                unshare user+net+mount+pid+ipc+uts; net: lo + nft table + listeners
                (netguard.sandboxnet) while the launcher plans; the launcher writes its uid/gid
                maps; it hands the listeners to the launcher and closes them; with the go it gets
                the rest (Inside, in a sealed memfd), forks init and, while the sandbox lives,
                reports the packets the table dropped. It is outside the sandbox's pid namespace:
                nothing inside can signal, trace or even name it.
        └─ init (pid 1)  mounts (fsguard.mounts), a fresh session keyring, on a terminal the
                command's pty (fsguard.sandboxpty: the master goes out to the launcher), forwards signals,
                reaps orphans; when it exits the kernel kills every process left in the pid
                namespace, and with the last one the network namespace and its listeners vanish
            └─ CMD  (on a terminal: a session of its own, the pty its terminal) bounding set cut,
                    ids taken, no_new_privs, Landlock, seccomp, exec
No process of the sandbox ever held a dropped environment variable: the holder scrubs the
environment block it inherited (what /proc/<pid>/environ shows) before anything else, and
init and the holder are not dumpable.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pickle
import select
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from fsguard import caps, kernelfs, landlock, mounts, process, seccomp, userns
from launcher import timings
from launcher.errors import EXIT_ERROR, RunError
from netguard import sandboxnet
from netguard.nft import Nft, Ports

if TYPE_CHECKING:  # imported only when sandgate runs on a terminal
    from fsguard.sandboxpty import PtyPlan

HOSTNAME = "sandgate"
DROP_POLL = 1.0  # seconds between reports of dropped packets while the sandbox lives
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE = 4
NS_FLAGS = os.CLONE_NEWUSER | os.CLONE_NEWNS | os.CLONE_NEWPID | os.CLONE_NEWIPC | os.CLONE_NEWUTS


@dataclass(frozen=True)
class Early:
    """What the holder needs before the launcher has planned the rest: forked first, it makes the
    namespaces and the network inside while the launcher plans (~5 ms of every run, issue 25)."""

    ports: Ports
    own_netns: bool = True  # False only for the self-test's "firewall" weakening
    nested_userns: bool = False  # --allow-nested-userns (or the self-test's weakening)
    tty: PtyPlan | None = None  # on a terminal: the command's pty (fsguard/sandboxpty.py)


@dataclass(frozen=True)
class Inside:
    """Everything the sandbox's processes need, computed by the launcher before the fork."""

    cmd: tuple[str, ...]
    env: dict[str, str]
    ident: userns.Identity
    mounts: mounts.MountPlan
    landlock: landlock.Plan | None
    run_dir: Path
    ports: Ports
    own_netns: bool = True  # False only for the self-test's "firewall" weakening
    keep_net_admin: bool = False  # True only for the self-test's "netadmin" weakening
    make_dirs: tuple[str, ...] = ()  # empty directories the command's user gets inside (a home under /tmp)
    files: tuple[tuple[str, Path], ...] = ()  # (host file, run-dir file bound read-only over it): the CA bundle
    nested_userns: bool = False  # --allow-nested-userns: the command may make user namespaces of its own
    tty: PtyPlan | None = None  # on a terminal: the command gets a pty of the sandbox's devpts (fsguard/sandboxpty.py)


def start_holder(parent: int, early: Early) -> tuple[int, socket.socket]:
    """Fork the holder; returns (pid, the launcher's end of the control channel)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            mine.close()
            _holder(parent, theirs, early)
        except BaseException as e:
            _report(theirs, f"E{e}")
        os._exit(EXIT_ERROR)
    theirs.close()
    return pid, mine


def go(chan: socket.socket, ins: Inside) -> None:
    """The go, with everything init and CMD need: pickled into a sealed memfd (an environment and a
    mount plan can outgrow one message), read by the holder, its parent's child."""
    fd = os.memfd_create("sandgate-inside", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, pickle.dumps(ins, protocol=pickle.HIGHEST_PROTOCOL))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        socket.send_fds(chan, [b"G"], [fd])
    finally:
        os.close(fd)


def _inside(chan: socket.socket) -> Inside:
    """The holder's half of the go (the launcher gave up instead: the holder exits)."""
    msg, fds, _, _ = socket.recv_fds(chan, 16, 1)
    if msg != b"G" or len(fds) != 1:
        os._exit(EXIT_ERROR)
    os.lseek(fds[0], 0, os.SEEK_SET)  # one open file with the launcher's: its offset is at the end
    with os.fdopen(fds[0], "rb") as f:
        ins = pickle.load(f)
    if not isinstance(ins, Inside):
        os._exit(EXIT_ERROR)
    return ins


def handshake(holder: int, chan: socket.socket, ident: userns.Identity) -> list[int]:
    """The launcher's half: map the holder's ids once it has its namespaces, take its four listeners."""
    _expect_msg(chan, b"U", holder)
    try:
        userns.write_maps(holder, ident)
    except OSError as e:
        raise RunError(f"cannot map ids into the sandbox's user namespace: {e.strerror}") from None
    chan.send(b"M")
    msg, fds, _, _ = socket.recv_fds(chan, 4096, 8)
    if not msg.startswith(b"L") or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        _fail_from(msg, holder)
    return fds


def _expect_msg(chan: socket.socket, what: bytes, holder: int) -> None:
    msg = chan.recv(4096)
    if msg != what:
        _fail_from(msg, holder)


def _fail_from(msg: bytes, holder: int) -> NoReturn:
    os.waitpid(holder, 0)
    text = msg[1:].decode(errors="replace").strip() if msg[:1] == b"E" else ""
    raise RunError(text or "sandbox setup failed")


def _report(chan: socket.socket, text: str) -> None:
    try:
        chan.send(text.encode(errors="replace")[:4000])
    except OSError:
        pass


def _expect(chan: socket.socket, what: bytes) -> None:
    if chan.recv(16) != what:
        os._exit(EXIT_ERROR)  # the launcher gave up


def scrub_environment() -> None:
    """Forget the inherited environment, including the block /proc/self/environ reads (the threat:
    /proc/1/environ of the sandbox's init showing variables the policy dropped)."""
    os.environ.clear()
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[50]), int(fields[51])  # env_start, env_end (fields 53 and 54 of stat)
    except (OSError, IndexError, ValueError):
        return
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def _holder(parent: int, chan: socket.socket, early: Early) -> None:
    process.die_with_parent(parent)
    if early.tty is not None:
        os.close(early.tty.peer)  # the launcher's end of the pty socket stays the launcher's
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for CMD; reset before exec
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    scrub_environment()
    try:
        os.unshare(NS_FLAGS | (os.CLONE_NEWNET if early.own_netns else 0))
    except OSError as e:
        problem = userns.unprivileged_userns_problem() if os.getuid() != 0 else None
        _report(chan, f"Ecannot create the sandbox's namespaces: {e.strerror}" + (f" ({problem})" if problem else ""))
        os._exit(EXIT_ERROR)
    timings.mark("unshare")
    # The network inside first: it needs no uid map (we hold every capability of the new namespaces),
    # and the launcher is planning the confinement meanwhile.
    nft: Nft | None = None
    if early.own_netns:
        listeners, nft = sandboxnet.configure(early.ports)
    else:
        listeners = sandboxnet.make_listeners(Ports(0, 0, 0))
    timings.mark("nft")
    chan.send(b"U")
    _expect(chan, b"M")  # the launcher wrote our uid/gid maps (it could not, were we already undumpable)
    if not early.nested_userns:
        userns.forbid_nested()  # the threat: nested user+net namespaces, CAP_NET_ADMIN and nf_tables inside
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing inside may read our memory, nor init's (inherited)
    socket.sethostname(HOSTNAME)
    proxy = proxy_env(listeners.regular.getsockname()[1])
    socket.send_fds(chan, [b"L"], listeners.fds())
    listeners.close()  # from here on only the daemon holds them: if it dies, they die (fail closed)
    ins = _inside(chan)
    ins.env.update(proxy)
    sig_r, sig_w = os.pipe2(os.O_CLOEXEC)  # holder -> init: signal numbers to forward to CMD
    init = os.fork()
    if init == 0:
        try:
            chan.close()
            os.close(sig_w)
            _init(ins, sig_r)
        except BaseException as e:
            os.write(2, f"sandgate: error: sandbox setup: {e}\n".encode())
        os._exit(EXIT_ERROR)
    os.close(sig_r)
    if ins.tty is not None:
        os.close(ins.tty.sock)  # init holds the only other copy: its death reads as EOF in the launcher
    status = _watch(init, chan, sig_w, nft)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else EXIT_ERROR)


def proxy_env(port: int) -> dict[str, str]:
    """The proxy variables: a convenience for clients that honour them; the boundary is the namespace."""
    env = {}
    proxy = f"http://127.0.0.1:{port}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env


def _watch(init: int, chan: socket.socket, sig_w: int, nft: Nft | None) -> int:
    """Wait for init; relay the launcher's signals; report newly dropped packets (and once more at the end)."""
    seen: set[tuple[str, str, int | None]] = set()
    pidfd = os.pidfd_open(init)
    while True:
        ready, _, _ = select.select([pidfd, chan.fileno()], [], [], DROP_POLL)
        if chan.fileno() in ready:
            msg = chan.recv(64)
            if not msg:
                os.kill(init, signal.SIGKILL)  # the launcher is gone: end the sandbox now
            elif msg[:1] == b"S":
                try:
                    os.write(sig_w, bytes([int(msg[1:])]))
                except (OSError, ValueError):
                    pass
        done = pidfd in ready
        if nft is not None:
            for dst, proto, port, _n in nft.dropped():
                if (dst, proto, port) not in seen:
                    seen.add((dst, proto, port))
                    _report(chan, f"D{dst} {proto} {port if port is not None else '-'}")
        if done:
            _, status = os.waitpid(init, 0)
            return status


def _init(ins: Inside, sig_r: int) -> None:
    """pid 1 of the sandbox: set up inside, start CMD, forward signals, reap, exit with CMD's status."""
    process.die_with_parent(None)  # our parent (the holder) is outside this pid namespace: getppid() is 0
    mounts.make_private()
    kernelfs.fresh_proc_sys(tuple(t for t, _ in ins.files if t.startswith("/dev/")))  # mount points: notices
    files = {"/etc/resolv.conf": ins.run_dir / "resolv.conf"} if ins.own_netns else {}
    mounts.build(ins.mounts, ins.run_dir, {**files, **dict(ins.files)})
    for d in ins.make_dirs:  # in the private /tmp only: nothing here reaches the host
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chown(d, ins.ident.uid, ins.ident.gid)
    caps.join_session_keyring()  # the threat: the caller's keyring readable from inside
    if ins.tty is not None:  # the host's terminal out, the sandbox's own pty in
        from fsguard import sandboxpty

        sandboxpty.setup_in_init(ins.tty, ins.ident.uid, ins.ident.gid)
    timings.mark("mounts")
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    cmd = os.fork()
    if cmd == 0:
        _exec_cmd(ins)
    status = None
    while status is None:
        ready, _, _ = select.select([sig_r, wake_r], [], [])
        if sig_r in ready:
            data = os.read(sig_r, 64)
            if not data:  # the holder is gone: end the sandbox now
                os._exit(EXIT_ERROR)
            for b in data:
                try:
                    os.kill(cmd, b)
                except ProcessLookupError:
                    pass
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


_TMP_HINT = "the sandbox has its own, empty /tmp: run it from elsewhere, or add its directory with --write"


def _not_found(name: str, path: str) -> str:
    """Why exec found nothing, as seen inside: a missing #! interpreter, or a tool under the host's /tmp."""
    dirs = [d or "." for d in path.split(":")] if "/" not in name else []
    found = next((f for f in (os.path.join(d, name) for d in dirs) if os.path.isfile(f)), None)
    if ("/" in name and os.path.isfile(name)) or found:
        return f"{found or name}: its interpreter (the #! line) was not found"
    if name.startswith("/tmp/") or any(d == "/tmp" or d.startswith("/tmp/") for d in dirs):
        return f"{name}: command not found ({_TMP_HINT})"
    return f"{name}: command not found"


def _exec_cmd(ins: Inside) -> None:
    name = ins.cmd[0]
    try:
        if ins.tty is not None:
            from fsguard import sandboxpty

            sandboxpty.become_controlling(ins.tty.fds[0])
        process.reset_signals()
        keep = caps.KEEP | ({caps.CAP_NET_ADMIN} if ins.keep_net_admin else set())
        caps.drop_bounding(frozenset(keep))  # before giving up root: dropping needs CAP_SETPCAP
        caps.clear_ambient()
        userns.become(ins.ident)
        if ins.ident.root_inside:
            caps.limit_current(keep)  # an inheritable bit outside KEEP would survive exec as uid 0
        process.no_new_privs()  # setuid binaries cannot regain what we dropped; Landlock needs it too
        if ins.landlock is not None:
            for warning in landlock.apply(ins.landlock):
                os.write(2, f"sandgate: warning: {warning}\n".encode())
        seccomp.install(nested_userns=ins.nested_userns)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
        timings.mark("confine")
        os.execvpe(name, list(ins.cmd), ins.env)
    except FileNotFoundError:
        os.write(2, f"sandgate: error: {_not_found(name, ins.env.get('PATH', os.defpath))}\n".encode())
        os._exit(127)
    except PermissionError as e:
        os.write(2, f"sandgate: error: {name}: {e.strerror}\n".encode())
        os._exit(126)
    except OSError as e:
        os.write(2, f"sandgate: error: cannot start {name}: {e.strerror or e}\n".encode())
        os._exit(126 if e.errno == 8 else EXIT_ERROR)  # ENOEXEC: exec format error, as a shell says
    except BaseException as e:
        os.write(2, f"sandgate: error: cannot start {name}: {e}\n".encode())
    os._exit(EXIT_ERROR)
