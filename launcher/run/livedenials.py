"""Denials on the terminal as they happen: the run's own audit records, followed while CMD runs.

Why: a long interactive shell or an agent showed nothing until `exit`; a user who sees
"denied pypi.org:443: allow it with --allow pypi" the moment pip hangs keeps the sandbox on.

Where the lines come from: the run's audit log, which the daemon appends to through the descriptor
this run handed it. The follower reads only what was appended after the run opened it, and keeps
only records whose `task` is this run's (12 random hex digits): many runs sharing one
`--audit-log` never see each other's denials. It is a raw `_thread` (no `threading` import: a
warm start pays nothing for it) started only once CMD has been started, polling the file a few
times a second; the exit summary stays the complete account (this is rate-limited: the first
BURST new destinations at once, then one line every INTERVAL seconds for the rest).
Each destination is shown once. Logged names are untrusted and escaped before they are shown.
With --notices the same follower also appends each distinct denial, at once and not rate-limited,
to the file the command reads (launcher/run/notices.py); with -q it then shows nothing itself.
"""

from __future__ import annotations

import _thread
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from launcher.run import seam
    from launcher.run.notices import Writer
    from netguard.audit import Record

BURST = 5  # new denials shown at once; then tokens come back one per INTERVAL
INTERVAL = 5.0  # seconds between rate-limited summary lines
POLL = 0.2  # seconds between looks at the log: a denial is on the terminal well within a second
NAMED = 4  # destinations a rate-limited line names before "and N more"


class Limiter:
    """Pure: which lines to print now, given new denials and the time (monotonic seconds).

    A plain class: a dataclass costs a few hundred microseconds at import, paid by every run's start."""

    def __init__(self, burst: int = BURST, interval: float = INTERVAL) -> None:
        self.burst, self.interval = burst, interval
        self.tokens = float(burst)
        self.last: float | None = None  # the last refill
        self.flushed = float("-inf")  # the last rate-limited line
        self.seen: set[tuple[str, ...]] = set()
        self.pending: list[tuple[str, str]] = []  # (short name, full line), held back

    def _refill(self, now: float) -> None:
        if self.last is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) / self.interval)
        self.last = now

    def admit(self, key: tuple[str, ...], short: str, line: str, now: float, urgent: bool = False) -> list[str]:
        """A denial: its line now, or held back for tick(); nothing for a destination already seen."""
        if key in self.seen:
            return []
        self.seen.add(key)
        self._refill(now)
        if urgent:  # an attempted credential leak is never held back
            return [line]
        if self.tokens >= 1 and not self.pending:
            self.tokens -= 1
            return [line]
        self.pending.append((short, line))
        return []

    def tick(self, now: float) -> list[str]:
        """At most one line per interval for what was held back."""
        self._refill(now)
        if not self.pending or now - self.flushed < self.interval:
            return []
        held, self.pending, self.flushed = self.pending, [], now
        if len(held) == 1:
            return [held[0][1]]
        names = ", ".join(s for s, _ in held[:NAMED]) + (f" and {len(held) - NAMED} more" if len(held) > NAMED else "")
        return [f"sandgate: denied {len(held)} more destinations: {names} (every one is in the exit summary)"]


def _where(host: str, port: int | None) -> str:
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe(
    record: Record, task: str, advice: Callable[[Record], str]
) -> tuple[tuple[str, ...], str, str, bool] | None:
    """(key, short name, line, urgent) for a denial of this task; None for anything else."""
    from launcher.audit.text import escape

    if record["task"] != task:
        return None  # another run's (a shared --audit-log): never shown here
    if record["event"] == "decision" and record["action"] == "deny":
        host, port = record["host"] or "?", record["port"]
        key: tuple[str, ...] = ("dns", host) if record["kind"] == "dns" else (host, str(port))
        said, why = advice(record), record["reason"]
        detail = f": {said}" if not why or said.startswith(why) else f" ({why}): {said}"
        where = _where(host, port)
        return key, escape(where), escape(f"sandgate: denied {where}{detail}"), False
    if record["event"] == "request" and record["action"] == "deny":
        from launcher.audit import refusals

        line = refusals.lines([record], task)[0]
        key = ("request", record["host"], str(record["port"]), record["method"], record["path"], str(record["leak"]))
        return key, escape(f"{record['method']} {record['path']} on {record['host']}"), line, record["leak"] is not None
    return None


def _advice() -> Callable[[Record], str]:
    """What would allow a denied destination: the exit summary's words (the bundled lists loaded once)."""
    from launcher.audit import denials
    from launcher.config import load

    bundled = load.bundled_rulesets()

    def advice(r: Record) -> str:
        if r["event"] != "decision":
            return ""
        d = denials.Denied(r["host"] or "?", r["port"], r["kind"], 1, r["reason"], r["proto"])
        return denials.advice(d, bundled)

    return advice


