"""`sandgate run --transparent` on Windows: the redirect loop's lifecycle around one run.

The loop itself is win32divert.TransparentPath; this is when it starts and stops, and what a run
checks first. Order, each step for a threat:
  check    before anything is touched: a proxy to reflect into (a policy), an elevated terminal
           (WinDivert's driver and FwpmEngineOpen0's dynamic session are administrators' only),
           and `setup --transparent` done (the proxy's inbound allow; without it every reflected
           SYN is dropped by the firewall's default inbound block: no leak, but no network)
  prepare  the resolver on 127.0.0.1:8085 BEFORE the proxy starts: else mitmproxy's own
           transparent setup finds the port free and starts its own WinDivert redirector (it
           reflects every process's traffic, for everyone)
  start    after the job exists and before CMD is created: SeDebugPrivilege enabled in sandgate's
           own token (win32debug.py: else another user's process refuses the loop's OpenProcess
           and its flows are dropped; refused in one line if it cannot be), handles open, then
           the dynamic permits (never permits without diversion); a failure refuses the run
  stop     first thing in teardown: permits out, then the handles (the persistent block applies
           again), then SeDebugPrivilege disabled (unless it was enabled before the run), then,
           after the proxy is gone, the resolver
A loop that dies mid-run (recv fails: the driver unloaded, a handle closed) removes its permits
itself (fail closed: CMD's connections are refused by the persistent WFP block from then on) and
the run says so in one line. Every effect is the WinApi's, so all of it runs against the fake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.run.windows import setup
from launcher.run.windows.winapi import WinApi
from netguard.windows import divertfilter, firewall, owners, wfp, win32divert
from sgbase.windows import state
from sgbase.windows.api import WinApiError

#: Where the proxy child's transparent listener accepts reflected flows: every local IPv4 address
#: (a reflected SYN arrives addressed to the host's own address, never loopback: reflect.py).
LISTEN = f"0.0.0.0:{setup.TRANSPARENT_PORT}"


@dataclass
class Capture:
    """One run's transparent capture; `failure` is set (by the loop's thread) if it died mid-run."""

    path: win32divert.TransparentPath
    api: WinApi
    resolver: win32divert.ResolverServer | None = None
    failure: str | None = None
    debug: bool = False  # SeDebugPrivilege enabled by this run: disabled again at stop


def check(api: WinApi, has_proxy: bool) -> None:
    """Refuse a transparent run that could not work, in one line, before anything is touched."""
    if not has_proxy:
        raise WinApiError("--transparent needs a policy (--allow or --policy): there is no proxy to capture into")
    if not api.is_admin():
        raise WinApiError(
            "--transparent needs an elevated (administrator) terminal: WinDivert's driver and the "
            "dynamic WFP session are for administrators only; run without --transparent otherwise"
        )
    allow = firewall.transparent_allow(api.current_user_sid(), api.python(), setup.TRANSPARENT_PORT)
    if not api.firewall_has(allow.name):
        raise setup.NotSetUp(
            "transparent mode is not set up (the proxy's inbound firewall allow is missing); "
            "run 'sandgate setup --transparent' as administrator"
        )


def prepare(
    api: WinApi, record: state.SetupRecord, job: Callable[[], int | None], say: Callable[[str], None]
) -> Capture:
    """The loop (not started) and its resolver, listening. `job`: the run's job once it exists; a
    connect before that (none of CMD's: CMD starts later) counts as the job's, so goes to the proxy.
    A connect of the sandbox user from outside the job, or whose owner cannot be read, is dropped
    (owners.judge): the permits match the SID, not the job."""
    plan = wfp.plan_filters(record.sid, (record.port,), owner=api.current_user_sid())
    look = _looker(api, job)

    def release(handle: int) -> None:
        try:
            api.owner_release(handle)
        except WinApiError:
            pass  # a handle already gone: nothing pinned any more, and no reason to stop the loop

    capture: Capture | None = None

    def failed(why: str) -> None:
        if capture is not None:
            capture.failure = why
        say(f"error: {why}; the command's connections are blocked from now on (fail closed)")

    path = win32divert.TransparentPath(
        plan,
        record.sid,
        divertfilter.plan_filters(setup.TRANSPARENT_PORT),
        setup.TRANSPARENT_PORT,
        look,
        permits=win32divert.Permits(api.wfp_open_dynamic, api.wfp_close_dynamic),
        release=release,
        opener=api.divert_open,
        on_fail=failed,
    )
    capture = Capture(path, api)
    capture.resolver = api.serve_resolver(path)
    return capture


def _looker(api: WinApi, job: Callable[[], int | None]) -> Callable[[int], owners.Held]:
    """The loop's owner lookup: the process opened first (its handle pins the pid), then the job's
    pid list asked about it (owners.held decides); a failure is "cannot tell", never raised."""

    def look(pid: int) -> owners.Held:
        j = job()
        if j is None:
            return owners.Held(owners.Owner("job", None))
        try:
            opened = api.owner_open(pid)
        except WinApiError:
            opened = owners.Opened()  # refused or gone: the job's list may still name it
        try:
            listed: frozenset[int] | None = api.job_pids(j)
        except WinApiError:
            listed = None  # membership unknown: dropped (owners.judge); the loop goes on
        return owners.held(pid, opened, listed)

    return look


def start(capture: Capture) -> None:
    """SeDebugPrivilege, then handles, then permits, then the loop's thread; any failure is the
    run's one line (refused; teardown's stop undoes what was done)."""
    try:
        was = capture.api.debug_privilege(True)
    except WinApiError as e:
        raise WinApiError(
            f"--transparent could not enable SeDebugPrivilege ({e}); without it the loop cannot tell "
            "whose connections other users' processes make; run it from an elevated terminal of an "
            "administrator that holds 'Debug programs' (the default), or run without --transparent"
        ) from None
    capture.debug = not was
    try:
        capture.path.start()
    except (OSError, WinApiError) as e:
        raise WinApiError(
            f"transparent capture could not start: {e}; without --transparent the explicit proxy still works"
        ) from None


def stop(capture: Capture) -> None:
    """Permits first, then the handles (idempotent; win32divert.TransparentPath.stop), then
    SeDebugPrivilege back off if this run enabled it (sandgate's token as the run found it)."""
    try:
        capture.path.stop()
    finally:  # also when the permits could not be removed: the privilege is not kept for nothing
        if capture.debug:
            capture.debug = False
            capture.api.debug_privilege(False)


def close_resolver(capture: Capture) -> None:
    """After the proxy is gone (a proxy still running would otherwise start its own redirector)."""
    if capture.resolver is not None:
        resolver, capture.resolver = capture.resolver, None
        resolver.close()
