"""A second sandgate daemon of the command's own uid, for the other_daemon_control probe (issue 22).

The issue's attack: a sandbox found another daemon of its user (a login session's runtime directory
beside a cron run's, the user's own beside `sudo sandgate run`) and bound a policy of its choosing
there. Verify makes that situation on purpose: `python -m netguard.daemon --socket <scratch>/d.sock`,
in the world's namespaces (where a launcher beside the sandbox lives), as the uid the pass's command
has on the host (root, nobody, or the user running a rootless verify), its socket in a directory the
sandbox can reach. Outside, the same client asks `status` before and after the pass: the permitted
twin, and the proof that `stop` was refused. The daemon's log must show the refusals (the right
reason) and no bind. It is stopped by its PID (its own process group) when the pass is over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftest.nsexec import kill_group
from selftest.servers import PACKAGE_ROOT
from selftest.world import World

IDLE_EXIT = 600  # seconds: longer than any pass; it is killed by PID before that
READY_WAIT = 20.0  # a cold daemon imports its proxy before it answers
PROBE = "other_daemon_control"
ATTEMPTS = 3  # status, bind, stop: each a control connection the daemon must refuse and log
REFUSED = "refused a control connection"
#: Drop to the command's host uid before exec (root verify's `nobody` pass): only that uid owns the daemon.
DROP = "import os,sys; os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1])); os.execv(sys.argv[3], sys.argv[3:])"
STATUS = "import sys; from netguard.daemon.control import ControlClient as C; print(C.connect(sys.argv[1], timeout=10).status()['pid'])"


@dataclass
class OtherDaemon:
    """The second daemon: our process (stopped by its PID), its socket and log, the uid it runs as."""

    w: World
    proc: subprocess.Popen[Any]
    sock: Path
    log: Path
    uid: int
    gid: int
    python: str
    started: str = ""  # why status from outside failed before the pass ("" when it answered)

    @classmethod
    def start(cls, w: World, base: Path, uid: int, gid: int, python: str) -> OtherDaemon:
        """The daemon in `base`/other-daemon (0700, the uid's own), and its control: status answered outside."""
        rt = base / "other-daemon"
        rt.mkdir(mode=0o700)
        os.chown(rt, uid, gid)
        log = rt / "daemon.log"
        sock = rt / "d.sock"
        argv = [python, "-m", "netguard.daemon", "--socket", str(sock), "--idle-exit", str(IDLE_EXIT)]
        with open(log, "ab") as f:
            os.fchown(f.fileno(), uid, gid)
            proc = w.popen(_as(uid, gid, argv), cwd="/", env=_env(), stdout=f, stderr=f)
        d = cls(w, proc, sock, log, uid, gid, python)
        deadline = time.monotonic() + READY_WAIT
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        d.started = d.status()
        return d

    def status(self) -> str:
        """ "" when the daemon answers `status` from outside (the world's namespaces, its uid), else why not."""
        if self.proc.poll() is not None:
            return f"it exited ({self.proc.returncode}): {self._log()[-300:]}"
        try:
            r = self.w.run(_as(self.uid, self.gid, [self.python, "-c", STATUS, str(self.sock)]), cwd="/", env=_env())
        except subprocess.TimeoutExpired:
            return "no answer to status within 30 s"
        return "" if r.returncode == 0 and r.stdout.strip().isdigit() else (r.stderr.strip() or r.stdout)[-300:]

    def evidence(self) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
        """(seen, missing) for the judge, after the pass: still serving, nothing bound, every attempt refused."""
        seen: dict[tuple[str, str], str] = {}
        missing: dict[tuple[str, str], str] = {}
        log = self._log()
        if self.started:
            missing[PROBE, "child"] = f"the other daemon never answered status from outside: {self.started}"
        elif why := self.status():
            seen[PROBE, "*"] = f"the other daemon no longer answers status from outside (stopped?): {why}"
        if "bind task=" in log:
            seen[PROBE, "*"] = "the other daemon's log shows a bind: " + log[log.index("bind task=") :][:200]
        if (n := log.count(REFUSED)) < ATTEMPTS:
            missing.setdefault(
                (PROBE, "child"), f"the other daemon logged {n} refused control connections, not {ATTEMPTS}"
            )
        return seen, missing

    def stop(self) -> None:
        kill_group(self.proc, grace=5.0)

    def _log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _as(uid: int, gid: int, argv: list[str]) -> list[str]:
    if uid == os.geteuid():
        return argv
    return [sys.executable, "-c", DROP, str(uid), str(gid), *argv]


def _env() -> dict[str, str]:
    path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return {"PATH": path, "PYTHONPATH": str(PACKAGE_ROOT), "LANG": "C.UTF-8"}
