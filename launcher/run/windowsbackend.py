"""The Windows backend behind the platform seam: make, start, wait, tear down, in this order.

  make:     1. setup present (sandbox user, sealed password, persistent WFP filters): else refuse,
               fail closed, "run 'sandgate setup' as administrator"
            2. replay ACL journals left by dead runs (crash recovery), unless another run is live
            2b. sweep what a dead run's command left outside its job (sweep.py), unless another run
               is live; leftovers that survive refuse the run (they would share its grants)
            3. the proxy: `sandgate proxy` as a child on the filters' loopback port, ready line awaited;
               without a policy, that port bound by sandgate itself (nobody else's proxy: refused if taken);
               inspecting: its CA written to the run's trust folder, made before the plan grants it
               read (trust.py), and 3b. the bundle CMD's TLS clients are pointed at
            4. the ACL plan: each change journalled (write-ahead), then applied
            5. the job (job.check_job: kill on close, no breakaway, no UI limits: they cannot nest)
            5a. the sandbox SID denied this session's window station and desktop and sandgate's and
               the proxy's processes (logonreach.py: CMD's token likely holds the real user's logon SID)
            5b. the run's private window station and desktop (desktop.py: not the user's desktop)
            5c. `--transparent` only: the redirect loop started (transparent.py; its resolver
               listens before step 3, its check runs with step 1)
  start:    5d. the run's sweep marked pending (write-ahead: a killed sandgate leaves the mark)
            6. CMD suspended, as the sandbox user, on that desktop, its executable resolved here
               (exesearch.py), its std handles sandgate's pipes, with the env block (filtered env
               without the real user's profile, plus the sandbox user's profile and proxy vars,
               git's safe.directory for the workspace (gitenv.py), the CA bundle's variables)
            7. into the job; refused -> terminated, never resumed
            8. resumed
  wait:     9. CMD's exit code
  teardown: the reverse, each step once and whatever failed: stop the redirect loop (permits
            first: fail closed), close the job (kills the tree), close the desktop, **sweep** as the
            sandbox user (sweep.py: its tasks deleted, its processes outside the job ended; one
            `sandgate: teardown: ...` line for anything that survived, the mark kept for the next
            run and `sandgate cleanup`), restore the DACLs and remove placeholders
            (acljournal.restore_action), delete the journal, stop the proxy (or free the held
            port), remove the trust folder, close the loop's resolver. A failure inside make tears down what make did before it is raised.

Why the proxy is a child: the per-user daemon's control socket is AF_UNIX, which CPython lacks on
Windows; the standalone proxy (netguard/daemon/standalone.py) listens on 127.0.0.1 itself. Every
effect goes through api.WinApi, so all of this runs on Linux against a fake.
"""

from __future__ import annotations

import dataclasses
import ntpath
from collections.abc import Callable
from dataclasses import dataclass, field

from fsguard.windows import acl, aclapply, desktop, envblock, exesearch, gitenv, launch, profileenv, sweep, winpath
from fsguard.windows.launch import Launch
from fsguard.windows.reparse import check as links_out
from launcher.run import inspection
from launcher.run.seam import PlatformName, SandboxRequest
from launcher.run.windows import plan, trust
from launcher.run.windows import setup as winsetup
from launcher.run.windows import transparent as tp
from launcher.run.windows.winapi import WinApi
from sgbase.windows import state
from sgbase.windows.api import Proc, WinApiError

#: CreateDirectoryW's limit (MAX_PATH less room for an 8.3 name): a plain name this long may be "not found"
LONG_PATH = 248
PROXY_READY_TIMEOUT = 30.0  # the proxy imports mitmproxy: seconds, on a cold machine
#: Why CMD may not join the run's job: it starts in sandgate's own job (its parent, for the Secondary
#: Logon service), and jobs nest only "if ... neither job sets UI limits" (Nested Jobs).
JOB_REFUSED = (
    "the command could not join the run's job and was ended; if sandgate itself runs inside a job with "
    "UI limits (some CI agents and sandboxed terminals), run it from an ordinary terminal"
)

