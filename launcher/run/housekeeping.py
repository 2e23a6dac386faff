"""What lives outside a run: `sandgate cleanup`, `sandgate cache clear`, `sandgate daemon status|stop|start`."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from launcher.forkserver import client as forkclient
from launcher.run.options import resolve_user
from netguard.daemon.status import Status

if sys.platform != "win32":  # all three import fcntl; `sandgate cleanup` on Windows must import this module
    from launcher.run import daemonctl, runstate
    from netguard.daemon import control

if TYPE_CHECKING:
    from fsguard.layerstore import RunEntry


def cleanup() -> int:
    """Remove what killed runs left: placeholders, state, dead daemons' and fork servers' sockets, a killed
    verify's worlds."""
    if sys.platform == "win32":  # there: the ACL journals of killed runs (launcher/run/windows)
        from launcher.run.windows import runner

        return runner.cleanup()
    rt = runstate.runtime_dir()
    with runstate.lock(rt):  # never between another run's placeholder creation and its state file
        removed = runstate.cleanup_stale(rt)
    for sock in sorted(rt.glob("daemon-*.sock")):  # every netns and code version's daemon
        try:
            control.ControlClient.connect(sock, timeout=2.0).close()
        except (OSError, control.ControlError):
            sock.unlink(missing_ok=True)  # a dead daemon's socket
            removed.append(f"dead daemon socket {sock}")
    for path in forkclient.stale_files(str(rt)):  # a SIGKILLed fork server's socket, old refusals
        Path(path).unlink(missing_ok=True)
        removed.append(f"stale fork server file {path}")
    if os.geteuid() == 0 and shutil.which("ip"):
        from launcher.run import staleworlds

        removed += staleworlds.cleanup_stale(staleworlds.VERIFY_PREFIXES)  # worlds of a killed `sandgate verify`
    for item in removed:
        print(f"sandgate: removed {item}", file=sys.stderr)
    if not removed:
        print("sandgate: nothing to clean up", file=sys.stderr)
    return 0


def cache_clear(user_spec: str | None, wait: bool) -> int:
    """`sandgate cache clear`: forget what sandboxed runs wrote under ~ (caches, and anything else)."""
    if sys.platform == "win32":  # one line, not a traceback from the fcntl-based modules
        raise UsageError("'sandgate cache' is not on Windows: the sandbox user's caches are in its own profile")
    from fsguard import homeoverlay

    user = resolve_user(user_spec)  # --user, else the sudo caller, else you
    uid = user.uid if user else os.getuid()

    def waiting(live: list[RunEntry]) -> None:
        print(f"sandgate: waiting for {_sandboxes(live)} to end", file=sys.stderr)

    try:
        removed = homeoverlay.clear(uid, os.geteuid(), wait=wait, waiting=waiting)
    except homeoverlay.LayersBusy as e:
        # Removing a layer under a live sandbox would pull its home away (its writes would fail).
        raise UsageError(
            f"{_sandboxes(e.live)} use the home layers: run this again when they end, or add --wait"
        ) from None
    except OSError as e:  # HomeOverlayError, or what even a forced removal could not remove
        raise UsageError(f"cannot clear the sandbox homes: {e.strerror or e}") from None
    store = homeoverlay.store(uid)
    print(
        f"sandgate: removed {removed} home layer(s) in {store}" if removed else "sandgate: nothing to clear",
        file=sys.stderr,
    )
    return 0


def _sandboxes(live: list[RunEntry]) -> str:
    """One line's worth: '2 running sandboxes (pid 12 in /w/a; pid 34 in /w/b)'."""
    who = "; ".join(f"pid {r.pid} in {r.workspace}" for r in live)
    return f"{len(live)} running sandbox{'es' if len(live) > 1 else ''} ({who})"


def daemon(action: str, as_json: bool) -> int:
    """`sandgate daemon status|stop|start`: the per-user proxy daemon that `sandgate run` starts on demand."""
    if sys.platform == "win32":
        raise UsageError("'sandgate daemon' is not on Windows: each 'sandgate run' starts and stops its own proxy")
    rt = runstate.runtime_dir()
    path = control.socket_path(rt)
    if action == "start":
        d = daemonctl.Daemon(rt)
        d.wait_ready(daemonctl.START_TIMEOUT)
        d.close()
        print(f"sandgate: daemon running ({path})", file=sys.stderr)
        return 0
    if action == "stop":
        return _stop(rt, path)
    try:
        client = control.ControlClient.connect(path, timeout=2.0)
    except (OSError, control.ControlError):
        print(f"sandgate: no daemon running ({path})", file=sys.stderr)
        return 3
    try:
        st = client.status()
    finally:
        client.close()
    if as_json:
        print(json.dumps(st))
    else:
        _print_status(st, path)
    return 0


def _stop(rt: Path, path: Path) -> int:
    """`daemon stop`: this sandgate's daemon and an older sandgate's of this network namespace too (an
    upgrade or a checkout that moved on leaves the old one serving nobody until its idle exit; a user who
    says stop means every one). Another network namespace's daemons are theirs."""
    if forkclient.stop_all(str(rt)):
        print("sandgate: fork servers stopped (the runs they serve finish first)", file=sys.stderr)
    netns = os.stat("/proc/self/ns/net").st_ino
    stopped = 0
    for sock in sorted(rt.glob(f"daemon-{netns}-*.sock"), key=lambda p: p != path):  # this code's first
        try:
            client = control.ControlClient.connect(sock, timeout=2.0)
        except (OSError, control.ControlError):
            continue  # a dead daemon's socket: `sandgate cleanup` removes it
        try:
            client.stop()
        except (OSError, control.ControlError) as e:
            print(f"sandgate: could not stop the daemon at {sock}: {e}", file=sys.stderr)
            continue
        finally:
            client.close()
        stopped += 1
        older = "" if sock == path else f" (an older sandgate's, {sock})"
        print(f"sandgate: daemon stopped{older}", file=sys.stderr)
    if not stopped:
        print(f"sandgate: no daemon running ({path})", file=sys.stderr)
    return 0


def _print_status(st: Status, path: Path) -> None:
    bindings = st["bindings"]
    loading = "" if st.get("mitmproxy", "ready") == "ready" else f"; mitmproxy: {st.get('mitmproxy')}"
    print(
        f"sandgate: daemon pid {st['pid']}, up {st['uptime']:.0f} s, {len(bindings)} sandbox(es){loading}; socket {path}"
    )
    for b in bindings:
        print(f"  task {b['task']} since {b['since']}")
