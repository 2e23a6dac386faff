"""A throwaway unprivileged user, and a runner that starts commands as it inside a test World.

sandgate v2 must work for an ordinary user without sudo; the e2e tests prove it by running the
real CLI as a user that exists only for one test. Two problems are solved here:

* The user must exist, be removed again (also when the test fails or pytest is killed), and
  nothing it started may survive it. Names are ``sandgate-u<creating pid>x<n>`` (the rules of
  launcher/run/staleworlds.py's cleanup_stale), so cleanup_stale_users() can tell a dead run's users from a
  live one's. Processes are killed by PID only, and only when provably ours: running as the
  user's uid AND either inside one of our World's namespaces or a descendant of a process we
  started and have not reaped (so its PID cannot have been reused).

* The test interpreter (pyenv, under /root, mode 0700) and possibly the checkout are not
  reachable by others. We never loosen the host's permissions: every command runs under
  ``ip netns exec``, which unshares a mount namespace and makes / recursively a slave
  (iproute2 lib/namespace.c netns_switch: unshare(CLONE_NEWNS) + mount --make-rslave /), so
  mounts made there never propagate to the host. Inside it, still as root, a helper bind-mounts
  each needed path to a private staging tmpfs, covers the topmost non-traversable ancestor
  (e.g. /root) with an empty read-only tmpfs (mode 0755), recreates the directories down to
  each needed path and moves the binds back (MS_MOVE), so the same absolute paths work while the
  rest of /root stays invisible; then it drops to the user (setpriv, or setres[ug]id) and execs
  the command. The user ends with no capabilities.
"""

from __future__ import annotations

import contextlib
import functools
import grp
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from launcher.run.staleworlds import netns_pids as _netns_pids
from launcher.run.staleworlds import owner_pid as _owner_pid
from launcher.run.staleworlds import pid_alive as _pid_alive
from selftest.registry import Registry

from .world import Client, World, _NetnsRunner

#: Name prefix of our users and of their temp dirs (``sandgate-u<pid>x<n>[-XXXX]``).
USER_PREFIX = "sandgate-u"
REPO = Path(__file__).resolve().parent.parent.parent
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: sandgate's per-user runtime directory when XDG_RUNTIME_DIR is unset.
RUNTIME_DIR_FMT = "/tmp/sandgate-{uid}"
#: Top-level temp dirs whose new entries owned by the user are removed at teardown.
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
KILL_GRACE = 3.0
#: Repository entries the user never needs (and whose modes we therefore do not check).
_REPO_SKIP = {".git", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_NAME_RE = re.compile(rf"{re.escape(USER_PREFIX)}(\d+)x(\d+)")


class SandgateRootlessError(RuntimeError):
    """The unprivileged-user harness cannot do what was asked (reported, never worked around)."""


def _tool(name: str) -> str:
    """Absolute path of an admin tool; root's PATH may lack /usr/sbin."""
    found = shutil.which(name, path=SYSTEM_PATH)
    if found is None:
        raise SandgateRootlessError(
            f"{name} not found in {SYSTEM_PATH}; the rootless tests need it (shadow/util-linux)"
        )
    return found


# ---------------------------------------------------------------- the helper run as root inside `ip netns exec`

# Runs as root in the private mount namespace `ip netns exec` made, with cwd "/". argv[1] is the
# JSON spec, argv[2:] the command. Every mount here stays in that namespace.
# Threats handled: (1) an fd or cwd left pointing into the covered directory would let the user
# walk around the tmpfs into e.g. the real /root: cwd is "/" until after the drop (cd by name,
# through the new mounts) and Python opens files O_CLOEXEC, and we exec. (2) capabilities
# surviving the drop: setres[ug]id to a non-zero uid clears them; setpriv also clears the
# inheritable set; the tests check CapEff.
_HELPER = r"""
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
cmd = sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 32, 4096, 8192, 16384
MNT_DETACH = 2

def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise SystemExit(f"sandgate-rootless: mount {src} -> {dst}: {os.strerror(e)}")

os.umask(0o022)
stage = spec["stage"]
binds = spec["binds"]  # [[path, is_dir], ...]
covers = spec["covers"]
if binds:
    mount("sandgate-stage", stage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=64k")
    for i, (path, is_dir) in enumerate(binds):
        point = os.path.join(stage, str(i))
        if is_dir:
            os.mkdir(point)
        else:
            open(point, "x").close()
        mount(path, point, None, MS_BIND | MS_REC)
for cover in covers:
    mount("sandgate-rootless", cover, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k,nr_inodes=4096")
for i, (path, is_dir) in enumerate(binds):
    os.makedirs(path if is_dir else os.path.dirname(path), 0o755, exist_ok=True)
    if not is_dir:
        open(path, "x").close()
    mount(os.path.join(stage, str(i)), path, None, MS_MOVE)
for cover in covers:  # the skeleton itself is never writable, even by a later setuid helper
    mount(None, cover, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
if binds and libc.umount2(stage.encode(), MNT_DETACH) != 0:
    raise SystemExit(f"sandgate-rootless: umount {stage}: {os.strerror(ctypes.get_errno())}")

uid, gid, name = spec["uid"], spec["gid"], spec["name"]
tail = ["/bin/sh", "-c", 'cd -- "$1" || exit 125; shift; exec "$@"', "sandgate-rootless", spec["cwd"], *cmd]
if spec["setpriv"]:
    os.execve(spec["setpriv"], [spec["setpriv"], f"--reuid={uid}", f"--regid={gid}", "--init-groups",
                                "--inh-caps=-all", "--", *tail], os.environ)
os.setgroups(os.getgrouplist(name, gid))
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
    raise SystemExit("sandgate-rootless: the privilege drop did not take")
os.execve(tail[0], tail, os.environ)
"""


# ---------------------------------------------------------------- which paths need the mount trick


def default_paths() -> list[Path]:
    """What a user needs to run this checkout's sandgate: the checkout, the venv, its base interpreter."""
    paths = [
        REPO,
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.base_exec_prefix),
        Path(os.path.realpath(sys.executable)).parent,
    ]
    return paths