#: A run without a policy found the proxy port taken (U4): the one port the filters let CMD reach
#: would lead to another run's proxy (its allowlist) or another program.
PORT_TAKEN = (
    "another sandgate run (or another program) holds the port the sandbox may reach; "
    "Windows runs one sandbox at a time per user: wait for that run to end, or stop that program"
)


@dataclass
class WinSandbox:
    """One run's made pieces; teardown undoes those that are set and clears them (idempotent)."""

    request: SandboxRequest
    ready: winsetup.Ready
    applied: aclapply.Applied
    plan: plan.WindowsPlan | None = None
    desk: desktop.DesktopPlan | None = None
    proxy: Proc | None = None
    job: int | None = None
    desktop: int | None = None
    lp_desktop: str = ""  # "station\\desktop" as Windows named them (create_desktop)
    proc: Proc | None = None
    capture: tp.Capture | None = None  # `--transparent` only: the redirect loop and its resolver
    mark: str | None = None  # the pending-sweep mark, set before CMD exists (sweep.marker)
    trust: str | None = None  # inspecting runs: the folder of the run's CA and bundle (trust.py, U2)
    bundle: str | None = None  # the bundle CMD's TLS clients are pointed at
    held: int | None = None  # a run without a policy: the proxy port, bound by us (U4)
    notes: list[str] = field(default_factory=list)  # teardown problems, said by the caller


