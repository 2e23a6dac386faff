"""The filesystem and process boundary of one run, planned in the launcher before anything starts.

Mounts (what is writable, read-only, hidden), the home overlay, Landlock and the filtered
environment: all computed here, recorded in the audit log, applied later inside (sandbox.py).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fsguard import env as fsenv
from fsguard import exposed, homeoverlay, landlock, mounts, userns
from fsguard import policy as fspolicy
from launcher.errors import RunError
from launcher.run import configfiles, pathwarn, runtimedirs
from launcher.run.options import WEAKEN_ENV, RunOptions
from netguard.audit import AuditLog, policy_record

if TYPE_CHECKING:  # imported when used: most runs broker no credential
    from launcher.run.brokered import Brokered


@dataclass(frozen=True)
class Confinement:
    """Everything the sandbox's processes apply, computed in the launcher before anything starts."""

    mounts: mounts.MountPlan
    landlock: landlock.Plan | None  # None: the kernel has no Landlock (and it was not required)
    env: dict[str, str]
    env_dropped: list[str]
    home: str
    exposed: tuple[str, ...] = ()  # --expose-socket paths, as named: shown inside though their directory is hidden
    nested_userns: bool = False  # --allow-nested-userns: the command may make user namespaces of its own


@dataclass(frozen=True)
class Layout:
    """The mounts, the sockets shown and the environment of a run: computed by `layout` alone, for
    `plan` and for `sandgate explain` (which may then never disagree with what a run applies)."""

    mounts: mounts.MountPlan
    shown: tuple[runtimedirs.Exposed, ...]
    env: dict[str, str]
    env_dropped: list[str]
    home: str
    warnings: list[str]


def run_home(opts: RunOptions) -> str:
    return opts.user.home if opts.user else os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir


def layout(opts: RunOptions, rt: Path, secret_files: tuple[str, ...] = (), *, overlay: bool = True) -> Layout:
    """The boundary's layout in its order of steps; `overlay=False` leaves out the home layer (whose
    planning prepares its store on disk: a dry run changes nothing)."""
    home = run_home(opts)
    eff = _effective(opts, home, rt, secret_files)
    rdirs = _runtime_dirs(opts, eff)
    eff = dataclasses.replace(eff, read_deny=tuple(dict.fromkeys((*eff.read_deny, *rdirs.hide))))
    try:
        mplan = mounts.plan(eff)
    except mounts.MountError as e:
        raise RunError(e.strerror or str(e)) from None
    if overlay:
        uid = opts.user.uid if opts.user else os.getuid()
        try:
            home_layer = homeoverlay.plan(home, mplan.write_roots, uid=uid, owner=os.geteuid(), fresh=opts.fresh_home)
        except homeoverlay.HomeOverlayError as e:
            raise RunError(e.strerror or str(e)) from None
        mplan = _with_home(mplan, home_layer, uid)
    mplan, shown = _expose(opts, mplan, rdirs, rt)  # last: against every directory hidden
    env, dropped = fsenv.filter_env({k: v for k, v in os.environ.items() if k != WEAKEN_ENV}, opts.policy.env)
    _runtime_env(env, shown)
    if opts.user is not None:
        # The command runs as the sudo caller or --user: its home (where the overlay is) and its
        # names, as `sudo -i` would give them; sudo leaves HOME pointing at root's home.
        env.update(HOME=opts.user.home, USER=opts.user.name, LOGNAME=opts.user.name)
    return Layout(mplan, shown, env, dropped, home, [*mplan.notes, *rdirs.notes])


