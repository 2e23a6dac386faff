"""A disposable, fully isolated fake internet: for `sandgate verify` and the end-to-end tests.

A World is a network namespace (``<prefix><pid>x<n>``; prefix ``sandgate-w`` for the tests,
``sandgate-v`` for verify) with no default route and no link to the host: its only interfaces are
``lo``, a dummy ``sgw0`` holding the fake hosts' TEST-NET-2 addresses (198.51.100.0/24, as /32s
so that any other address is *unreachable*, not silently black-holed), and veth ends to sandbox
Clients it creates itself (198.18.0.0/15, namespaces ``<client_prefix><pid>x<n>[-suffix]``).
Canary servers (selftest/canary/, run as
``python -m selftest.canary``) run inside it and log
everything they see: that log is the evidence. TLS certificates come from a throwaway CA
(selftest/certs.py) whose key never leaves this process.

Rootless mode (automatic when euid != 0, as for `sandgate verify` run without sudo): the world is
a user+network+mount namespace of its own, held by a small helper (userns.py) that kept its
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

import contextlib
import dataclasses
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.run.staleworlds import NETNS_ETC, TEST_PREFIXES, check_prefix, delete_netns
from selftest import certs
from selftest.clients import Client
from selftest.netnsetc import write_etc, write_netns_etc
from selftest.nsexec import NetnsRunner, clean_env, kill_group, sh
from selftest.registry import Registry
from selftest.servers import (
    CANARY_MODULE,
    PACKAGE_ROOT,
    READY_TIMEOUT,
    SERVER_KINDS,
    TLS_KINDS,
    UNIX_KINDS,
    Server,
)
from selftest.userns import UserNs

TEST_NET = ipaddress.IPv4Network("198.51.100.0/24")
DNS_IP = "198.51.100.53"
DUMMY_IF = "sgw0"


@dataclasses.dataclass(frozen=True)
class Canary:
    """One canary for World.serve_many: serve()'s arguments, or serve_unix()'s (`path`) for unix kinds."""

    kind: str
    ip: str = ""
    port: int = 0
    name: str = ""
    path: str = ""
    git_root: Path | None = None


_REGISTRY: Registry[World] = Registry()


class World(NetnsRunner):
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
        self.prefix = check_prefix(prefix)
        self.client_prefix = check_prefix(client_prefix)
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
        self._userns: UserNs | None = None

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
            self._userns = UserNs(self.tmp)
            st.callback(self._userns.close)
            etc = write_etc(self.tmp / "etc", DNS_IP)
            for f in sorted(etc.iterdir()):  # what `ip netns exec` does with /etc/netns/NS, in our mount ns
                self._userns.bind(f, Path("/etc") / f.name)
            # Canaries serve DNS, HTTP(S) on ports < 1024 without any capability.
            self.admin(["sysctl", "-q", "-w", "net.ipv4.ip_unprivileged_port_start=0"])
        else:
            st.callback(shutil.rmtree, NETNS_ETC / self.ns, ignore_errors=True)
            write_netns_etc(self.ns, DNS_IP)
            sh(["ip", "netns", "add", self.ns])
            st.callback(delete_netns, self.ns)
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
        return sh(["ip", "-n", self.ns, *args], check=check)

    def admin(self, cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a setup command (sysctl, ip, nft...) inside the world with the rights to change it."""
        if self._userns is not None:
            return self._userns.call(list(cmd), check=check)
        return sh(["ip", "netns", "exec", self.ns, *cmd], check=check)

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
            kill_group(proc, grace=0.5)
            raise RuntimeError(f"{self!r} is closed")
        self._stack.callback(kill_group, proc)

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

    def serve(self, kind: str, ip: str, port: int, name: str = "", *, git_root: Path | None = None) -> Server:
        """Start a canary server inside the world; waits for "ready" (10 s) or raises with its stderr.

        A TEST-NET-2 `ip` is added to sgw0 if needed; other addresses must already exist in the world
        (e.g. a Client's world_ip, or 127.0.0.1). `name` defaults to a DNS name mapped to `ip`, else
        the ip; https (and upstream/git) certs are issued by world.ca for [name, ip]. kind "git"
        serves the repositories under `git_root` through `git http-backend`.
        """
        if kind not in SERVER_KINDS:
            raise ValueError(f"unknown server kind {kind!r}; expected one of {SERVER_KINDS}")
        return self.serve_many([Canary(kind, ip, port, name, git_root=git_root)])[0]

    def serve_unix(self, kind: str, path: str, name: str = "") -> Server:
        """Start a unix-socket canary inside the world (like serve(); it answers b"unix-canary\\n").

        kind "unix": a filesystem socket at the absolute `path` (mode 0666; its directory must exist;
        removed again when the server stops). kind "abstract": the abstract socket NUL+`path`, which
        exists only in the world's network namespace, so only processes in it can connect. Both log
        {"kind": "unix", "address", "data", "pid", "uid", "gid"} per connection.
        """
        if kind not in UNIX_KINDS:
            raise ValueError(f"unknown unix server kind {kind!r}; expected one of {UNIX_KINDS}")
        return self.serve_many([Canary(kind, path=path, name=name)])[0]

    def serve_many(self, canaries: Sequence[Canary]) -> list[Server]:
        """Start canaries all at once, then wait for each (READY_TIMEOUT from its wait): one by one cost verify seconds.

        All are checked and their addresses held before any starts. A failure raises serve()'s error (with
        stderr) after stopping every server of the batch not yet ready; those ready run until the world closes.
        """
        prepared = [self._prepare(c) for c in canaries]
        started: list[Server] = []
        ready = 0
        try:
            for canary, args, log in prepared:
                started.append(self._launch(canary, args, log))
            for server in started:
                server._wait_ready(READY_TIMEOUT)
                ready += 1
        except BaseException:
            for server in started[ready:]:  # idempotent: the one that failed has stopped itself
                server.stop()
            raise
        return started

    def _prepare(self, c: Canary) -> tuple[Canary, list[str], Path]:
        """Check one canary, hold its address and issue its certificate: (resolved canary, argv, log)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if c.kind in UNIX_KINDS:
            return self._prepare_unix(c)
        if c.kind not in SERVER_KINDS:
            raise ValueError(f"unknown server kind {c.kind!r}; expected one of {SERVER_KINDS + UNIX_KINDS}")
        if c.kind == "git" and c.git_root is None:
            raise ValueError("a git canary needs git_root")
        ip = str(ipaddress.IPv4Address(c.ip))
        if ipaddress.IPv4Address(ip) in TEST_NET:
            self._hold(ip)  # before the server binds it
        name = c.name or next((n for n, a in sorted(self.records.items()) if a == ip), ip)
        log = self.tmp / f"{c.kind}-{ip}-{c.port}-{self._next_file_id()}.jsonl"
        args = [c.kind, "--ip", ip, "--port", str(c.port), "--log", str(log), "--name", name]
        if c.kind in TLS_KINDS:
            chain, key = self.cert_for(*([name] if name == ip else [name, ip]))
            args += ["--cert", str(chain), "--key", str(key)]
        if c.kind == "dns":
            args += ["--records", str(self._records_path)]
        if c.kind == "git":
            args += ["--git-root", str(c.git_root)]
        return dataclasses.replace(c, ip=ip, name=name, path=""), args, log

    def _prepare_unix(self, c: Canary) -> tuple[Canary, list[str], Path]:
        path, kind = c.path, c.kind
        if not path or "\0" in path:
            raise ValueError("path must be non-empty and contain no NUL")
        if kind == "unix" and not os.path.isabs(path):
            raise ValueError(f"unix socket path {path!r} must be absolute")
        if len(os.fsencode(path)) > (107 if kind == "unix" else 106):  # sun_path is 108 bytes
            raise ValueError(f"unix socket path {path!r} is too long")
        name = c.name or ("@" + path if kind == "abstract" else path)
        log = self.tmp / f"{kind}-{self._next_file_id()}.jsonl"
        args = [kind, "--path", path, "--log", str(log), "--name", name]
        return Canary(kind, path=path, name=name), args, log

    def _launch(self, c: Canary, args: list[str], log: Path) -> Server:
        """Run `python -m selftest.canary ARGS` in the world, not waiting; stopped when the world closes."""
        cmd = [sys.executable, "-P", "-m", CANARY_MODULE, *args]  # -P: no cwd on sys.path, only PYTHONPATH
        if threading.current_thread() is threading.main_thread():
            # PR_SET_PDEATHSIG fires when the parent *thread* exits, so only tie servers to the main thread.
            cmd += ["--parent-pid", str(os.getpid())]
        env = clean_env()
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
        server = Server(c.kind, c.ip, c.port, c.name, log, err, proc, path=c.path)
        self._stack.callback(server.stop)
        self.servers.append(server)
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
        write_netns_etc(ns, client.world_ip)
        sh(["ip", "netns", "add", ns])
        st.callback(delete_netns, ns)
        self.clients.append(client)
        client.link()
        return client