class WindowsBackend:
    """`proxy_argv`: `sandgate proxy ...` without --listen (the port comes from setup); None: the
    run has no policy, so no proxy: the one port the filters permit has nobody listening.
    `transparent`: also capture CMD's direct connections into the proxy (transparent.py)."""

    name: PlatformName = "windows"

    def __init__(
        self,
        api: WinApi,
        proxy_argv: tuple[str, ...] | None,
        warn: Callable[[str], None] = lambda _: None,
        *,
        transparent: bool = False,
    ) -> None:
        self.api, self.proxy_argv, self.warn, self.transparent = api, proxy_argv, warn, transparent

    def make(self, request: SandboxRequest) -> WinSandbox:
        api = self.api
        ready = winsetup.check(api)  # 1: before anything is touched
        if self.transparent:
            tp.check(api, self.proxy_argv is not None)
        appdata = api.local_appdata()
        if not sweep.pending(api, state.journal_dir(appdata))[1]:  # 2: never while another run lives (r3-day D9):
            for line in aclapply.replay_left(api, appdata, self.warn):  # its ACEs are the same SID's, and a
                self.warn(f"restored {line} left by a killed run")  # dead journal's undo would take them out
        left = sweep_left(api, ready, appdata)  # 2b: before anything of this run exists
        if left is not None and not left.clean:
            raise WinApiError(
                f"{sweep.describe(left)}; left by an earlier run, they would share this run's grants: "
                "end them (Task Manager, schtasks /delete as administrator), then run again"
            )
        journal = state.journal_path(appdata, api.own_pid(), request.task)
        box = WinSandbox(request, ready, aclapply.Applied(journal))
        try:
            if self.proxy_argv is not None and inspection.needed(request.policy.network):
                box.trust = trust.make_folder(api, appdata, request.task)  # U2: the CA readable to CMD
            box.plan = _plan(api, request, ready.record, appdata, (box.trust,) if box.trust else ())
            winsetup.refuse_overlap(ready, box.plan.acls.steps)  # C3: no grant reaches sandgate's own code
            _refuse_links(api, box.plan)  # N1: no junction carries the grant out of the workspace
            box.desk = _desk(api, request, ready.record)
            if self.transparent:  # the resolver before the proxy (transparent.py)
                box.capture = tp.prepare(api, ready.record, lambda: box.job, self.warn)
            self._proxy(box)  # 3
            if box.trust is not None:  # 3b: the proxy wrote its CA; the bundle beside it, before the ACLs
                box.bundle = trust.install(api, box.trust, request.env)
                self.warn(f"TLS to inspected hosts is signed by this run's CA, trusted inside via {box.bundle}")
            aclapply.apply(api, box.plan.acls, ready.record.sid, box.applied)  # 4
            box.job = api.create_job(box.plan.limits)  # 5 (limits passed job.check_job in plan_job)
            self._deny_reach(box)  # 5a: what the real user's logon SID would open to CMD (logonreach.py)
            box.desktop, box.lp_desktop = api.create_desktop(box.desk)  # 5b (never the user's desktop)
            if box.capture is not None:
                tp.start(box.capture)  # 5c: before CMD exists, so none of its connects goes unseen
        except BaseException:
            self.teardown(box)  # nothing of a failed make is left behind
            raise
        return box

    def _proxy(self, box: WinSandbox) -> None:
        if self.proxy_argv is None:  # U4: the one port CMD may reach is ours, not another run's proxy
            try:
                box.held = self.api.hold_port(box.ready.record.port)
            except WinApiError as e:
                raise WinApiError(f"{e}; {PORT_TAKEN}") from None
            return
        argv = (*self.proxy_argv, "--listen", f"127.0.0.1:{box.ready.record.port}")
        if box.capture is not None:
            argv += ("--transparent", tp.LISTEN)
        if box.trust is not None:  # not next to the audit log: sandgate's folder is denied to CMD
            argv += ("--ca-cert", ntpath.join(box.trust, trust.CA_FILE))
        box.proxy = self.api.start_proxy(argv)
        self.api.await_proxy(box.proxy, PROXY_READY_TIMEOUT)

    def _deny_reach(self, box: WinSandbox) -> None:
        """The sandbox SID denied this session's window station and desktop and sandgate's own and the
        proxy's processes, before CMD exists: its token likely holds the real user's logon SID
        (logonreach.py). Said, not refused, when Windows will not take it: the private desktop stays
        the first answer, and `sandgate verify`'s `logon_sid` row shows what CMD can still reach."""
        pids = (self.api.own_pid(), *((box.proxy.pid,) if box.proxy is not None else ()))
        try:
            self.api.deny_logon_reach(box.ready.record.sid, pids)
        except WinApiError as e:
            self.warn(f"{e}; the command may reach this desktop and sandgate's memory (docs/windows.md, 'Known gaps')")

    def start(self, sandbox: object) -> None:
        box = _box(sandbox)
        if box.plan is None or box.job is None:
            raise WinApiError("start before make finished")  # a seam misuse: never start unconfined
        launch = _launch(self.api, box, box.plan)
        box.mark = sweep.marker(box.applied.journal)
        self.api.write_file(box.mark, b"")  # 5d: before CMD exists, so a killed sandgate leaves it
        box.proc = self.api.start_suspended(launch)  # 6
        try:
            self.api.assign(box.job, box.proc)  # 7
        except WinApiError as e:
            self.api.terminate(box.proc)  # outside the job: never let one instruction run
            raise WinApiError(f"{e}; {JOB_REFUSED}") from None
        self.api.resume(box.proc)  # 8

    def wait(self, sandbox: object) -> int:
        box = _box(sandbox)
        if box.proc is None:
            raise WinApiError("wait before start")
        code = self.api.wait(box.proc)  # 9
        note = launch.exit_note(code)  # a start that failed inside CMD (its desktop): said, status kept
        if note is not None:
            self.warn(note)
        return code

    def teardown(self, sandbox: object) -> None:
        box = _box(sandbox)
        if box.capture is not None:  # first: the permits go before anything else (fail closed)
            self._step(box, "stop the transparent capture", lambda b: tp.stop(b.capture) if b.capture else None)
        self._step(box, "close the job", self._close_job)
        self._step(box, "sweep the sandbox user's leftovers", self._sweep)  # after the job: what escaped it
        self._step(box, "restore the ACLs", lambda b: aclapply.finish(self.api, b.applied, b.notes.append))
        self._step(box, "stop the proxy", self._stop_proxy)
        if box.trust is not None:  # after the ACLs and the proxy: the folder's grant is gone, the CA closed
            where, box.trust, box.bundle = box.trust, None, None
            self._step(box, "remove the run's CA folder", lambda _: trust.remove(self.api, where))
        if box.capture is not None:
            capture, box.capture = box.capture, None
            tp.close_resolver(capture)
        for note in box.notes:
            self.warn(f"teardown: {note}; 'sandgate cleanup' retries what is left")
        box.notes.clear()

    def _step(self, box: WinSandbox, what: str, undo: Callable[[WinSandbox], None]) -> None:
        try:
            undo(box)
        except WinApiError as e:
            box.notes.append(f"could not {what}: {e}")

    def _close_job(self, box: WinSandbox) -> None:
        """Each piece closed even when the one before failed (a refused TerminateJobObject must not
        keep the run's window station open: the job's last handle still kills on close)."""
        try:
            if box.job is not None:
                job, box.job = box.job, None
                self.api.close_job(job)  # KILL_ON_JOB_CLOSE: the whole tree, detached children too
        finally:
            try:
                if box.proc is not None:
                    proc, box.proc = box.proc, None
                    self.api.close_process(proc)
            finally:
                if box.desktop is not None:
                    desk, box.desktop = box.desktop, None
                    self.api.close_desktop(desk)

    def _sweep(self, box: WinSandbox) -> None:
        """As the sandbox user, after the job closed: its tasks deleted, its escaped processes ended.
        While another run of that user is live nothing is swept (those are its command's); this
        run's mark stays, and whoever runs next after both have ended sweeps."""
        if box.mark is None:
            return  # CMD never started: nothing of it can be left
        dead, other = sweep.pending(self.api, ntpath.dirname(box.mark))
        if other:
            return
        done = _swept(self.api, box.ready)
        line = sweep.describe(done)
        if line is not None:
            box.notes.append(line)  # the mark stays: the next run and `sandgate cleanup` sweep again
            return
        for path in (box.mark, *dead):
            self.api.remove_file(path)
        box.mark = None

    def _stop_proxy(self, box: WinSandbox) -> None:
        if box.held is not None:
            held, box.held = box.held, None
            self.api.release_port(held)
        if box.proxy is not None:
            proxy, box.proxy = box.proxy, None
            self.api.stop_proxy(proxy)


