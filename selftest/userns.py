"""Rootless mode: the world's user+network+mount namespace, held by a small helper that kept its
capabilities there; setup commands run through it, everything else enters with nsenter as the
caller itself, holding no capability."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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


class UserNs:
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
        """Run an admin command inside, with the helper's capabilities (errors carry its stderr, like sh)."""
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