def _others_can(st: os.stat_result, bits: int) -> bool:
    return st.st_mode & bits == bits


def _blocking_ancestor(path: Path) -> Path | None:
    """The topmost ancestor of `path` that others cannot traverse (a throwaway user is always "others")."""
    for anc in reversed(path.parents):  # "/" first
        if not _others_can(os.stat(anc), stat.S_IXOTH):
            return anc
    return None


@functools.cache
def _unreadable(root: str) -> tuple[str, ...]:
    """Entries under `root` others cannot read (dirs: r-x; files: r, and x where the owner has x). Cached per run."""
    bad: list[str] = []

    def check(p: str, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            ok = _others_can(st, stat.S_IROTH | stat.S_IXOTH)
        elif stat.S_ISREG(st.st_mode):
            ok = _others_can(st, stat.S_IROTH) and (not st.st_mode & stat.S_IXUSR or _others_can(st, stat.S_IXOTH))
        else:
            ok = True
        if not ok:
            bad.append(f"{stat.filemode(st.st_mode)} {p}")

    check(root, os.stat(root))
    if not os.path.isdir(root):
        return tuple(bad)
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == str(REPO):
            dirnames[:] = [d for d in dirnames if d not in _REPO_SKIP]
        for n in (*dirnames, *filenames):
            p = os.path.join(dirpath, n)
            with contextlib.suppress(FileNotFoundError):  # other processes create and delete files meanwhile
                check(p, os.lstat(p))
        if len(bad) > 20:
            break
    return tuple(bad)


def plan_paths(paths: Iterable[Path | str]) -> tuple[list[tuple[str, bool]], list[str]]:
    """(binds [(real path, is_dir)], covers): what must be bound back over which tmpfs covers.

    Paths reachable by others need nothing. Raises SandgateRootlessError if a needed path is not
    itself readable by others (we grant traversal to it, never read access to root's files), or if
    the only cover would be "/".
    """
    real = sorted({Path(os.path.realpath(p)) for p in paths})
    for p in real:
        if not p.exists():
            raise SandgateRootlessError(f"needed path {p} does not exist")
    # A path inside another needed path comes along with it.
    real = [p for p in real if not any(q != p and q in p.parents for q in real)]
    binds: list[tuple[str, bool]] = []
    covers: set[Path] = set()
    problems: list[str] = []
    for p in real:
        problems += _unreadable(str(p))
        anc = _blocking_ancestor(p)
        if anc is None:
            continue
        if anc == Path("/"):
            raise SandgateRootlessError(f"/ is not traversable by others; cannot make {p} reachable")
        covers.add(anc)
        binds.append((str(p), p.is_dir()))
    if problems:
        raise SandgateRootlessError(
            "the unprivileged test user must be able to read these (they are not readable/executable by others; "
            "fix with e.g. chmod -R o+rX on the checkout/venv):\n  " + "\n  ".join(problems[:20])
        )
    # Topmost blocking ancestors are disjoint or equal, so no cover hides another.
    return binds, sorted(map(str, covers))


# ---------------------------------------------------------------- processes


def _status_ids(pid: int) -> tuple[set[int], int] | None:
    """({real, effective, saved, fs uid}, ppid) of a live process, None if it is gone.

    A zombie is gone: it holds no files, mounts or namespaces and userdel does not count it, and here
    PID 1 reaps an orphan's zombie only after ~1.5 s (waiting for that cost ~2 s per user teardown)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    uids: set[int] = set()
    ppid = 0
    for line in text.splitlines():
        if line.startswith("State:") and line.split()[1:2] == ["Z"]:
            return None
        if line.startswith("Uid:"):
            uids = {int(x) for x in line.split()[1:]}
        elif line.startswith("PPid:"):
            ppid = int(line.split()[1])
    return uids, ppid


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def processes_of(uid: int) -> list[int]:
    """Every live process with `uid` as any of its uids (for reports only: never a kill list)."""
    out = []
    for pid in _all_pids():
        ids = _status_ids(pid)
        if ids and uid in ids[0] and pid != os.getpid():
            out.append(pid)
    return out


def _wait_gone(uid: int, timeout: float) -> list[int]:
    """Processes of `uid` still there after up to `timeout` s (exiting ones and zombies need a moment)."""
    deadline = time.monotonic() + timeout
    rest = processes_of(uid)
    while rest and time.monotonic() < deadline:
        time.sleep(0.05)
        rest = processes_of(uid)
    return rest


# ---------------------------------------------------------------- registry (atexit / SIGTERM)


# The same atexit/SIGTERM registry as the Worlds' (it chains to theirs, whichever hooked first).
_REGISTRY: Registry[UnprivilegedUser] = Registry()


def _login_defs(key: str, default: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/etc/login.defs").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == key:
                return int(parts[1])
    return default


def _free_uids(busy: set[int]) -> Iterator[int]:
    """Ordinary-user uids (UID_MIN..UID_MAX) unused as uid and gid, with no sandgate runtime dir, no process."""
    for uid in range(_login_defs("UID_MIN", 1000), _login_defs("UID_MAX", 60000) + 1):
        if uid in busy or os.path.lexists(RUNTIME_DIR_FMT.format(uid=uid)):
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            pass
        yield uid


def _run_admin(cmd: Sequence[str], *, ok: Sequence[int] = (0,)) -> subprocess.CompletedProcess[str]:
    """useradd/userdel, retried while another test run holds the /etc/passwd lock."""
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    deadline = time.monotonic() + 10
    while res.returncode not in ok and "lock" in res.stderr.lower() and time.monotonic() < deadline:
        time.sleep(0.05)
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if res.returncode not in ok:
        raise SandgateRootlessError(f"{' '.join(cmd)!r} failed ({res.returncode}): {res.stderr.strip()}")
    return res


# ---------------------------------------------------------------- the user


class UnprivilegedUser:
    """A user created for one test (no password, /bin/sh, home 0700 in a temp dir) and removed after it.

    Use as a context manager (or the `unprivileged` fixture). `pid` only changes the pid in the
    name (the stale-cleanup test fakes a dead creator with it).
    """

    def __init__(self, *, pid: int | None = None, base_dir: str | Path | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._base_parent = Path(base_dir or tempfile.gettempdir())
        self.name = ""
        self.uid = -1
        self.gid = -1
        self.base = Path()  # temp dir <name>-XXXX (root, 0711): holds home/ and the staging mount point
        self.home = Path()
        self.stage = Path()
        self._created = False  # useradd succeeded: userdel is ours to do
        self._ready = False  # the uid passed the reuse checks: its runtime dir and new scratch files are ours
        self._closed = False
        self._runners: list[UserRunner] = []
        self._scratch_before: dict[str, set[str]] = {}

    def __repr__(self) -> str:
        return f"<UnprivilegedUser {self.name} uid={self.uid}>"

    @property
    def runtime_dir(self) -> Path:
        """Where sandgate keeps its per-user state for this user when XDG_RUNTIME_DIR is unset."""
        return Path(RUNTIME_DIR_FMT.format(uid=self.uid))

    def env(self) -> dict[str, str]:
        """The clean login-like environment every command gets (callers add e.g. PYTHONPATH)."""
        return {"PATH": SYSTEM_PATH, "HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "LANG": "C.UTF-8"}

    def __enter__(self) -> UnprivilegedUser:
        _REGISTRY.add(self)
        try:
            self._create()
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        useradd = _tool("useradd")
        _tool("userdel")
        while True:
            name = f"{USER_PREFIX}{self.pid}x{next(_REGISTRY.counter)}"
            try:
                pwd.getpwnam(name)
            except KeyError:
                break  # else: left by a dead run that had our pid; cleanup_stale_users cannot know, skip it
        self.name = name
        self.base = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self._base_parent))
        self.base.chmod(0o711)  # the user may traverse to its home, not list what else is here
        self.home = self.base / "home"
        self.stage = self.base / "stage"
        self.stage.mkdir(mode=0o700)
        # Threat: a reused uid (a deleted user's orphans: processes, sandgate state) would be mistaken
        # for ours. So we pick the uid ourselves: free in passwd and group, no runtime dir, no process.
        busy = {u for pid in _all_pids() if (ids := _status_ids(pid)) for u in ids[0]}
        for uid in _free_uids(busy):
            res = _run_admin(
                [
                    useradd,
                    "--uid",
                    str(uid),
                    "--home-dir",
                    str(self.home),
                    "--no-create-home",
                    "--shell",
                    "/bin/sh",
                    "--user-group",
                    "--no-log-init",
                    "--comment",
                    f"sandgate test user (pid {self.pid})",
                    name,
                ],
                ok=(0, 4),
            )
            if res.returncode == 0:
                break  # 4: a parallel run took this uid between our check and useradd
        else:
            raise SandgateRootlessError("no free uid for a test user")
        self._created = True
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        if self.uid != uid or self.gid == 0:
            raise SandgateRootlessError(f"{name} got uid {self.uid} gid {self.gid}, expected uid {uid}")
        if os.path.lexists(self.runtime_dir):  # appeared since the check: not ours, never removed
            raise SandgateRootlessError(f"{self.runtime_dir} already exists (not created by {name}); refusing")
        self.home.mkdir(mode=0o700)
        os.chown(self.home, self.uid, self.gid)
        self._scratch_before = {d: self._owned_entries(d) for d in SCRATCH_DIRS}
        self._ready = True

    def runner(
        self, where: World | Client, *, paths: Sequence[Path | str] | None = None, drop: str = "auto"
    ) -> UserRunner:
        """Something with run()/popen() like World/Client's, running commands as this user there.

        `paths`: what the user must reach (default: default_paths()); drop: "auto" (setpriv if
        installed), "setpriv" or "python".
        """
        if not self._created or self._closed:
            raise SandgateRootlessError(f"{self!r} is not live")
        runner = UserRunner(self, where, default_paths() if paths is None else list(paths), drop)
        self._runners.append(runner)
        return runner

    # ---- teardown

    def _our_namespaces(self) -> list[str]:
        seen: list[str] = []
        for r in self._runners:
            for ns in (r.world.ns, *(c.ns for c in r.world.clients)):
                if ns not in seen:
                    seen.append(ns)
        return seen

    def _provably_ours(self) -> list[int]:
        """PIDs running as our uid that are in our namespaces or descend from a process we started, unreaped.

        Threat: killing a stranger's process. A uid alone proves nothing (uids are reused), a netns
        of ours or an unreaped child of ours does.
        """
        candidates: set[int] = set()
        for ns in self._our_namespaces():
            with contextlib.suppress(Exception):  # the World may already have deleted it
                candidates.update(_netns_pids(ns))
        roots = {p.pid for r in self._runners for p in r.procs if p.returncode is None}
        if roots:
            children: dict[int, list[int]] = {}
            for pid in _all_pids():
                ids = _status_ids(pid)
                if ids:
                    children.setdefault(ids[1], []).append(pid)
            todo = list(roots)
            while todo:
                pid = todo.pop()
                candidates.add(pid)
                todo += children.get(pid, [])
        out = []
        for pid in sorted(candidates):
            ids = _status_ids(pid)
            # Our own unreaped children are ours whatever their uid (e.g. a helper still mounting as root).
            if ids and (self.uid in ids[0] or pid in roots) and pid != os.getpid():
                out.append(pid)
        return out

    def _kill_ours(self) -> None:
        pids = self._provably_ours()
        for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 2.0)):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                for r in self._runners:
                    for p in r.procs:
                        p.poll()  # reap our direct children, else they stay zombies of our uid
                time.sleep(0.05)
                pids = self._provably_ours()
            if not pids:
                break
        for r in self._runners:
            for p in r.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(1)

    def _still_ours(self) -> bool:
        try:
            return pwd.getpwnam(self.name).pw_uid == self.uid
        except KeyError:
            return False

    def _owned_entries(self, d: str) -> set[str]:
        out: set[str] = set()
        with contextlib.suppress(OSError):
            for e in os.scandir(d):
                with contextlib.suppress(OSError):
                    if e.stat(follow_symlinks=False).st_uid == self.uid:
                        out.add(e.name)
        return out

    def _remove_owned(self, path: Path) -> None:
        """Remove a runtime/scratch entry only if our uid owns it; a symlink is unlinked, never followed."""
        try:
            st = path.lstat()
        except FileNotFoundError:
            return
        if st.st_uid != self.uid:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Kill our processes, remove the runtime dir and scratch files, userdel, remove the home.

        Every step runs; errors are raised at the end. Re-callable: if another process of the uid
        (not provably ours, so not killed) blocked userdel, fix that and call close() again.
        """
        if self._closed:
            return
        errors: list[str] = []
        # Every uid-based step needs the uid to still be ours: if the user was removed meanwhile
        # (cleanup_stale_users, an admin), the uid may already belong to someone else.
        ours = self._created and self._still_ours()
        if ours:
            self._kill_ours()
            rest = _wait_gone(self.uid, 2.0)
            if rest:
                errors.append(
                    f"processes {rest} of {self.name} (uid {self.uid}) outside our namespaces were left "
                    "running (not provably ours, so not killed); userdel will refuse"
                )
        if ours and self._ready:
            self._remove_owned(self.runtime_dir)
            for d, before in self._scratch_before.items():
                for n in sorted(self._owned_entries(d) - before):
                    if d == "/tmp" and n == self.runtime_dir.name:
                        continue
                    self._remove_owned(Path(d) / n)
        if ours:
            try:
                _run_admin([_tool("userdel"), self.name])
            except SandgateRootlessError as e:
                errors.append(str(e))
            if not errors and self._still_ours():
                errors.append(f"{self.name} still exists after userdel")
        if self.base != Path() and self.base.name.startswith(f"{self.name}-") and not errors:
            shutil.rmtree(self.base, ignore_errors=True)
        if errors:
            raise SandgateRootlessError("; ".join(errors))
        self._closed = True
        _REGISTRY.remove(self)


# ---------------------------------------------------------------- the runner


class UserRunner(_NetnsRunner):
    """run()/popen() inside a World/Client namespace as an UnprivilegedUser; the World tracks the processes."""

    def __init__(self, user: UnprivilegedUser, where: World | Client, paths: Sequence[Path | str], drop: str) -> None:
        if drop not in ("auto", "setpriv", "python"):
            raise ValueError(f"drop must be auto, setpriv or python, not {drop!r}")
        self.user = user
        self.where = where
        world = where.world if isinstance(where, Client) else where
        assert isinstance(world, World), world  # a Client hangs off a World (clients.WorldEnd)
        self.world: World = world
        self.ns = where.ns
        self.procs: list[subprocess.Popen[Any]] = []
        self.binds, self.covers = plan_paths(paths)
        for c in self.covers:  # the staging mount point must stay reachable after the covers are mounted
            if user.stage == Path(c) or Path(c) in user.stage.parents:
                raise SandgateRootlessError(f"staging dir {user.stage} lies under {c}; pass base_dir elsewhere")
        self.setpriv = ""
        if drop != "python":
            self.setpriv = shutil.which("setpriv", path=SYSTEM_PATH) or ""
            if drop == "setpriv" and not self.setpriv:
                raise SandgateRootlessError("setpriv (util-linux) is not installed")

    def __repr__(self) -> str:
        return f"<UserRunner {self.user.name} in {self.ns}>"

    def _track(self, proc: subprocess.Popen[Any]) -> None:
        self.world._track(proc)

    def popen(self, cmd: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `cmd` as the user (default cwd: its home; env: user.env() plus kw["env"])."""
        cwd = kw.pop("cwd", None)
        env = {**self.user.env(), **(kw.pop("env", None) or {})}
        spec = {
            "uid": self.user.uid,
            "gid": self.user.gid,
            "name": self.user.name,
            "cwd": os.path.abspath(self.user.home if cwd is None else cwd),
            "stage": str(self.user.stage),
            "binds": self.binds,
            "covers": self.covers,
            "setpriv": self.setpriv,
        }
        # -I: the caller's PYTHONPATH is for the command, not for this root helper. cwd "/": see _HELPER.
        wrapped = [sys.executable, "-I", "-S", "-c", _HELPER, json.dumps(spec), *map(str, cmd)]
        proc = self.where.popen(wrapped, cwd="/", env=env, **kw)  # tracked by the World (killed at its exit)
        self.procs.append(proc)
        return proc


# ---------------------------------------------------------------- stale users of killed runs


def cleanup_stale_users(base_dir: str | Path | None = None) -> list[str]:
    """Remove sandgate-u<pid>x<n> users and their temp dirs whose creating pid is dead (a SIGKILLed run).

    Processes of such a user are not killed (launcher.run.staleworlds.cleanup_stale already swept the dead
    run's namespaces); if any remain, the user is left in place with a warning. Returns what was removed.
    """
    removed: list[str] = []
    kept: list[str] = []
    me = os.getpid()

    def stale(name: str, *, tmp: bool) -> bool:
        pid = _owner_pid(name, (USER_PREFIX,), tmp=tmp)
        return pid is not None and pid != me and not _pid_alive(pid)

    for entry in pwd.getpwall():
        if not _NAME_RE.fullmatch(entry.pw_name) or not stale(entry.pw_name, tmp=False):
            continue
        rest = _wait_gone(entry.pw_uid, 2.0)  # a just-swept process may still be exiting
        if rest:
            warnings.warn(
                f"stale test user {entry.pw_name}: processes {rest} still run as it; left in place", stacklevel=2
            )
            kept.append(entry.pw_name)
            continue
        runtime = Path(RUNTIME_DIR_FMT.format(uid=entry.pw_uid))
        with contextlib.suppress(FileNotFoundError):
            st = runtime.lstat()
            if st.st_uid == entry.pw_uid:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(runtime, ignore_errors=True)
                else:
                    runtime.unlink()
                removed.append(str(runtime))
        try:
            _run_admin([_tool("userdel"), entry.pw_name], ok=(0, 6))  # 6: already gone (a parallel cleanup)
        except SandgateRootlessError as e:  # e.g. a process appeared meanwhile: a later run retries
            warnings.warn(f"stale test user {entry.pw_name} left in place: {e}", stacklevel=2)
            kept.append(entry.pw_name)
            continue
        removed.append(f"user {entry.pw_name}")
    tmp = Path(base_dir or tempfile.gettempdir())
    for d in sorted(tmp.iterdir()):
        if any(d.name.startswith(f"{k}-") for k in kept):
            continue  # its user is still there (and may be using its home)
        if d.name.startswith(USER_PREFIX) and d.is_dir() and not d.is_symlink() and stale(d.name, tmp=True):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed
