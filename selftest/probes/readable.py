"""What a sandboxed process can read, gathered for the probes that search it for a secret: its
environment, every /proc/PID/environ, cmdline and open file it may open, the CA bundles its variables name,
and the files under the places a secret would be left (home, workspace, /tmp, /run, ...).

Bounded (files, bytes, size per file), never following directory symlinks nor opening anything
but regular files (a FIFO would block the probe). Stdlib only: it runs inside the sandbox.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from launcher.run.trustpaths import BUNDLE_VARIABLES, SYSTEM_BUNDLES

#: Where a launcher or daemon that wrote a secret down would have left it, besides the home and the
#: workspace; /var/tmp last, as it may hold anything (other checkouts) and its share may run out.
ROOTS = ("/tmp", "/run", "/dev/shm", "/etc/ssl", "/etc/pki", "/var/tmp")
MAX_FILES = 3000  # per place searched: one crowded directory tree never starves the others
MAX_FILE = 2 << 20
MAX_TOTAL = 96 << 20


def read_regular(path: str, limit: int = MAX_FILE) -> bytes | None:
    """The first `limit` bytes of a regular file, or None (not one, unreadable, vanished)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def bundles() -> list[str]:
    """The CA bundle files this process would trust: the variables' and the system paths that exist."""
    named = [os.environ[v] for v in BUNDLE_VARIABLES if os.environ.get(v)]
    return list(dict.fromkeys(p for p in (*named, *SYSTEM_BUNDLES) if os.path.isfile(p)))


def pids() -> list[str]:
    """Every process this one can see: inside the sandbox, its own pid namespace's."""
    return sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)


def processes() -> Iterator[tuple[str, bytes]]:
    """Every /proc/PID/environ and cmdline this process may read (the pid namespace's processes), and
    every regular file or memfd they hold open: a descriptor the launcher forgot to close is readable."""
    for pid in pids():
        for name in ("environ", "cmdline"):
            try:
                data = Path(f"/proc/{pid}/{name}").read_bytes()[:MAX_FILE]
            except OSError:
                continue
            yield f"/proc/{pid}/{name}", data
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            held = read_regular(f"/proc/{pid}/fd/{fd}")  # pipes and sockets are skipped: they would block
            if held is not None:
                yield f"/proc/{pid}/fd/{fd}", held


class Search:
    """One search of everything readable: iterate for (where, bytes); then `searched` and `cut` (the
    places whose share of MAX_FILES ran out) say how thorough it was."""

    def __init__(self, home: str, extra: tuple[str, ...] = ()) -> None:
        self.roots = list(dict.fromkeys([home, os.getcwd(), *extra, *ROOTS]))
        self.searched = 0
        self.cut: list[str] = []

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        self.searched += 1
        yield "this process's environment", "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode()
        total, named = 0, bundles()
        for where, proc in processes():
            self.searched += 1
            total += len(proc)
            yield where, proc
        for path in (*named, *(f for root in self.roots for f in self._files(root))):
            if os.path.islink(path) and path not in named:
                continue  # the target is searched where it lives (or is a system file)
            data = read_regular(path)
            if data is None:
                continue
            self.searched += 1
            total += len(data)
            if total > MAX_TOTAL:
                self.cut.append(f"{MAX_TOTAL >> 20} MiB read")
                return
            yield path, data

    def _files(self, root: str) -> Iterator[str]:
        count = 0
        for top, dirs, names in os.walk(root, onerror=lambda _e: None):
            if top.startswith(("/proc", "/sys")):
                dirs[:] = []
                continue
            dirs.sort()
            for name in sorted(names):
                count += 1
                if count > MAX_FILES:
                    self.cut.append(root)
                    return
                yield os.path.join(top, name)

    def summary(self) -> str:
        cut = f" (cut short in {', '.join(self.cut)})" if self.cut else ""
        return f"{self.searched} sources searched{cut}"
