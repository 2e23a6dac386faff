"""Where a user's daemon socket lives, and who holds it: the runtime directory, its checks, the socket's
name, the daemon's claim on it and its "ready".

Only the standard library's smallest modules: `sandgate run` finds (or spawns) its daemon before it
imports anything else (launcher/prestart.py), and a new daemon claims its socket before its own
imports (netguard.daemon.__main__): a cold daemon's start is what the first connection waits for
(issue 25), and a `sandgate daemon stop` right after a cold run must find the daemon it started.
netguard.daemon.control wraps the paths for everyone else, with Path objects.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys

TYPE_CHECKING = False  # not typing's (mypy reads any TYPE_CHECKING as true): a served run imports this module
if TYPE_CHECKING:  # and typing alone is ~3 ms (launcher/forkserver/client.py); so is socket, imported below
    import socket
    from collections.abc import Mapping


class ControlError(Exception):
    """The daemon refused a request, went away, or the runtime directory is unsafe: one sentence."""


def runtime_base(environ: Mapping[str, str], uid: int) -> str:
    """Where the runtime directory should be, before any check of it (pure but for one stat)."""
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return os.path.join(xdg, "sandgate")
    if uid == 0:
        return "/run/sandgate"
    return f"/tmp/sandgate-{uid}"


def private_dir(path: str, uid: int | None = None) -> str:
    """`path` as a directory only `uid` can use, created 0700 if missing.

    In a shared directory like /tmp another user can create our name first (squatting) and
    read or replace our socket: an existing entry must be a real directory, ours, 0700-ish.
    """
    uid = os.geteuid() if uid is None else uid
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ControlError(f"cannot create the sandgate runtime directory {path}: {e.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and os.statvfs(path).f_flag & os.ST_RDONLY and st.st_mode & 0o077:
        # What a sandbox shows in place of every runtime directory: an empty read-only tmpfs.
        raise ControlError(
            f"the sandgate runtime directory {path} is hidden here: this looks like the inside of a sandgate "
            "sandbox, and sandgate does not run nested; run it outside"
        )
    if stat.S_ISLNK(st.st_mode):
        raise ControlError(f"refusing the sandgate runtime directory {path}: it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"refusing the sandgate runtime directory {path}: it is not a directory")
    if st.st_uid != uid:
        raise ControlError(f"refusing the sandgate runtime directory {path}: it belongs to uid {st.st_uid}, not {uid}")
    if st.st_mode & 0o077:
        raise ControlError(
            f"refusing the sandgate runtime directory {path}: mode {stat.S_IMODE(st.st_mode):04o} "
            "lets other users in (expected 0700)"
        )
    return path


def runtime_dir() -> str:
    """$XDG_RUNTIME_DIR/sandgate, else /run/sandgate for root, else /tmp/sandgate-<uid>; checked, 0700."""
    uid = os.geteuid()
    return private_dir(runtime_base(os.environ, uid), uid)


def socket_path(runtime_dir: str) -> str:
    """The daemon socket for this network namespace and this code: a daemon connects upstream from
    its own netns, so a launcher must never be served by one that lives in another; and a daemon
    still running an older sandgate (an upgrade, a checkout that moved on) must not decide for a
    newer launcher. The old one is left to its idle exit."""
    return os.path.join(runtime_dir, f"daemon-{os.stat('/proc/self/ns/net').st_ino}-{code_id()}.sock")


_CODE_IDS: dict[str, str] = {}  # by interpreter: a run asks twice (prestart, then the launcher)


def code_id() -> str:
    """A short fingerprint of the daemon's code: the interpreter and every netguard and sgbase module (size,
    mtime), sub-packages included (the daemon itself lives in netguard/daemon/, and stands on sgbase).

    ~25 stat calls: cheap enough for every run, and any edit or reinstall changes it.
    """
    known = _CODE_IDS.get(sys.executable)
    if known is not None:
        return known
    try:  # CPython's own SHA-256: hashlib would load OpenSSL first (~4 ms on every run)
        from _sha2 import sha256  # private: no stub (see pyproject)
    except ImportError:
        from hashlib import sha256

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    h = sha256(sys.executable.encode())
    # os.walk and strings, not Path.rglob: the same files, ~0.5 ms instead of ~3-7 ms on every run
    found = (
        os.path.join(d, f)
        for package in ("netguard", "sgbase")  # an upgrade of either is another daemon
        for d, _, files in os.walk(os.path.join(root, package))
        for f in files
        if f.endswith(".py")
    )
    for f in sorted(found):
        st = os.stat(f)
        h.update(f"{os.path.relpath(f, root)}:{st.st_size}:{st.st_mtime_ns};".encode())
    _CODE_IDS[sys.executable] = out = str(h.hexdigest())[:10]
    return out


class DaemonSocket:
    """The control socket at PATH, created under a flock on daemon.lock beside it so two starting daemons
    never both bind, and removed at exit only if PATH is still ours (a successor may own it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        # One lock file for every daemon socket in the directory: the critical sections are short,
        # and a lock file per socket (per network namespace and code version) would pile up.
        self.lock_fd = os.open(
            os.path.join(os.path.dirname(path), "daemon.lock"),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
        )
        self.sock: socket.socket | None = None
        self._ino: tuple[int, int] | None = None

    def claim(self) -> bool:
        """Bind PATH; False if a live daemon already answers there."""
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            if answers(self.path):
                return False
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode):  # never delete something that is not a stale socket
                    raise OSError(f"{self.path} exists and is not a socket; not touching it")
                os.unlink(self.path)
            import socket

            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            old = os.umask(0o177)  # 0600 from the start: no window in which others may connect
            try:
                sock.bind(self.path)
            finally:
                os.umask(old)
            sock.listen(64)
            st = os.stat(self.path)
            self.sock, self._ino = sock, (st.st_dev, st.st_ino)
            return True
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def release(self) -> None:
        """Remove PATH (if still ours) and close; once (a second call does nothing)."""
        if self.lock_fd < 0:
            return
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self._ino:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
            if self.sock is not None:
                self.sock.close()
                self.sock = None
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            os.close(self.lock_fd)
            self.lock_fd = -1


def answers(path: str) -> bool:
    """True if something accepts connections on `path` (a live daemon)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    s.settimeout(2)
    try:
        s.connect(path)
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        s.close()


def report_ready(fd: int | None) -> None:
    """Tell the starter (launcher/prestart.py) the socket is served: b"ready\\n" on its pipe, then close it."""
    if fd is not None:
        try:
            os.write(fd, b"ready\n")
        except BrokenPipeError:
            pass  # the launcher that started us already finished (a short command): others will connect
        finally:
            os.close(fd)
