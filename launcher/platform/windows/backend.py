"""The Windows backend behind the platform seam: make, start, wait, tear down, in this order.

  make:     1. setup present (sandbox user, sealed password, persistent WFP filters): else refuse,
               fail closed, "run 'sandgate setup' as administrator"
            2. replay ACL journals left by dead runs (crash recovery)
            3. the proxy: `sandgate proxy` as a child on the filters' loopback port, ready line awaited
            4. the ACL plan: each change journalled (write-ahead), then applied
            5. the job (job.check_job: kill on close, no breakaway)
  start:    6. CMD suspended, as the sandbox user, with the env block (filtered env + proxy vars)
            7. into the job; refused -> terminated, never resumed
            8. resumed
  wait:     9. CMD's exit code
  teardown: the reverse, each step once and whatever failed: close the job (kills the tree), restore
            the DACLs and remove placeholders (acljournal.restore_action), delete the journal, stop
            the proxy. A failure inside make tears down what make did before it is raised.

Why the proxy is a child: the per-user daemon's control socket is AF_UNIX, which CPython lacks on
Windows; the standalone proxy (netguard/proxy/standalone.py) listens on 127.0.0.1 itself. Every
effect goes through api.WinApi, so all of this runs on Linux against a fake.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.platform.seam import PlatformName, SandboxRequest
from launcher.platform.windows import acl, aclapply, plan, state, winpath
from launcher.platform.windows import setup as winsetup
from launcher.platform.windows.api import Proc, WinApi, WinApiError

PROXY_READY_TIMEOUT = 30.0  # the proxy imports mitmproxy: seconds, on a cold machine


@dataclass
class WinSandbox:
    """One run's made pieces; teardown undoes those that are set and clears them (idempotent)."""

    request: SandboxRequest
    ready: winsetup.Ready
    applied: aclapply.Applied
    plan: plan.WindowsPlan | None = None
    proxy: Proc | None = None
    job: int | None = None
    proc: Proc | None = None
    notes: list[str] = field(default_factory=list)  # teardown problems, said by the caller


class WindowsBackend:
    """`proxy_argv`: `sandgate proxy ...` without --listen (the port comes from setup); None: the
    run has no policy, so no proxy: the one port the filters permit has nobody listening."""

    name: PlatformName = "windows"

    def __init__(
        self, api: WinApi, proxy_argv: tuple[str, ...] | None, warn: Callable[[str], None] = lambda _: None
    ) -> None:
        self.api, self.proxy_argv, self.warn = api, proxy_argv, warn

    def make(self, request: SandboxRequest) -> WinSandbox:
        api = self.api
        ready = winsetup.check(api)  # 1: before anything is touched
        appdata = api.local_appdata()
        for line in aclapply.replay_left(api, appdata, self.warn):  # 2
            self.warn(f"restored {line} left by a killed run")
        journal = state.journal_path(appdata, api.own_pid(), request.task)
        box = WinSandbox(request, ready, aclapply.Applied(journal))
        try:
            box.plan = _plan(api, request, ready.record, appdata)
            self._proxy(box)  # 3
            aclapply.apply(api, box.plan.acls, ready.record.sid, box.applied)  # 4
            box.job = api.create_job(box.plan.limits)  # 5 (limits passed job.check_job in plan_job)
        except BaseException:
            self.teardown(box)  # nothing of a failed make is left behind
            raise
        return box

    def _proxy(self, box: WinSandbox) -> None:
        if self.proxy_argv is None:
            return
        argv = (*self.proxy_argv, "--listen", f"127.0.0.1:{box.ready.record.port}")
        box.proxy = self.api.start_proxy(argv)
        self.api.await_proxy(box.proxy, PROXY_READY_TIMEOUT)

    def start(self, sandbox: object) -> None:
        box = _box(sandbox)
        if box.plan is None or box.job is None:
            raise WinApiError("start before make finished")  # a seam misuse: never start unconfined
        env = {**box.request.env, **dict(box.plan.env)}
        user = box.ready.record.name
        box.proc = self.api.start_suspended(user, box.ready.password, box.request.cmd, box.request.cwd, env)  # 6
        try:
            self.api.assign(box.job, box.proc)  # 7
        except WinApiError:
            self.api.terminate(box.proc)  # outside the job: never let one instruction run
            raise
        self.api.resume(box.proc)  # 8

    def wait(self, sandbox: object) -> int:
        box = _box(sandbox)
        if box.proc is None:
            raise WinApiError("wait before start")
        return self.api.wait(box.proc)  # 9

    def teardown(self, sandbox: object) -> None:
        box = _box(sandbox)
        self._step(box, "close the job", self._close_job)
        self._step(box, "restore the ACLs", lambda b: aclapply.finish(self.api, b.applied, b.notes.append))
        self._step(box, "stop the proxy", self._stop_proxy)
        for note in box.notes:
            self.warn(f"teardown: {note}; 'sandgate cleanup' retries what is left")
        box.notes.clear()

    def _step(self, box: WinSandbox, what: str, undo: Callable[[WinSandbox], None]) -> None:
        try:
            undo(box)
        except WinApiError as e:
            box.notes.append(f"could not {what}: {e}")

    def _close_job(self, box: WinSandbox) -> None:
        if box.job is not None:
            job, box.job = box.job, None
            self.api.close_job(job)  # KILL_ON_JOB_CLOSE: the whole tree, detached children too
        if box.proc is not None:
            proc, box.proc = box.proc, None
            self.api.close_process(proc)

    def _stop_proxy(self, box: WinSandbox) -> None:
        if box.proxy is not None:
            proxy, box.proxy = box.proxy, None
            self.api.stop_proxy(proxy)


def _box(sandbox: object) -> WinSandbox:
    if not isinstance(sandbox, WinSandbox):
        raise TypeError("not a Windows sandbox")
    return sandbox


def _plan(api: WinApi, request: SandboxRequest, record: state.SetupRecord, appdata: str) -> plan.WindowsPlan:
    """The run's plan; sandgate's own state (journals, sealed password, audit logs) denied to the SID."""
    fs = request.policy.filesystem
    fs = dataclasses.replace(fs, read_deny=(*fs.read_deny, state.root(appdata)))
    policy = dataclasses.replace(request.policy, filesystem=fs)
    home = api.home()
    try:
        found = acl.candidates(fs, cwd=request.cwd, home=home)
        existing = frozenset(winpath.key(p) for p in found if api.exists(p))
        return plan.plan(policy, plan.Host(record.sid, request.cwd, home, existing, explicit_port=record.port))
    except (winpath.WinPathError, ValueError) as e:
        raise WinApiError(str(e)) from None
