"""Verify's side of issue 22's probes while the probe runner runs, and what it saw of them afterwards.

The starvation probe needs a victim: another sandbox whose allowed request must be answered while the
probe hogs connections; the endless-head probe needs the shared daemon's memory measured while it
streams. Neither can be done from inside, so the probes ask (selftest/askfiles.py) and a
thread here answers: it runs the victim (a `sandgate run` of its own, marked with the probe's control
path) and samples the daemon's RSS (the daemon and its relay workers) between "rss-start" and
"rss-end". An ask is written by the sandbox, so it is untrusted input: only the two known kinds, names
of a fixed alphabet, a bounded number of victims, and nothing taken from it but a probe name.

Afterwards `evidence` says what the judge must know: the permitted twins reached their canary, the
victim was served, the daemon's memory stayed bounded, and the limits' refusals are in the sandbox's
own audit log (the right reason).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netguard.audit import LogError, read_records
from selftest import askfiles, markers
from selftest.servers import PACKAGE_ROOT
from selftest.world import World

POLL = 0.05
MAX_VICTIMS = 4  # per pass: a sandbox writing asks cannot make verify start sandboxes without end
VICTIM_TIMEOUT = 30.0
RSS_GROWTH_MAX = 64 << 20  # bytes the daemon may grow by while a head streams (issue 22: 2.3 GB before)
_WORD = re.compile(r"[a-z0-9_-]{1,40}")
#: The victim, inside its own sandbox: one allowed GET, transparently (no proxy variables), timed.
VICTIM = """\
import json, sys, time, urllib.request
t = time.monotonic()
try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(sys.argv[1], timeout=20) as r:
        out = {"status": r.status, "error": ""}
except Exception as e:
    out = {"status": getattr(e, "code", 0), "error": f"{type(e).__name__}: {e}"[:200]}