def _swept(api: WinApi, ready: winsetup.Ready) -> sweep.Swept:
    return sweep.sweep(api, ready.record.name, ready.password, ready.record.sid, api.own_pid())


def sweep_left(api: WinApi, ready: winsetup.Ready, appdata: str) -> sweep.Swept | None:
    """The sweep of runs that died with theirs pending (their marks removed once it is clean);
    None: nothing pending, or another run is live (its command's processes are not leftovers)."""
    dead, other = sweep.pending(api, state.journal_dir(appdata))
    if not dead or other:
        return None
    done = _swept(api, ready)
    if done.clean:
        for path in dead:
            api.remove_file(path)
    return done


def _box(sandbox: object) -> WinSandbox:
    if not isinstance(sandbox, WinSandbox):
        raise TypeError("not a Windows sandbox")
    return sandbox


def _plan(
    api: WinApi, request: SandboxRequest, record: state.SetupRecord, appdata: str, grants: tuple[str, ...] = ()
) -> plan.WindowsPlan:
    """The run's plan; sandgate's own state (journals, sealed password, audit logs) denied to the SID;
    `grants`: folders CMD must read besides its toolchain (the run's CA, trust.py)."""
    fs = request.policy.filesystem
    fs = dataclasses.replace(fs, read_deny=(*fs.read_deny, state.root(appdata)))
    policy = dataclasses.replace(request.policy, filesystem=fs)
    home = api.home()
    try:
        reads = (*acl.toolchain_dirs(api.environ(), home), *grants)  # M6: per-user toolchains on the real user's PATH
        found = acl.candidates(fs, cwd=request.cwd, home=home, read_grants=reads)
        existing = frozenset(winpath.key(p) for p in found if _exists(api, p))  # D3: by MAX_PATH too
        host = plan.Host(record.sid, request.cwd, home, existing, explicit_port=record.port, user=record.name)
        host = dataclasses.replace(host, read_grants=reads)
        return plan.plan(policy, host)
    except (winpath.WinPathError, ValueError) as e:
        raise WinApiError(str(e)) from None


