"""v2 core: whoever starts sandgate, the command holds nothing over the host (issue 9).

Every attack the v1 review made work is tried for real, once from a command started by root
and once from one started by an unprivileged user the test creates, each judged by what the
host (or a canary) saw afterwards, next to a control that shows the same action works outside
the sandbox. sandgate runs inside a test World: the world is its "host".
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..support.rootless import UnprivilegedUser
from ..support.runner import REPO, SANDGATE, Sandgate, env, write_policy
from ..support.world import Server, World, _NetnsRunner, new_world

BLOCKED = "198.51.100.20"
ATTACKS = Path(__file__).resolve().parent.parent / "support" / "attacks.py"
SECRET = "sandgate-secret-value-7f3a"


@dataclass
class Side:
    """One way of starting sandgate: as root in the world, or as a throwaway user in it."""

    name: str
    world: World
    runner: _NetnsRunner  # the world itself (root) or a UserRunner (the throwaway user)
    work: Path  # the workspace (cwd), writable by whoever runs sandgate
    home: Path
    canary: Server
    policy: Path

    @property
    def sg(self) -> Sandgate:
        """`sandgate run -q` in the workspace, started by this side's runner under the module's policy."""
        return Sandgate(
            self.runner, policy=self.policy, quiet=True, env={**env(), "HOME": str(self.home)}, cwd=self.work
        )

    def sandgate(
        self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        e = {**env(), "HOME": str(self.home), **(extra_env or {})}
        return self.sg.run(*args, audit=self.work / "audit.jsonl", timeout=timeout, env=e)

    def attack(self, name: str, *args: str, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
        """The attack from the strongest command each side can start: root inside its user namespace.

        An ordinary user's plain command could not setns, mknod or sethostname even unsandboxed, so
        a refusal would prove nothing; as `--user 0` it holds every capability sandgate leaves inside,
        and only the sandbox's own boundary (user namespace, bounding set, seccomp) stops it.
        """
        r = self.sandgate("--user", "0", "--", sys.executable, str(ATTACKS), name, *args, extra_env=extra_env)
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def outside(world: World, name: str, *args: str) -> dict[str, Any]:
    """The control: the same attack as root in the world, no sandbox."""
    r = world.run([sys.executable, str(ATTACKS), name, *args], cwd=REPO, env=env())
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with new_world() as w:
        w.add_host("blocked.test", BLOCKED)
        w.tmp.chmod(0o755)  # the unprivileged side reads the probe and the policy here
        yield w


@pytest.fixture(scope="module")
def canary(world: World) -> Server:
    return world.serve("tcp", BLOCKED, 9000, "blocked.test")


@pytest.fixture(scope="module")
def user() -> Iterator[UnprivilegedUser]:
    with UnprivilegedUser() as u:
        yield u


@pytest.fixture(scope="module", params=["root", "user"])
def side(request: pytest.FixtureRequest, world: World, canary: Server) -> Side:
    policy = write_policy(world, "version: 1\nnetwork:\n  allow:\n    - allowed.test\n", "iso")
    policy.chmod(0o644)
    if request.param == "root":
        work = world.tmp / "root-work"
        work.mkdir(exist_ok=True)
        home = world.tmp / "root-home"
        home.mkdir(exist_ok=True)
        return Side("root", world, world, work, home, canary, policy)
    u: UnprivilegedUser = request.getfixturevalue("user")
    work = u.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, u.uid, u.gid)
    return Side("user", world, u.runner(world), work, u.home, canary, policy)


# ---- network namespaces of the host -----------------------------------------------------------


def test_setns_into_a_named_network_namespace_of_the_host_is_refused(side: Side) -> None:
    target = f"{BLOCKED}:9000"
    path = f"/run/netns/{side.world.ns}"  # the world: sandgate's host namespace, where the canary is
    before = len(side.canary.log_records())
    got = side.attack("setns", path, target)
    assert not got["ok"] and got["errno"] == "EPERM" and got["detail"] == "setns", got
    assert len(side.canary.log_records()) == before  # nothing reached it
    control = outside(side.world, "setns", path, target)  # root outside enters and reaches it
    assert control["ok"], control


def test_nothing_of_a_sandbox_is_created_in_the_host_namespaces(side: Side) -> None:
    def host_state() -> tuple[str, str, str]:
        w = side.world
        return (
            w.run(["ip", "-o", "link"]).stdout,
            w.run(["ip", "route", "show", "table", "all"]).stdout,
            w.run(["nft", "list", "tables"]).stdout,
        )

    assert side.sandgate("--", "true").returncode == 0  # the daemon is up: it is no sandbox's state
    before = host_state()
    flag = side.work / f"flag-{side.name}"
    proc = side.sg.popen(audit=side.work / "a2.jsonl", cmd=["sh", "-c", f"touch {flag}; sleep 2"])
    try:
        deadline = time.monotonic() + 20
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), "the sandbox never started"
        during = host_state()  # the sandbox is alive now: its CMD sleeps
    finally:
        proc.wait(30)
    assert during == before, "a sandbox changed the host's links, routes or nftables tables"
    assert host_state() == before


def test_the_daemons_control_socket_is_out_of_reach(side: Side) -> None:
    assert side.sandgate("--", "true").returncode == 0  # the daemon is up
    r = side.runner.run([*SANDGATE, "daemon", "status", "--json"], cwd=side.work, env={**env(), "HOME": str(side.home)})
    assert r.returncode == 0, r.stderr
    socks = [
        p
        for p in side.runner.run(
            ["sh", "-c", "ls -d /run/sandgate/daemon-*.sock /tmp/sandgate-*/daemon-*.sock 2>/dev/null"], cwd=side.work
        ).stdout.split()
    ]
    assert socks, "no daemon socket found from outside"
    for sock in socks:
        got = side.attack("control", sock)
        assert not got["ok"] and got["errno"] in ("ENOENT", "EACCES"), got


# ---- filesystem and devices ---------------------------------------------------------------------


def _handle_of(path: Path) -> tuple[int, str]:
    """name_to_handle_at, outside: what an attacker could have learned (or guessed) of a hidden file."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(struct.pack("Ii", 128, 0) + bytes(128))
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(-100, str(path).encode(), buf, ctypes.byref(mount_id), 0) != 0:
        raise OSError(ctypes.get_errno(), "name_to_handle_at")
    size, htype = struct.unpack("Ii", buf.raw[:8])
    return htype, buf.raw[8 : 8 + size].hex()