class Follower:
    """Follows one run's audit log from where it ends now; prints that run's denials on `fd` (None:
    nowhere, -q) and hands each to `notices` (--notices)."""

    def __init__(self, path: Path, task: str, fd: int | None = 2, notices: Writer | None = None) -> None:
        self.path, self.task, self.fd, self.notices = path, task, fd, notices
        try:
            st = os.stat(path)
        except OSError:
            st = None
        self.offset = st.st_size if st else 0  # records before this run's start are not its own
        # Only a regular file is followed: reading a FIFO (--audit-log to a pipe) would steal its records.
        self.regular = st is not None and stat.S_ISREG(st.st_mode)
        self.limiter = Limiter()
        self.needle = task.encode()  # a cheap first look: another run's line is (almost) never parsed
        # A relayed terminal may be in raw mode: no CR of its own.
        self.eol = "\r\n" if fd is not None and _isatty(fd) else "\n"
        self._advice: Callable[[Record], str] | None = None
        self._stop = _thread.allocate_lock()
        self._done = _thread.allocate_lock()
        self._started = False

    def start(self) -> None:
        """Start following (after CMD started: a warm start pays for nothing here)."""
        if not self.regular:
            return
        self._stop.acquire()
        self._done.acquire()
        try:
            _thread.start_new_thread(self._loop, ())
        except RuntimeError:  # no thread to be had: the exit summary still says everything
            return
        self._started = True

    def stop(self) -> None:
        """Stop and wait for the follower (briefly): the exit summary follows and must not interleave."""
        if not self._started:
            return
        self._started = False
        self._stop.release()
        if self._done.acquire(timeout=2.0):
            self._done.release()

    def _loop(self) -> None:
        import time

        try:
            with open(self.path, "rb") as f:
                buf = b""
                while not self._stop.acquire(timeout=POLL):
                    buf = self._poll(f, buf, time.monotonic())
        except Exception:  # the live lines are a courtesy: they never break a run
            pass
        finally:
            if self.notices is not None:
                self.notices.close()
            self._done.release()

    def _poll(self, f: BinaryIO, buf: bytes, now: float) -> bytes:
        """Read what was appended; print what the limiter lets through; return the unfinished line."""
        f.seek(self.offset)
        data = f.read()
        self.offset += len(data)
        *lines, rest = (buf + data).split(b"\n")
        out: list[str] = []
        for line in lines:
            out += self._line(line, now)
        out += self.limiter.tick(now)
        if out and self.fd is not None:
            os.write(self.fd, "".join(x + self.eol for x in out).encode())
        return rest

    def _line(self, line: bytes, now: float) -> list[str]:
        if self.needle not in line or b'"deny"' not in line:
            return []
        from netguard import audit

        try:
            record = audit.parse(json.loads(line))
        except (ValueError, audit.LogError):
            return []
        if self._advice is None:
            self._advice = _advice()
        found = describe(record, self.task, self._advice)
        if found is None:
            return []
        key, short, text, urgent = found
        if self.notices is not None:
            self.notices.add(key, record, self._advice, text)
        if self.fd is None:
            return []
        return self.limiter.admit(key, short, text, now, urgent)


def follower(path: Path, task: str, quiet: bool, run_dir: Path | None) -> Follower | None:
    """The run's follower: terminal lines unless -q, the notices file in `run_dir` with --notices
    (None: without); None when neither is wanted."""
    if run_dir is None:
        return None if quiet else Follower(path, task)
    from launcher.run.notices import FILE, Writer

    live = Follower(path, task, fd=None if quiet else 2, notices=Writer(run_dir / FILE))
    if not live.regular:  # a FIFO's records are its reader's: following it would steal them
        from launcher.errors import RunError

        raise RunError(f"--notices follows the audit log, and {path} is not a regular file; give --audit-log a file")
    return live


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


class Following:
    """A backend whose `start` also starts a Follower (None: -q) and whose teardown stops it first."""

    def __init__(self, inner: seam.Backend, follower: Follower | None) -> None:
        self.inner, self.follower = inner, follower
        self.name = inner.name

    def make(self, request: seam.SandboxRequest) -> seam.Sandbox:
        return self.inner.make(request)

    def start(self, sandbox: seam.Sandbox) -> None:
        self.inner.start(sandbox)
        if self.follower is not None:
            self.follower.start()

    def wait(self, sandbox: seam.Sandbox) -> int:
        return self.inner.wait(sandbox)

    def teardown(self, sandbox: seam.Sandbox) -> None:
        if self.follower is not None:
            self.follower.stop()
        self.inner.teardown(sandbox)