def _refuse_links(api: WinApi, run: plan.WindowsPlan) -> None:
    """Before any ACE (r4-run N1): a link below a writable root that leads out of them all refuses the run."""
    roots = tuple(dict.fromkeys(s.path for s in run.acls.steps if s.why == "write"))
    line = links_out(api.reparse_points, roots)
    if line is not None:
        raise WinApiError(line)


def _exists(api: WinApi, path: str) -> bool:
    r"""Whether a candidate exists, refusing the run when only its `\\?\` name finds it (r3-day D3):
    without the long-path opt-in a plain name of MAX_PATH (260) or more is "not found", so a
    workspace of 251-258 characters had its `.git\HEAD` missed and every `.git\<x>` left unprotected,
    while CMD writes there through `\\?\` (learn.microsoft.com/windows/win32/fileio/maximum-file-path-limitation)."""
    if api.exists(path):
        return True
    if len(path) < LONG_PATH or path[1:3] != ":\\":
        return False
    if api.exists("\\\\?\\" + path):
        raise WinApiError(
            f"{path} is {len(path)} characters, over Windows' MAX_PATH, and long paths are not enabled here: "
            "enable them (LongPathsEnabled, as administrator) or move the workspace to a shorter path"
        )
    return False


def _desk(api: WinApi, request: SandboxRequest, record: state.SetupRecord) -> desktop.DesktopPlan:
    try:
        return desktop.plan_desktop(request.task, api.current_user_sid(), record.sid)
    except ValueError as e:
        raise WinApiError(str(e)) from None


def _git_dirs(api: WinApi, cwd: str) -> tuple[str, ...]:
    """Where the sandbox user's git may trust another owner (gitenv.py, r2-user U1): the workspace,
    and the repository it lies in when that is higher up and its `.git` is the real user's (never a
    `.git` another account planted above it, e.g. `C:\\.git`)."""
    here = cwd
    while not api.exists(ntpath.join(here, ".git")):
        if ntpath.dirname(here) == here:
            return (cwd,)  # in no repository: the workspace alone (a `git init` there is the user's)
        here = ntpath.dirname(here)
    try:
        mine = here != cwd and api.owner(ntpath.join(here, ".git")) == api.current_user_sid()
    except WinApiError:
        mine = False  # an owner we cannot even read is not ours to vouch for
    return (cwd, here) if mine else (cwd,)


def _launch(api: WinApi, box: WinSandbox, run: plan.WindowsPlan) -> Launch:
    """CMD's start, all of it decided here: the block checked before Windows sees it (an
    EnvBlockError is the user's one line, not a traceback: W1), the executable found with the
    run's own PATH (W5), the private desktop (H1), sandgate's pipes as std handles (W6)."""
    if box.desk is None or box.desktop is None:
        raise WinApiError("start before the desktop was made")  # never the user's desktop
    request = box.request
    env = envblock.overlay(profileenv.scrub(request.env, api.home(), keep_under=(request.cwd,)), run.env)
    try:
        env = gitenv.with_safe_directories(env, _git_dirs(api, request.cwd))  # U1: git trusts the workspace
        env = envblock.overlay(env, trust.env(box.bundle) if box.bundle else ())  # U2: the run's CA
        envblock.build(env)
        found = exesearch.resolve(request.cmd, env, request.cwd, api.exists)
        launch.check_cmdline(found.cmdline, request.cmd[0])  # CreateProcessWithLogonW's bound (R1)
    except (envblock.EnvBlockError, exesearch.ExeSearchError, launch.LaunchError) as e:
        raise WinApiError(str(e)) from None
    record = box.ready.record
    return Launch(
        record.name,
        box.ready.password,
        found.application,
        found.cmdline,
        request.cmd,
        request.cwd,
        env,
        box.lp_desktop,
    )