def plan(opts: RunOptions, audit: AuditLog, rt: Path, brokered: Brokered | None = None) -> Confinement:
    """Plan the filesystem and process boundary; refuse what cannot be enforced as asked."""
    lay = layout(opts, rt, brokered.files if brokered else ())
    mplan, shown, env, dropped, home, warnings = lay.mounts, lay.shown, lay.env, lay.env_dropped, lay.home, lay.warnings
    abi = landlock.abi_version()
    lplan: landlock.Plan | None = None
    if abi == 0:
        if opts.require_landlock:
            raise RunError("this kernel has no Landlock (disabled or too old), and --require-landlock was given")
        warnings.append("Landlock is not available on this kernel: writes are NOT restricted to the writable paths")
    else:
        lplan = landlock.plan((*mplan.write_roots, *((mplan.home.home,) if mplan.home else ())), abi=abi)
    if brokered is not None:  # sentinels in, and no variable carrying a real secret
        from launcher.run.brokered import apply_env

        env, dropped = apply_env(env, dropped, brokered)
    conf = Confinement(mplan, lplan, env, dropped, home, tuple(e.path for e in shown), opts.nested_userns)
    warnings += pathwarn.warnings(env.get("PATH"), mplan)  # "command not found" inside, said before it happens
    # An exposed socket is a hole the user asked for: the record names it among what the run warned about.
    _record(
        audit,
        opts.task,
        conf,
        abi,
        [
            *warnings,
            *(f"{p} is exposed inside (--expose-socket)" for p in conf.exposed),
            *([userns.NESTED_WARNING] if conf.nested_userns else []),  # a hole the user asked for, like a socket
        ],
        learn=opts.learn,
    )
    for w in warnings:
        print(f"sandgate: warning: {w}", file=sys.stderr)
    if opts.verbose:
        _describe(conf, abi)
    return conf


def _with_home(mplan: mounts.MountPlan, overlay: homeoverlay.HomeOverlay | None, uid: int) -> mounts.MountPlan:
    """The run's home overlay and its warnings; and every store of home layers hidden inside (the
    threat: a run reading another workspace's layer, or seeding it where a --write reaches the store)."""
    dirs = mplan.hide_dirs
    for store in (os.path.realpath(s) for s in homeoverlay.hidden_stores(uid)):
        if not os.path.isdir(store) or any(store == d or store.startswith(d.rstrip("/") + "/") for d in dirs):
            continue  # none, or already under a hidden directory
        if not mounts.left_out_by_private_tmp(store, mplan.private_tmp, mplan.tmp_rebinds):
            dirs = (*(d for d in dirs if not d.startswith(store + "/")), store)
    notes = (*mplan.notes, *(overlay.notes if overlay else ()))
    return dataclasses.replace(mplan, home=overlay, hide_dirs=dirs, notes=notes)


def _effective(opts: RunOptions, home: str, rt: Path, secret_files: tuple[str, ...] = ()) -> fspolicy.Effective:
    """The policy's `filesystem:` section with the command line's additions and sandgate's own state."""
    # A brokered credential's file is hidden like any secret file: the sandbox holds only its sentinel.
    own = (*_own(opts, rt), *secret_files)
    eff = fspolicy.effective(
        opts.policy.filesystem,
        cwd=os.getcwd(),
        home=home,
        extra_write=opts.write,
        extra_read_deny=(*opts.read_deny, *own),
    )
    # What configures this run and the next (--policy files and their includes, --upstream-ca, the
    # --approvals socket, the audit log), wherever it lives, is never changed, replaced or moved from
    # inside (the threat: a run rewriting the policy the user's next command applies, or forging its
    # own record): read-only under a writable root, directories pinned (launcher/run/configfiles.py).
    eff = configfiles.protect(eff, configfiles.of_run(opts))
    if weak := opts.weak.names():
        print(
            f"sandgate: WARNING: boundary deliberately weakened for a self-test: {', '.join(weak)}",
            file=sys.stderr,
        )
    if opts.weak.git_hooks:
        eff = dataclasses.replace(eff, protect=tuple(p for p in eff.protect if not p[0].endswith("/.git/hooks")))
    return eff


def _own(opts: RunOptions, rt: Path) -> tuple[str, ...]:
    """sandgate's own state (this run's runtime directory: the daemon's control socket, the approval
    socket; the trusted policy records; the audit logs) and an embedding tool's approval socket are
    never the sandbox's business: it must not be able to answer its own questions, bind itself a
    wider policy, or learn what is trusted."""
    from launcher.audit import logs as auditlogs
    from launcher.config import userconfig

    return (
        str(rt),
        str(userconfig.state_dir()),
        str(auditlogs.log_dir()),
        *((opts.approvals,) if opts.approvals else ()),
    )


def _runtime_dirs(opts: RunOptions, eff: fspolicy.Effective) -> runtimedirs.RuntimeDirs:
    """Every sandgate runtime directory spelling and /run/user/<uid> of every uid this run speaks for
    (issue 22: another daemon of the same user, or the user's systemd and D-Bus, found from inside)."""
    ids = runtimedirs.uids(os.geteuid(), os.getuid(), os.environ, opts.user.uid if opts.user else None)
    return runtimedirs.plan(os.environ, ids, keep_visible=(*eff.write, os.getcwd()))


