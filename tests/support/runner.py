"""Helpers for end-to-end tests: the real sandgate CLI started inside a test World (`Sandgate` for
`sandgate run`, `Proxy` for `sandgate proxy`), and curl."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from netguard.audit import read_records

from .world import World, _NetnsRunner

REPO = Path(__file__).resolve().parent.parent.parent
SANDGATE = [sys.executable, "-m", "launcher.cli"]
#: The sandbox has a private /tmp: when this checkout (and its .venv, whose python and packages
#: the probes run on) lies under the host's /tmp, as a CI clone may, it must be made visible.
VIEW = ["--write", str(REPO)] if str(REPO).startswith("/tmp/") else []
RUN = [*SANDGATE, "run", *VIEW]


class Proxy:
    """`sandgate proxy` running inside the world; stopped (by PID) when the test is done."""

    def __init__(
        self,
        world: World,
        policy: Path,
        *,
        listen: str = "127.0.0.1:3128",
        transparent: str | None = None,
        dns: str | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.audit = world.tmp / f"audit-{policy.stem}-{time.monotonic_ns()}.jsonl"
        args = [
            *SANDGATE,
            "proxy",
            "--policy",
            str(policy),
            "--listen",
            listen,
            "--audit-log",
            str(self.audit),
            "--task",
            "test",
        ]
        if transparent:
            args += ["--transparent", transparent]
        if dns:
            args += ["--dns", dns]
        args += extra or []
        self.listen = listen
        self.home = world.tmp / f"home-{time.monotonic_ns()}"
        self.home.mkdir()  # must stay empty: the proxy writes nothing but its audit log
        ready_r, ready_w = os.pipe()  # readiness: one JSON line on --ready-fd, never a scraped sentence
        try:
            self.proc = world.popen(
                [*args, "--ready-fd", str(ready_w)],
                stderr=subprocess.PIPE,
                cwd=REPO,
                env={**env(), "HOME": str(self.home)},
                pass_fds=(ready_w,),
            )
        finally:
            os.close(ready_w)
        try:
            self.ready = self._wait_ready(ready_r, time.monotonic() + 30)
        finally:
            os.close(ready_r)

    def _wait_ready(self, fd: int, deadline: float) -> dict[str, Any]:
        """The proxy's ready line: {"ready": true, "listen": [...], "audit": ...}, then EOF."""
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            r, _, _ = select.select([fd], [], [], max(left, 0))
            chunk = os.read(fd, 4096) if r else b""
            if not chunk:  # EOF before the line (it exited) or the deadline passed
                if self.proc.poll() is None:
                    self.proc.kill()
                assert self.proc.stderr is not None
                raise RuntimeError(f"proxy did not start: {data!r} {self.proc.stderr.read()!r}")
            data += chunk
        ready: dict[str, Any] = json.loads(data)
        assert ready["ready"] is True and ready["audit"] == str(self.audit), ready
        return ready

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    def records(self, event: str | None = "decision") -> list[Any]:
        if not self.audit.exists():
            return []
        # The one reader: a malformed line fails the test here (a torn last line is still being written).
        return [r for r in read_records(self.audit) if event is None or r["event"] == event]

    def wait_record(self, pred: Any, event: str = "decision", timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for r in self.records(event):
                if pred(r):
                    return r
            if time.monotonic() > deadline:
                raise AssertionError(f"no matching {event} record; have {self.records(None)}")
            time.sleep(0.05)

    def peak_rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def stop(self) -> None:
        assert list(self.home.iterdir()) == [], "the proxy wrote into its home directory"
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def env() -> dict[str, str]:
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}


_plain_env = env  # Sandgate's `env` parameters shadow the function inside its methods


@dataclass(frozen=True)
class Sandgate:
    """`sandgate run` started in one place, its command line built in one place.

    `where` is a World, a Client or a UserRunner (tests/support/rootless.py), so the same runner
    starts sandgate as root and as the throwaway user. The fields are defaults; each call may
    override them (`dataclasses.replace` makes a variant). The command line is
    RUN [-q] [--policy P] [--audit-log A] ARGS... [-- CMD...] (`view=False`: without RUN's VIEW).
    """

    where: _NetnsRunner
    _: KW_ONLY
    policy: Path | None = None
    audit: Path | None = None
    quiet: bool = False
    env: Mapping[str, str] | None = None  # None: env(), the tests' plain environment
    cwd: Path | None = None
    timeout: float = 30
    view: bool = True  # False: `sandgate run` without VIEW's --write of a checkout under /tmp

    def argv(
        self,
        *args: str,
        cmd: Sequence[str] | None = None,
        policy: Path | None = None,
        audit: Path | None = None,
        quiet: bool | None = None,
    ) -> list[str]:
        """The command line; ARGS are sandgate options (or a whole `-- CMD` tail when `cmd` is None)."""
        policy, audit = policy or self.policy, audit or self.audit
        line = [
            *(RUN if self.view else [*SANDGATE, "run"]),
            *(["-q"] if (self.quiet if quiet is None else quiet) else []),
        ]
        line += ["--policy", str(policy)] if policy else []
        line += ["--audit-log", str(audit)] if audit else []
        line += args
        return line if cmd is None else [*line, "--", *cmd]

    def run(
        self,
        *args: str,
        cmd: Sequence[str] | None = None,
        policy: Path | None = None,
        audit: Path | None = None,
        quiet: bool | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        """Run it to its end (output captured as text by default); `kw` goes to `where.run`."""
        line = self.argv(*args, cmd=cmd, policy=policy, audit=audit, quiet=quiet)
        kw.update(cwd=cwd or self.cwd, env=self._env(env))
        result: subprocess.CompletedProcess[str] = self.where.run(line, timeout=timeout or self.timeout, **kw)
        return result

    def popen(
        self,
        *args: str,
        cmd: Sequence[str] | None = None,
        policy: Path | None = None,
        audit: Path | None = None,
        quiet: bool | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> subprocess.Popen[Any]:
        """Start it and return at once; `where` kills its process group when the world closes."""
        line = self.argv(*args, cmd=cmd, policy=policy, audit=audit, quiet=quiet)
        return self.where.popen(line, cwd=cwd or self.cwd, env=self._env(env), **kw)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return dict(env if env is not None else self.env if self.env is not None else _plain_env())


@dataclass
class Curl:
    code: int  # curl's exit status
    status: int  # HTTP status, 0 when none
    body: str
    stderr: str


def curl(where: _NetnsRunner, url: str, *args: str, timeout: float = 15) -> Curl:
    r = where.run(["curl", "-sS", "-m", "10", "-o", "-", "-w", "\n%{http_code}", *args, url], timeout=timeout)
    body, _, status = r.stdout.rpartition("\n")
    return Curl(r.returncode, int(status or 0), body.rstrip("\n"), r.stderr)


def write_policy(world: World, text: str, name: str = "policy") -> Path:
    p = world.tmp / f"{name}.yaml"
    p.write_text(text)
    return p