def test_open_by_handle_at_of_a_hidden_file_is_refused(side: Side) -> None:
    ssh = side.home / ".ssh"
    ssh.mkdir(exist_ok=True)
    key = ssh / "id_sandgate_test"
    key.write_text(SECRET)
    htype, handle = _handle_of(key)
    got = side.attack("handle", str(htype), handle)
    assert not got["ok"] and got["errno"] == "EPERM", got
    control = outside(side.world, "handle", str(htype), handle)
    assert control["ok"] and SECRET in str(control["detail"]), control


def test_a_block_device_of_the_host_cannot_be_made_or_opened(side: Side) -> None:
    st = os.stat("/")
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    node = side.work / f"disk-{side.name}"
    got = side.attack("mknod", str(node), str(major), str(minor))
    assert not got["ok"] and got["errno"] in ("EACCES", "EPERM"), got
    assert not node.exists()
    control_node = side.world.tmp / "control-disk"
    assert outside(side.world, "mknod", str(control_node), str(major), str(minor))["ok"]
    control_node.unlink()
    r = side.sandgate("--", "sh", "-c", "ls /dev; ls /dev/vda /dev/sda /dev/loop0 2>&1 | head -3")
    assert "vda\n" not in r.stdout and "loop0\n" not in r.stdout and "null" in r.stdout, r.stdout


# ---- state shared with the host -----------------------------------------------------------------


