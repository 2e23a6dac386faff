"""Running commands for the world: host-side admin commands, and commands inside a named network
namespace, each in a process group of its own that is killed by PID (never by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

KILL_GRACE = 5.0
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy"}


def sh(cmd: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a host-side admin command (ip/nft); errors carry the command's stderr."""
    res = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)!r} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def clean_env() -> dict[str, str]:
    """The caller's environment minus proxy variables, so curl & co. talk to the fake hosts directly."""
    return {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS}


def kill_group(proc: subprocess.Popen[Any], grace: float = KILL_GRACE) -> None:
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


class NetnsRunner:
    """run()/popen() inside a namespace; shared by World and Client. Processes are tracked by the World."""

    ns: str

    def _track(self, proc: subprocess.Popen[Any]) -> None:
        raise NotImplementedError

    def popen(self, cmd: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `cmd` via `ip netns exec` in a new session; the World kills its group at exit."""
        kw.setdefault("env", clean_env())
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
            kill_group(proc, grace=1.0)
            out, err = self._drain(proc)
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        except BaseException:
            kill_group(proc, grace=1.0)
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