out["ms"] = (time.monotonic() - t) * 1000
print(json.dumps(out))
"""


@dataclass(frozen=True)
class VictimRun:
    """How the victim sandbox is started: `sandgate run ... --` as the pass runs it, then VICTIM."""

    sandgate: list[str]
    python: str  # an interpreter the pass's identity can execute
    cwd: Path  # its own workspace

    def argv(self, url: str) -> list[str]:
        return [*self.sandgate, self.python, "-c", VICTIM, url]


class Sidecar:
    """A thread answering the probes' asks for one pass; `with` starts and stops it."""

    def __init__(self, w: World, results: Path, victim: VictimRun, env: dict[str, str], host: str) -> None:
        self.w, self.results, self.env, self.host = w, results, env, host
        self.victim = victim
        self.victims: dict[str, dict[str, Any]] = {}  # mark -> the victim's outcome
        self.rss: dict[str, dict[str, int]] = {}  # mark -> {"kib", "peak_kib", "grew_kib"}
        self._victims_run = 0
        self._sampling: tuple[str, int] | None = None  # (mark, daemon pid) between rss-start and rss-end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="verify-sidecar", daemon=True)

    def __enter__(self) -> Sidecar:
        self._thread.start()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self._stop.set()  # a victim still running is waited for, unless verify is being interrupted
        self._thread.join(VICTIM_TIMEOUT + 5 if kind is None else 2)

    def _loop(self) -> None:
        while not self._stop.wait(POLL):
            self._sample()
            for what, mark, body in askfiles.pending(self.results):
                try:
                    reply = self._handle(what, mark, body)
                except Exception as e:  # an answer either way: the probe must not wait out its timeout
                    reply = {"error": f"{type(e).__name__}: {e}"[:300]}
                askfiles.answer(self.results, what, mark, reply)

    def _handle(self, what: str, mark: str, body: dict[str, Any]) -> dict[str, Any]:
        if not _WORD.fullmatch(mark):
            return {"error": "bad mark"}
        if what == "victim":
            return self._victim(mark, str(body.get("probe", "")))
        if what == "rss-start":
            pid = self._daemon_pid()
            kib = tree_rss_kib(pid)
            self.rss[mark] = {"kib": kib, "peak_kib": kib, "grew_kib": 0}
            self._sampling = (mark, pid)
            return dict(self.rss[mark])
        if what == "rss-end" and mark in self.rss:
            self._sample()
            self._sampling = None
            return dict(self.rss[mark])
        return {"error": f"unknown ask {what!r}"}

    def _victim(self, mark: str, probe: str) -> dict[str, Any]:
        if not _WORD.fullmatch(probe) or self._victims_run >= MAX_VICTIMS:
            return {"error": "refused ask"}
        self._victims_run += 1
        url = f"http://{self.host}{markers.control_path(mark, probe)}"
        try:
            r = self.w.run(self.victim.argv(url), env=self.env, cwd=self.victim.cwd, timeout=VICTIM_TIMEOUT)
            line = next((x for x in r.stdout.splitlines() if x.startswith("{")), "")
            out = json.loads(line) if line else {"status": 0, "error": f"exit {r.returncode}: {r.stderr[-200:]}"}
        except subprocess.TimeoutExpired:
            out = {"status": 0, "error": f"no answer within {VICTIM_TIMEOUT:g} s"}
        self.victims[mark] = out
        return dict(out)

    def _daemon_pid(self) -> int:
        """The pid of the daemon this pass's runs use, as `sandgate daemon status` names it (from the world)."""
        cmd = [sys.executable, "-m", "launcher.cli", "daemon", "status", "--json"]
        r = self.w.run(cmd, env=self.env, cwd=str(PACKAGE_ROOT))
        return int(json.loads(r.stdout)["pid"])

    def _sample(self) -> None:
        if self._sampling is None:
            return
        mark, pid = self._sampling
        try:
            kib = tree_rss_kib(pid)
        except OSError:
            return
        got = self.rss[mark]
        got["peak_kib"] = max(got["peak_kib"], kib)
        got["grew_kib"] = got["peak_kib"] - got["kib"]

    def evidence(
        self, w: World, tag: str, audit_log: Path
    ) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
        """(seen, missing) for the judge: what the outside shows of the child's issue-22 rows of pass `tag`."""
        mark, ctx = markers.mark("child", tag), "child"
        seen: dict[tuple[str, str], str] = {}
        missing: dict[tuple[str, str], str] = {}
        for probe in ("other_daemon_control", "starvation", "endless_head"):
            if not twin_seen(w, markers.control_path(mark, probe)):
                missing[probe, ctx] = (
                    f"its permitted twin ({markers.control_path(mark, probe)}) never reached the allowed canary"
                )
        victim = self.victims.get(mark)
        if victim is None or victim.get("status") != 200:
            missing.setdefault(("starvation", ctx), f"the victim sandbox's allowed request was not answered: {victim}")
        rss = self.rss.get(mark)
        if rss is None:
            missing.setdefault(("endless_head", ctx), "the daemon's memory was not measured while the head streamed")
        elif rss["grew_kib"] * 1024 >= RSS_GROWTH_MAX:
            seen["endless_head", ctx] = (
                f"the daemon's RSS grew by {rss['grew_kib'] // 1024} MiB while the head streamed"
            )
        limits = limit_kinds(audit_log)
        for probe, limit in (("starvation", "connections"), ("endless_head", "head")):
            if limit not in limits:
                missing.setdefault((probe, ctx), f"no `{limit}` limit record in the sandbox's audit log")
        return seen, missing


def twin_seen(w: World, path: str) -> bool:
    """A canary logged a request for `path` (the permitted twin's marker)."""
    quoted = json.dumps(path)
    return any(quoted in json.dumps(rec) for server in w.servers for rec in server.log_records())


def limit_kinds(audit_log: Path) -> set[str]:
    """The limits that refused something, by the sandbox's own audit log."""
    try:
        return {str(r.get("limit")) for r in read_records(audit_log) if r.get("event") == "limit"}
    except (OSError, LogError):  # a log that does not read shows no refusal
        return set()


def tree_rss_kib(pid: int) -> int:
    """VmRSS of `pid` and its descendants (the daemon's relay workers hold spliced flows), in KiB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(x.split()[1]) for x in f if x.startswith("VmRSS:")), 0)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            if p == pid:
                raise
    return total