def test_the_dropped_environment_is_nowhere_inside_not_even_in_init(side: Side) -> None:
    got = side.attack("environ", SECRET, extra_env={"SANDGATE_TEST_TOKEN": SECRET, "SANDGATE_KEPT": "kept-ok"})
    assert not got["ok"], got
    r = side.sandgate(
        "--",
        "sh",
        "-c",
        "echo $SANDGATE_KEPT; echo ${SANDGATE_TEST_TOKEN:-dropped}",
        extra_env={"SANDGATE_TEST_TOKEN": SECRET, "SANDGATE_KEPT": "kept-ok"},
    )
    assert r.stdout.split() == ["kept-ok", "dropped"], r.stdout


def test_the_hosts_sysv_shared_memory_is_not_reachable(side: Side) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(0, 4096, 0o1000 | 0o666)  # IPC_PRIVATE, IPC_CREAT, readable by anyone
    assert shmid >= 0
    try:
        libc.shmat.restype = ctypes.c_void_p
        addr = libc.shmat(shmid, None, 0)
        ctypes.memmove(addr, SECRET.encode(), len(SECRET))
        libc.shmdt(ctypes.c_void_p(addr))
        got = side.attack("shm", str(shmid))
        assert not got["ok"] and got["errno"] in ("EINVAL", "EACCES"), got
        control = outside(side.world, "shm", str(shmid))
        assert control["ok"] and SECRET[:16] in str(control["detail"]), control
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def test_the_callers_keyring_is_not_readable(side: Side) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr_add_key = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
    key = libc.syscall(nr_add_key, b"user", b"sandgate-test", SECRET.encode(), len(SECRET), -2)  # user keyring
    assert key > 0
    nr_keyctl = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
    assert libc.syscall(nr_keyctl, 5, key, 0x3F3F0000) == 0  # KEYCTL_SETPERM: possessor + same uid may read
    try:
        got = side.attack("keyring", str(key))
        # EPERM: seccomp refuses keyctl outright (EACCES would only be the key's own permissions).
        assert not got["ok"] and got["errno"] == "EPERM", got
        if side.name == "root":
            control = outside(side.world, "keyring", str(key))
            assert control["ok"] and SECRET in str(control["detail"]), control
    finally:
        libc.syscall(nr_keyctl, 3, key)  # KEYCTL_REVOKE: leave root's keyring as we found it


def test_hostname_of_the_host_cannot_be_changed(side: Side) -> None:
    before = socket.gethostname()
    got = side.attack("hostname", "sandgate-evil")
    assert not got["ok"] and got["errno"] == "EPERM", got
    assert socket.gethostname() == before
    r = side.sandgate("--", "hostname")
    assert r.stdout.strip() == "sandgate"  # its own UTS namespace


def test_bpf_is_refused(side: Side) -> None:
    got = side.attack("bpf")
    assert not got["ok"] and got["errno"] == "EPERM", got
    assert outside(side.world, "bpf")["ok"]


# ---- the in-namespace table ---------------------------------------------------------------------


def test_the_command_cannot_touch_the_sandboxs_table_or_routes(side: Side) -> None:
    before = len(side.canary.log_records())
    got = side.attack("nft", f"{BLOCKED}:9000")
    assert not got["ok"], got
    assert "nft flush: rc=0" not in got["detail"] and "ip link: rc=0" not in got["detail"], got
    assert len(side.canary.log_records()) == before


def test_even_a_flushed_table_leaves_no_way_out(side: Side) -> None:
    """Self-test weakening: the command keeps CAP_NET_ADMIN, flushes the table, adds what it can."""
    before = len(side.canary.log_records())
    r = side.sandgate(
        "--user",
        "0",
        "--",
        sys.executable,
        str(ATTACKS),
        "nft",
        f"{BLOCKED}:9000",
        extra_env={"SANDGATE_INTERNAL_WEAKEN": "netadmin"},
    )
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "nft flush: rc=0" in got["detail"], got  # the weakening really gave it the power ...
    assert not got["ok"], got  # ... and still nothing reached the canary: there is no link out
    assert len(side.canary.log_records()) == before
