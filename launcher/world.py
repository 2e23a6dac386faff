"""A disposable, fully isolated fake internet: for `sandgate verify` and the end-to-end tests.

A World is a network namespace (``<prefix><pid>x<n>``; prefix ``sandgate-w`` for the tests,
``sandgate-v`` for verify) with no default route and no link to the host: its only interfaces are
``lo``, a dummy ``sgw0`` holding the fake hosts' TEST-NET-2 addresses (198.51.100.0/24, as /32s
so that any other address is *unreachable*, not silently black-holed), and veth ends to sandbox
Clients it creates itself (198.18.0.0/15, namespaces ``<client_prefix><pid>x<n>[-suffix]``).
Canary servers (launcher/canary.py, run as ``python -m launcher.canary``) run inside it and log
everything they see: that log is the evidence. TLS certificates come from a throwaway CA
(launcher/certs.py) whose key never leaves this process.

Rootless mode (automatic when euid != 0, as for `sandgate verify` run without sudo): the world is
a user+network+mount namespace of its own, held by a small helper (_UserNs) that kept its
capabilities there; setup commands (ip, sysctl, bind mounts) run through it, everything else
enters with `nsenter --user --net --mount --preserve-credentials`: the same user, no capability,
exactly how a user starts sandgate. No /run/netns name, no /etc/netns files (the world's mount
namespace binds its resolv.conf over /etc/resolv.conf), no Clients; it vanishes with the helper.

Safety: nothing here ever touches the host namespace's interfaces, routes or nftables; every
interface is created directly inside our own namespaces; processes are killed by PID only
(process groups we created while the leader is unreaped, plus processes found *inside our own
namespaces*); everything is removed at exit even on failure, with atexit + SIGTERM as a safety
net and ``cleanup_stale()`` for runs that were SIGKILLed.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from . import certs

TEST_NET = ipaddress.IPv4Network("198.51.100.0/24")
LINK_NET = ipaddress.IPv4Network("198.18.0.0/15")
DNS_IP = "198.51.100.53"
DUMMY_IF = "sgw0"
CANARY_MODULE = "launcher.canary"
#: The directory holding the `launcher` package: put on the canaries' PYTHONPATH, since the
#: interpreter running them need not have sandgate installed (a checkout, a test run).
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
NETNS_ETC = Path("/etc/netns")
SERVER_KINDS = ("http", "https", "dns", "udp", "tcp")
UNIX_KINDS = ("unix", "abstract")
READY_TIMEOUT = 10.0
KILL_GRACE = 5.0
#: Name prefixes (world, client). Every name is <prefix><creating pid>x<n>, so cleanup_stale can
#: tell a dead run's leftovers from a live one's, whichever of the two created them.
TEST_PREFIXES = ("sandgate-w", "sandgate-c")
VERIFY_PREFIXES = ("sandgate-v", "sandgate-vc")
KNOWN_PREFIXES = TEST_PREFIXES + VERIFY_PREFIXES
# Only distinctive names: cleanup_stale deletes namespaces by these prefixes. No trailing digit,
# so the pid that follows is unambiguous.
C = TypeVar("C", bound="Closable")
_PREFIX_RE = re.compile(r"sandgate-[a-z]+(?:-[a-z]+)*")
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy"}


class Closable(Protocol):
    def close(self) -> None: ...


class Registry(Generic[C]):
    """Live things to close at exit or on SIGTERM (Worlds here; the tests' throwaway users too),
    and a counter for unique names. Each registry chains to the SIGTERM handler installed before it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entered by the SIGTERM handler on the main thread
        self.items: list[C] = []
        self.counter = itertools.count()
        self.hooked = False
        self.prev_sigterm: Any = None

    def next_id(self) -> int:
        with self.lock:
            return next(self.counter)

    def add(self, item: C) -> None:
        with self.lock:
            self.items.append(item)
            if not self.hooked:
                self.hooked = True
                atexit.register(self.close_all)
                self._hook_sigterm()

    def remove(self, item: C) -> None:
        with self.lock:
            if item in self.items:
                self.items.remove(item)

    def close_all(self) -> None:
        with self.lock:
            items = list(reversed(self.items))
        for item in items:
            with contextlib.suppress(Exception):
                item.close()

    def _hook_sigterm(self) -> None:
        """Clean up then die as SIGTERM would have; only if nobody else handles or ignores SIGTERM."""
        if threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:
            return
        self.prev_sigterm = prev
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.close_all()
        prev = self.prev_sigterm
        if callable(prev):
            prev(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


_REGISTRY: Registry[World] = Registry()


# ---------------------------------------------------------------- small helpers


def _sh(cmd: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a host-side admin command (ip/nft); errors carry the command's stderr."""
    res = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)!r} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def _clean_env() -> dict[str, str]:
    """The caller's environment minus proxy variables, so curl & co. talk to the fake hosts directly."""
    return {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_list() -> list[str]:
    out = _sh(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    res = _sh(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _sweep_netns(ns: str, grace: float = 2.0) -> None:
    """Kill, by PID, every process still inside one of OUR namespaces (daemons that left our process groups).

    Zombies are not listed (their netns reference is gone), so a reused PID cannot be hit unless it
    is re-used between listing and kill, within microseconds.
    """
    pids = _netns_pids(ns)
    if not pids:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = _netns_pids(ns)
        if not pids:
            return
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _delete_netns(ns: str) -> None:
    _sweep_netns(ns)
    if ns in _netns_list():
        _sh(["ip", "netns", "del", ns])


def _write_netns_etc(ns: str, nameserver: str) -> Path:
    """Files `ip netns exec` bind-mounts over /etc: our resolver, and hosts lookups that cannot escape.

    nsswitch.conf is pinned to `hosts: files dns` because nss-resolve/nscd would ask the HOST's
    resolver over a unix socket (not bound by the netns) and leak the query to the real network.
    """
    return _write_etc(NETNS_ETC / ns, nameserver)


def _write_etc(d: Path, nameserver: str) -> Path:
    """resolv.conf (and hosts, nsswitch.conf where the host has them) for a namespace, in `d`."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "resolv.conf").write_text(f"nameserver {nameserver}\noptions timeout:2 attempts:1\n")
    # ip netns exec can only bind over files that exist (else it warns on every command).
    if Path("/etc/hosts").exists():
        (d / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
    if Path("/etc/nsswitch.conf").exists():
        lines = Path("/etc/nsswitch.conf").read_text().splitlines()
        lines = [ln for ln in lines if not ln.strip().startswith("hosts:")] + ["hosts: files dns"]
        (d / "nsswitch.conf").write_text("\n".join(lines) + "\n")
    return d


def _kill_group(proc: subprocess.Popen[Any], grace: float = KILL_GRACE) -> None:
    """SIGTERM (then SIGKILL) the process group we created with start_new_session=True.

    Only while the leader is unreaped: then its PID (= PGID) cannot have been reused. Stragglers
    after that are caught by the per-namespace sweep.
    """
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def _check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"name prefix {prefix!r} must match {_PREFIX_RE.pattern} (e.g. 'sandgate-w')")
    return prefix


def _owner_pid(name: str, prefixes: Sequence[str], *, tmp: bool) -> int | None:
    """The creating pid in one of our names (netns / /etc/netns dir, or with tmp=True a mkdtemp dir)."""
    tail = r"-" if tmp else r"(?:-[a-z0-9]{1,16})?$"
    for prefix in prefixes:
        m = re.match(rf"{re.escape(prefix)}(\d+)x\d+{tail}", name)
        if m:
            return int(m.group(1))
    return None


def cleanup_stale(prefixes: Sequence[str] = KNOWN_PREFIXES) -> list[str]:
    """Remove namespaces, /etc/netns dirs and temp dirs left by a previous run whose pid is dead.

    A SIGKILLed run cannot clean up after itself; the creating pid is in every name, so anything
    whose creator is still alive (e.g. a parallel test run or verify) is left alone. `prefixes`
    defaults to the test and verify ones (world and client). Returns what was removed.
    """
    prefixes = [_check_prefix(p) for p in prefixes]
    removed: list[str] = []

    def stale(name: str, *, tmp: bool = False) -> bool:
        pid = _owner_pid(name, prefixes, tmp=tmp)
        return pid is not None and pid != os.getpid() and not _pid_alive(pid)

    # The order does not matter: deleting either end's namespace destroys the veth pair.
    for ns in sorted(_netns_list()):
        if stale(ns):
            _delete_netns(ns)
            removed.append(f"netns {ns}")
    if NETNS_ETC.is_dir():
        for d in sorted(NETNS_ETC.iterdir()):
            if d.is_dir() and not d.is_symlink() and stale(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    tmp = Path(tempfile.gettempdir())
    for d in sorted(tmp.iterdir()):
        if d.is_dir() and not d.is_symlink() and stale(d.name, tmp=True):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed


# ---------------------------------------------------------------- running commands in a namespace


class _NetnsRunner:
    """run()/popen() inside a namespace; shared by World and Client. Processes are tracked by the World."""

    ns: str

    def _track(self, proc: subprocess.Popen[Any]) -> None:
        raise NotImplementedError

    def popen(self, cmd: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `cmd` via `ip netns exec` in a new session; the World kills its group at exit."""
        kw.setdefault("env", _clean_env())
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw["start_new_session"] = True
        proc = subprocess.Popen(self._argv(cmd, kw), **kw)
        self._track(proc)
        return proc

    def _argv(self, cmd: Sequence[str], kw: dict[str, Any]) -> list[str]:
        """The command line that runs `cmd` inside (a rootless World enters otherwise)."""
        return ["ip", "netns", "exec", self.ns, *map(str, cmd)]

    def run(self, cmd: Sequence[str], *, timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[Any]:
        """Like subprocess.run (capture_output=True, text=True by default) but kills the whole group on timeout.

        subprocess.run only kills the direct child on timeout and then waits for the pipes, which
        hangs forever if a grandchild holds them.
        """
        capture = kw.pop("capture_output", True)
        check = kw.pop("check", False)
        data = kw.pop("input", None)
        if capture:
            kw.setdefault("stdout", subprocess.PIPE)
            kw.setdefault("stderr", subprocess.PIPE)
        if not any(k in kw for k in ("text", "universal_newlines", "encoding", "errors")):
            kw["text"] = True
        if data is not None:
            kw["stdin"] = subprocess.PIPE
        proc = self.popen(cmd, **kw)
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, grace=1.0)
            out, err = self._drain(proc)
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        except BaseException:
            _kill_group(proc, grace=1.0)
            raise
        res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            res.check_returncode()
        return res

    @staticmethod
    def _drain(proc: subprocess.Popen[Any]) -> tuple[Any, Any]:
        try:
            return proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # pipes held by something outside the group; give up on output
            for f in (proc.stdout, proc.stderr):
                if f:
                    f.close()
            return None, None


# ---------------------------------------------------------------- fake servers


class Server:
    """A running canary (launcher/canary.py); its JSON-lines log is the evidence of what reached this host.

    IP kinds have ip/port (path ""); unix/abstract kinds have path (the socket path, or the abstract
    name without its NUL), ip "" and port 0.
    """

    def __init__(
        self,
        kind: str,
        ip: str,
        port: int,
        name: str,
        log_path: Path,
        stderr_path: Path,
        proc: subprocess.Popen[bytes],
        path: str = "",
    ) -> None:
        self.kind = kind
        self.ip = ip
        self.port = port
        self.path = path
        self.name = name
        self.log_path = log_path
        self.stderr_path = stderr_path
        self.proc = proc
        self._socket_id: tuple[int, int] | None = None  # (dev, ino) of a unix socket file we created

    def __repr__(self) -> str:
        return f"<Server {self.kind} {self.name} {self.address} pid={self.pid}>"

    @property
    def address(self) -> str:
        """ "ip:port", a unix socket path, or "@name" for an abstract socket."""
        if self.kind == "abstract":
            return "@" + self.path
        if self.kind == "unix":
            return self.path
        return f"{self.ip}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_records(self, kind: str | None = None) -> list[dict[str, Any]]:
        """All records so far (optionally only one "kind"); a partial last line (mid-write) is skipped."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        records = []
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:
                    break  # being written right now
                raise
            if kind is None or rec.get("kind") == kind:
                records.append(rec)
        return records

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool] | None = None, timeout: float = 5.0, kind: str | None = None
    ) -> dict[str, Any]:
        """First record matching `pred` (and `kind`), polling until `timeout`; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            for rec in self.log_records(kind):
                if pred is None or pred(rec):
                    return rec
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self!r}: no matching record in {timeout}s; have {self.log_records()}")
            time.sleep(0.02)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Terminate the server (idempotent); a unix socket file it created is removed."""
        _kill_group(self.proc, grace=2.0)
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._socket_id is not None:  # the canary unlinks it on SIGTERM, but not when SIGKILLed
            with contextlib.suppress(OSError):
                st = os.lstat(self.path)
                if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._socket_id:
                    os.unlink(self.path)
            self._socket_id = None

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    break
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
        if buf.startswith(b"ready\n"):
            if self.kind == "unix":
                with contextlib.suppress(OSError):
                    st = os.lstat(self.path)
                    self._socket_id = (st.st_dev, st.st_ino)
            return
        self.stop()
        raise RuntimeError(
            f"canary {self.kind} {self.name} on {self.address} not ready within {timeout}s "
            f"(exit {self.proc.returncode}, stdout {buf!r}); stderr:\n{self.stderr()}"
        )


# ---------------------------------------------------------------- sandbox clients


class Client(_NetnsRunner):
    """A namespace standing in for a sandbox: its only link (and default route) leads into the World."""

    def __init__(self, world: World, index: int, ns: str) -> None:
        self.world = world
        self.index = index
        self.ns = ns
        self.world_ip = f"198.18.{index}.1"
        self.ip = f"198.18.{index}.2"
        self.world_if = f"sgc{index}w"
        self.client_if = f"sgc{index}c"
        self.table = f"sandgate_test_{index}"
        assert ipaddress.IPv4Address(self.world_ip) in LINK_NET

    def __repr__(self) -> str:
        return f"<Client {self.ns} {self.ip} -> {self.world_ip}>"

    def _track(self, proc: subprocess.Popen[Any]) -> None:
        self.world._track(proc)

    def redirect(self, tcp_port: int | None, dns_port: int | None) -> None:
        """Emulate sandgate's transparent interception, inside the WORLD netns.

        All TCP from this client (except :53) goes to `tcp_port`, DNS (udp+tcp :53) to `dns_port`, both on
        world_ip (nft `redirect` uses the incoming interface's primary address, so listeners must bind
        0.0.0.0 or world_ip, not 127.0.0.1). Anything else arriving from the client is dropped, so direct
        connections really fail. Replaces a previous redirect; None disables that part (it is then dropped).
        """
        wif, t = self.world_if, self.table
        nat: list[str] = []
        allow: list[str] = []
        if dns_port is not None:
            nat += [
                f'iifname "{wif}" udp dport 53 redirect to :{int(dns_port)}',
                f'iifname "{wif}" tcp dport 53 redirect to :{int(dns_port)}',
            ]
            allow += [
                f'iifname "{wif}" ip daddr {self.world_ip} udp dport {int(dns_port)} accept',
                f'iifname "{wif}" ip daddr {self.world_ip} tcp dport {int(dns_port)} accept',
            ]
        if tcp_port is not None:
            nat.append(f'iifname "{wif}" tcp dport != 53 redirect to :{int(tcp_port)}')
            allow.append(f'iifname "{wif}" ip daddr {self.world_ip} tcp dport {int(tcp_port)} accept')
        nl = "\n      "
        script = f"""
table ip {t}
delete table ip {t}
table inet {t}
delete table inet {t}
table ip {t} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
      {nl.join(nat)}
  }}
}}
table inet {t} {{
  chain input {{
    type filter hook input priority filter; policy accept;
      {nl.join(allow)}
      iifname "{wif}" drop
  }}
}}
"""
        _sh(["ip", "netns", "exec", self.world.ns, "nft", "-f", "-"], input=script)


# ---------------------------------------------------------------- the world


class World(_NetnsRunner):
    """Context manager building the fake internet; see the module docstring for the topology."""

    def __init__(
        self, prefix: str = TEST_PREFIXES[0], client_prefix: str | None = None, rootless: bool | None = None
    ) -> None:
        """Nothing is created before __enter__. Prefixes: see TEST_PREFIXES / VERIFY_PREFIXES.

        rootless: build the world in a user namespace of its own (see the module docstring);
        None (the default) means "when not root".

        client_prefix defaults to the partner of `prefix` there (sandgate-w -> sandgate-c,
        sandgate-v -> sandgate-vc), else to prefix + "c". cleanup_stale() only knows KNOWN_PREFIXES
        unless told otherwise.
        """
        if client_prefix is None:
            client_prefix = {TEST_PREFIXES[0]: TEST_PREFIXES[1]}.get(prefix, prefix + "c")
        self.prefix = _check_prefix(prefix)
        self.client_prefix = _check_prefix(client_prefix)
        if prefix == client_prefix:
            raise ValueError("the world and client prefixes must differ")
        self.id = _REGISTRY.next_id()
        self.ns = f"{prefix}{os.getpid()}x{self.id}"
        self.tmp = Path()
        self.ca = certs.CA()
        self.ca_pem = Path()
        self.dns: Server | None = None
        self.records: dict[str, str] = {}
        self.clients: list[Client] = []
        self.servers: list[Server] = []
        self._held: set[str] = set()
        self._stack = contextlib.ExitStack()
        self._closed = False
        self._file_id = 0
        self.dummy_type = ""
        self._records_path = Path()
        self.rootless = os.geteuid() != 0 if rootless is None else rootless
        self._userns: _UserNs | None = None

    def __repr__(self) -> str:
        return f"<World {self.ns}>"

    def __enter__(self) -> World:
        _REGISTRY.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Undo everything in reverse order; every step runs even if earlier ones fail (errors re-raised).

        Idempotent and re-entrant: a SIGTERM arriving mid-close makes the handler finish the remaining steps.
        """
        self._closed = True
        try:
            self._stack.close()
        finally:
            _REGISTRY.remove(self)

    def _build(self) -> None:
        st = self._stack
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.ns}-"))
        st.callback(shutil.rmtree, self.tmp, ignore_errors=True)
        if self.rootless:
            self._userns = _UserNs(self.tmp)
            st.callback(self._userns.close)
            etc = _write_etc(self.tmp / "etc", DNS_IP)
            for f in sorted(etc.iterdir()):  # what `ip netns exec` does with /etc/netns/NS, in our mount ns
                self._userns.bind(f, Path("/etc") / f.name)
            # Canaries serve DNS, HTTP(S) on ports < 1024 without any capability.
            self.admin(["sysctl", "-q", "-w", "net.ipv4.ip_unprivileged_port_start=0"])
        else:
            st.callback(shutil.rmtree, NETNS_ETC / self.ns, ignore_errors=True)
            _write_netns_etc(self.ns, DNS_IP)
            _sh(["ip", "netns", "add", self.ns])
            st.callback(_delete_netns, self.ns)
        self._configure_netns()
        self.ca_pem = self.ca.write_cert(self.tmp / "ca.pem")
        self._records_path = self.tmp / "dns-records.json"
        self._write_records()
        self.dns = self.serve("dns", DNS_IP, 53, name="dns")

    def _configure_netns(self) -> None:
        # IPv4-only fake internet: new interfaces get no IPv6 (lo keeps ::1).
        self.admin(["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
        self._ip("link", "set", "lo", "up")
        self.dummy_type = self._add_dummy()
        self._ip("link", "set", DUMMY_IF, "up")
        if self._ip("route", "show", "default").stdout.strip():
            raise RuntimeError(f"{self.ns} unexpectedly has a default route")

    def _ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ip ARGS` in the world's network namespace, with the rights to change it."""
        if self._userns is not None:
            return self._userns.call(["ip", *args], check=check)
        return _sh(["ip", "-n", self.ns, *args], check=check)

    def admin(self, cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a setup command (sysctl, ip, nft...) inside the world with the rights to change it."""
        if self._userns is not None:
            return self._userns.call(list(cmd), check=check)
        return _sh(["ip", "netns", "exec", self.ns, *cmd], check=check)

    def netns_file(self, where: Path) -> Path:
        """A file naming the world's network namespace that processes run in it can open (setns probes).

        As root that is /run/netns/NS and `where` is unused; rootless, `where` (created here, on a
        filesystem the sandbox sees) is bound onto the namespace in the world's mount namespace only.
        """
        if self._userns is None:
            return Path("/run/netns") / self.ns
        where.touch(0o644)
        self._userns.bind(Path(f"/proc/{self._userns.pid}/ns/net"), where)
        return where

    def _argv(self, cmd: Sequence[str], kw: dict[str, Any]) -> list[str]:
        if self._userns is None:
            return super()._argv(cmd, kw)
        cwd = os.path.abspath(kw.pop("cwd", None) or os.getcwd())  # setns(mnt) resets it: cd by name inside
        return [
            *self._userns.enter(),
            "/bin/sh",
            "-c",
            'cd -- "$1" || exit 125; shift; exec "$@"',
            "sandgate-world",
            cwd,
            *map(str, cmd),
        ]

    def _add_dummy(self) -> str:
        """sgw0 as a dummy; kernels built without CONFIG_DUMMY get an ifb/bridge, which hold local /32s the same way."""
        errors = []
        for link_type in ("dummy", "ifb", "bridge"):
            res = self._ip("link", "add", DUMMY_IF, "type", link_type, check=False)
            if res.returncode == 0:
                return link_type
            errors.append(f"{link_type}: {res.stderr.strip()}")
        raise RuntimeError(f"cannot create {DUMMY_IF} in {self.ns}: {'; '.join(errors)}")

    def _track(self, proc: subprocess.Popen[Any]) -> None:
        if self._closed:  # a closed stack would never run the callback
            _kill_group(proc, grace=0.5)
            raise RuntimeError(f"{self!r} is closed")
        self._stack.callback(_kill_group, proc)

    def _hold(self, ip: str) -> None:
        """Put a TEST-NET-2 address on sgw0 (never anything else: fake hosts live only in 198.51.100.0/24)."""
        if ipaddress.IPv4Address(ip) not in TEST_NET:
            raise ValueError(f"{ip} is not in {TEST_NET}; the world only holds TEST-NET-2 addresses")
        if ip in self._held:
            return
        self._ip("addr", "add", f"{ip}/32", "dev", DUMMY_IF)
        self._held.add(ip)

    def _write_records(self) -> None:
        """Atomic replace: the DNS server re-reads the file per query and must never see half of it."""
        part = self._records_path.with_suffix(".part")
        part.write_text(json.dumps(self.records, indent=1, sort_keys=True))
        os.replace(part, self._records_path)

    def add_host(self, name: str, ip: str, *, hold: bool | None = None) -> None:
        """Make `name` resolve to `ip` in the fake DNS; holds the address on sgw0 if it is TEST-NET-2.

        Addresses outside 198.51.100.0/24 (127.0.0.1, 169.254.169.254, ...) are DNS-only: useful for
        rebinding/metadata tests. hold=False maps a TEST-NET-2 name to an address nobody answers on.
        """
        addr = str(ipaddress.IPv4Address(ip))
        if hold is None:
            hold = ipaddress.IPv4Address(addr) in TEST_NET
        if hold:
            self._hold(addr)
        self.records[name.lower().rstrip(".")] = addr
        self._write_records()

    def cert_for(self, *names: str) -> tuple[Path, Path]:
        """(cert chain PEM, key PEM) issued by world.ca (trusted via world.ca_pem) for DNS names / IPs."""
        stem = self.tmp / f"cert-{self._next_file_id()}"
        return self.ca.issue(*names).write(stem.with_suffix(".chain.pem"), stem.with_suffix(".key.pem"))

    def _next_file_id(self) -> int:
        self._file_id += 1
        return self._file_id

    def serve(self, kind: str, ip: str, port: int, name: str = "") -> Server:
        """Start a canary server inside the world; waits for "ready" (10 s) or raises with its stderr.

        A TEST-NET-2 `ip` is added to sgw0 if needed; other addresses must already exist in the world
        (e.g. a Client's world_ip, or 127.0.0.1). `name` defaults to a DNS name mapped to `ip`, else
        the ip; https certs are issued by world.ca for [name, ip].
        """
        if kind not in SERVER_KINDS:
            raise ValueError(f"unknown server kind {kind!r}; expected one of {SERVER_KINDS}")
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        ip = str(ipaddress.IPv4Address(ip))
        if ipaddress.IPv4Address(ip) in TEST_NET:
            self._hold(ip)
        if not name:
            name = next((n for n, a in sorted(self.records.items()) if a == ip), ip)
        log = self.tmp / f"{kind}-{ip}-{port}-{self._next_file_id()}.jsonl"
        args = [kind, "--ip", ip, "--port", str(port), "--log", str(log), "--name", name]
        if kind == "https":
            names = [name] if name == ip else [name, ip]
            chain, key = self.cert_for(*names)
            args += ["--cert", str(chain), "--key", str(key)]
        if kind == "dns":
            args += ["--records", str(self._records_path)]
        return self._start(args, kind=kind, ip=ip, port=port, name=name, log=log)

    def serve_unix(self, kind: str, path: str, name: str = "") -> Server:
        """Start a unix-socket canary inside the world (like serve(); it answers b"unix-canary\\n").

        kind "unix": a filesystem socket at the absolute `path` (mode 0666; its directory must exist;
        removed again when the server stops). kind "abstract": the abstract socket NUL+`path`, which
        exists only in the world's network namespace, so only processes in it can connect. Both log
        {"kind": "unix", "address", "data", "pid", "uid", "gid"} per connection.
        """
        if kind not in UNIX_KINDS:
            raise ValueError(f"unknown unix server kind {kind!r}; expected one of {UNIX_KINDS}")
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if not path or "\0" in path:
            raise ValueError("path must be non-empty and contain no NUL")
        if kind == "unix" and not os.path.isabs(path):
            raise ValueError(f"unix socket path {path!r} must be absolute")
        if len(os.fsencode(path)) > (107 if kind == "unix" else 106):  # sun_path is 108 bytes
            raise ValueError(f"unix socket path {path!r} is too long")
        name = name or ("@" + path if kind == "abstract" else path)
        log = self.tmp / f"{kind}-{self._next_file_id()}.jsonl"
        args = [kind, "--path", path, "--log", str(log), "--name", name]
        return self._start(args, kind=kind, path=path, name=name, log=log)

    def _start(
        self, args: list[str], *, kind: str, name: str, log: Path, ip: str = "", port: int = 0, path: str = ""
    ) -> Server:
        """Run `python -m launcher.canary ARGS` in the world; the Server is stopped when the world closes."""
        cmd = [sys.executable, "-P", "-m", CANARY_MODULE, *args]  # -P: no cwd on sys.path, only PYTHONPATH
        if threading.current_thread() is threading.main_thread():
            # PR_SET_PDEATHSIG fires when the parent *thread* exits, so only tie servers to the main thread.
            cmd += ["--parent-pid", str(os.getpid())]
        env = _clean_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
        err = log.with_suffix(".stderr")
        log.touch()
        with open(err, "wb") as errf:
            proc = subprocess.Popen(
                self._argv(cmd, {}),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errf,
                env=env,
                start_new_session=True,
            )
        server = Server(kind, ip, port, name, log, err, proc, path=path)
        self._stack.callback(server.stop)
        self.servers.append(server)
        server._wait_ready(READY_TIMEOUT)
        return server

    def sandbox(self, name_suffix: str = "") -> Client:
        """A new client netns joined to the world by a veth pair, default route into the world.

        Named <client_prefix><pid>x<n>[-suffix]; its link/addresses use the per-world index k (1..255):
        world end sgc<k>w 198.18.k.1/30, client end sgc<k>c 198.18.k.2/30. Interfaces are created
        directly inside the two namespaces, never in the host's.
        """
        if self.rootless:
            raise RuntimeError("a rootless World has no clients (they need named namespaces and veths)")
        if name_suffix and not re.fullmatch(r"[a-z0-9]{1,16}", name_suffix):
            raise ValueError("name_suffix must be 1-16 chars of [a-z0-9]")
        index = len(self.clients) + 1
        if index > 255:
            raise RuntimeError("at most 255 clients per world")
        ns = f"{self.client_prefix}{os.getpid()}x{_REGISTRY.next_id()}" + (f"-{name_suffix}" if name_suffix else "")
        client = Client(self, index, ns)
        st = self._stack
        st.callback(shutil.rmtree, NETNS_ETC / ns, ignore_errors=True)
        _write_netns_etc(ns, client.world_ip)
        _sh(["ip", "netns", "add", ns])
        st.callback(_delete_netns, ns)
        self.clients.append(client)
        _sh(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
        _sh(
            [
                "ip",
                "link",
                "add",
                client.world_if,
                "netns",
                self.ns,
                "type",
                "veth",
                "peer",
                "name",
                client.client_if,
                "netns",
                ns,
            ]
        )
        _sh(["ip", "-n", self.ns, "addr", "add", f"{client.world_ip}/30", "dev", client.world_if])
        _sh(["ip", "-n", self.ns, "link", "set", client.world_if, "up"])
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        _sh(["ip", "-n", ns, "addr", "add", f"{client.ip}/30", "dev", client.client_if])
        _sh(["ip", "-n", ns, "link", "set", client.client_if, "up"])
        _sh(["ip", "-n", ns, "route", "add", "default", "via", client.world_ip])
        return client


# ---------------------------------------------------------------- rootless: the world's own user namespace

# Runs as `unshare --user --map-current-user --net --mount --keep-caps -- python -I -S -c SRC PPID`:
# the caller's uid mapped to itself (so a sandbox started inside may map it again), capabilities
# kept over the new namespaces only. One JSON request per line: {"argv", "input"} -> {"rc", "out",
# "err"}, or {"bind": [src, dst]} (a bind mount in the world's mount namespace) -> {"rc", "err"}.
_USERNS_HELPER = r"""
import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG SIGKILL: never outlive the World's process
if os.getppid() != int(sys.argv[1]):
    raise SystemExit("sandgate-world: parent already gone")
print(json.dumps({"pid": os.getpid()}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if "bind" in req:
        src, dst = req["bind"]
        ok = libc.mount(src.encode(), dst.encode(), None, 4096, None) == 0  # MS_BIND
        rep = {"rc": 0 if ok else 1, "out": "", "err": "" if ok else os.strerror(ctypes.get_errno())}
    else:
        try:
            r = subprocess.run(req["argv"], input=req.get("input"), capture_output=True, text=True, timeout=30)
            rep = {"rc": r.returncode, "out": r.stdout, "err": r.stderr}
        except (OSError, subprocess.TimeoutExpired) as e:
            rep = {"rc": 127, "out": "", "err": str(e)}
    print(json.dumps(rep), flush=True)
"""


class _UserNs:
    """The rootless world's namespaces: a helper holding them (and its capabilities there) for our requests."""

    def __init__(self, tmp: Path) -> None:
        self._lock = threading.Lock()
        tool = shutil.which("unshare") or "unshare"
        with open(tmp / "userns-helper.log", "wb") as log:
            self.proc = subprocess.Popen(
                [
                    tool,
                    "--user",
                    "--map-current-user",
                    "--net",
                    "--mount",
                    "--keep-caps",
                    "--",
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _USERNS_HELPER,
                    str(os.getpid()),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd="/",
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first.startswith("{"):
            self.proc.wait(5)
            raise RuntimeError(
                f"cannot create the rootless world's namespaces (unshare --user --net --mount, exit "
                f"{self.proc.returncode}): {(tmp / 'userns-helper.log').read_text().strip()[-300:]}"
            )
        self.pid = int(json.loads(first)["pid"])
        self.net = os.stat(f"/proc/{self.pid}/ns/net").st_ino

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the rootless world's helper is gone")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(
        self, argv: list[str], *, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run an admin command inside, with the helper's capabilities (errors carry its stderr, like _sh)."""
        rep = self._ask({"argv": argv, "input": input})
        if check and rep["rc"] != 0:
            raise RuntimeError(f"{' '.join(argv)!r} failed ({rep['rc']}): {rep['err'].strip()}")
        return subprocess.CompletedProcess(argv, rep["rc"], rep["out"], rep["err"])

    def bind(self, src: Path, dst: Path) -> None:
        rep = self._ask({"bind": [str(src), str(dst)]})
        if rep["rc"] != 0:
            raise RuntimeError(f"cannot bind {src} over {dst} in the rootless world: {rep['err']}")

    def enter(self) -> list[str]:
        """The prefix that runs a command inside as the caller itself, holding no capability."""
        tool = shutil.which("nsenter") or "nsenter"
        return [tool, "-t", str(self.pid), "--user", "--net", "--mount", "--preserve-credentials", "--"]

    def pids(self) -> list[int]:
        """Processes in the world's network namespace (only ours can be: it is entered only through us)."""
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) not in (os.getpid(), self.pid):
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}/ns/net").st_ino == self.net:
                        out.append(int(d))
        return out

    def close(self) -> None:
        """Kill, by PID, what still runs inside (daemons that left our process groups), then the helper."""
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = self.pids()
            if not pids:
                break
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own unreaped child
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