def _expose(
    opts: RunOptions, mplan: mounts.MountPlan, rdirs: runtimedirs.RuntimeDirs, rt: Path
) -> tuple[mounts.MountPlan, tuple[runtimedirs.Exposed, ...]]:
    """--expose-socket: checked (a unix socket, never sandgate's own), and the hidden ones bound back."""
    try:
        shown = runtimedirs.check_exposed(opts.expose, rdirs.sandgate, _own(opts, rt))
    except runtimedirs.ExposeError as e:
        raise RunError(str(e)) from None
    for sock in shown:
        if sock.real in mplan.hide_files:  # the socket itself is hidden by name: docker.sock, a read_deny entry
            raise RunError(f"--expose-socket {sock.path}: refused, sandgate's policy hides this very socket")
    binds = tuple(b for sock in shown for b in exposed.binds(sock.path, sock.real, mplan))
    return dataclasses.replace(mplan, expose=tuple(dict.fromkeys(binds))), shown


def _runtime_env(env: dict[str, str], shown: tuple[runtimedirs.Exposed, ...]) -> None:
    """XDG_RUNTIME_DIR is unset inside: the directory it names is hidden (an empty read-only tmpfs
    over /run/user/<uid>) or left out by the private /tmp, and tools that create their sockets there
    (pulseaudio, dconf, podman...) would fail on it. Unset, they take the XDG spec's fallback (most
    use /tmp, the sandbox's own); `systemctl --user` and friends find no manager, as they must not.
    Kept only when an --expose-socket lies under it: tools find such a socket through the variable
    (WAYLAND_DISPLAY, pulse/native), and the user asked for exactly that."""
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if not xdg.startswith("/") or not any(
        e.path.startswith(xdg.rstrip("/") + "/") or e.real.startswith(os.path.realpath(xdg) + "/") for e in shown
    ):
        env.pop("XDG_RUNTIME_DIR", None)


def _record(audit: AuditLog, task: str, conf: Confinement, abi: int, warnings: list[str], learn: bool) -> None:
    """The run's `policy` record: the boundary as enforced, names of dropped variables (never values)."""
    m = conf.mounts
    audit.write(
        policy_record(
            task,
            write=list(m.write_roots),
            private_tmp=m.private_tmp,
            protect=[*m.protect, *(p for p, _ in m.placeholders)],
            hidden=[*m.hide_dirs, *m.hide_files],
            env_dropped=conf.env_dropped,
            landlock_abi=abi,
            warnings=warnings,
            cwd=os.getcwd(),  # the workspace: `sandgate audit summary` with no LOG finds its runs by it
            learn=learn,
        )
    )


def _describe(conf: Confinement, abi: int) -> None:
    """-v: the effective boundary, one line per kind."""
    m, overlay = conf.mounts, conf.mounts.home
    tmp = " (private)" if m.private_tmp else ""
    say = sys.stderr
    print(f"sandgate: writable: {', '.join(r + (tmp if r == '/tmp' else '') for r in m.write_roots)}", file=say)
    print(f"sandgate: read-only: {', '.join([*m.protect, *(p for p, _ in m.placeholders)]) or '-'}", file=say)
    print(f"sandgate: hidden: {', '.join([*m.hide_dirs, *m.hide_files]) or '-'}", file=say)
    print(f"sandgate: exposed sockets: {', '.join(conf.exposed) or '-'}", file=say)
    print(f"sandgate: environment dropped: {', '.join(conf.env_dropped) or '-'}", file=say)
    print(f"sandgate: landlock ABI {abi}", file=say)
    print(
        f"sandgate: nested user namespaces: {'allowed (--allow-nested-userns)' if conf.nested_userns else 'refused'}",
        file=say,
    )
    if overlay is not None:
        print(
            f"sandgate: home: {overlay.home} writable inside, writes kept in {overlay.upper}"
            + (f", then for this workspace's next runs in {overlay.layers[0]}" if overlay.layers else ", then dropped")
            + " (the real home never changes; sandgate cache clear)",
            file=say,
        )
