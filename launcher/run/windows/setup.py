"""`sandgate setup` (elevated, once) and `setup --remove` on Windows, and the check every run makes.

Setup, in order: elevation checked -> the sandbox user (a random password from `secrets`, sealed
with DPAPI under the real user's profile) -> its logon rights denied (logonrights.py: no batch,
service, network or RDP logon) -> its deny ACEs on WMI's root and root\\cimv2 and in DCOM's
machine-wide launch/access limits (servicedeny.py: no Win32_Process.Create, no out-of-process COM
server) -> the setup record (name, SID, port: written before any filter,
so a crashed setup can still be removed) -> the persistent WFP filters (wfp plan, one
transaction) -> the firewall rules (firewall.py, in their order). Every step first looks whether
its piece is already there, so a second setup changes nothing (uuid5 keys, fixed rule names).
Remove is the reverse, and a missing piece is not an error; it sweeps first (fsguard/windows/sweep.py:
the sandbox user's scheduled tasks and processes outside any job, ended as that user), and stops
before deleting anything if something survives. Threats: see docs/windows.md (a
separate user whom WFP and the firewall can match by SID; a password only the real user can read).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from fsguard.windows import acl, logonrights, selfprotect, servicedeny, sweep, win32selfprotect
from launcher.run.windows.winapi import WinApi
from netguard.windows import firewall, wfp
from sgbase.windows import state
from sgbase.windows.api import WinApiError

SETUP_HINT = "run 'sandgate setup' as administrator"
#: The proxy's transparent listener (plan.Host.transparent_port), the one inbound port allowed.
TRANSPARENT_PORT = 3129


class NotSetUp(WinApiError):
    """A run on a machine without (complete) setup: refused, never run with a weaker boundary."""


@dataclass(frozen=True)
class Ready:
    """What a run needs from setup: the sandbox user, its password (in memory only), its port."""

    record: state.SetupRecord
    password: str
    #: this interpreter's code folders on a drive, denied or not (selfprotect.code_folders): no run's
    #: writable folder may reach them (refuse_overlap)
    code: tuple[str, ...] = ()


def _need_admin(api: WinApi, what: str) -> None:
    if not api.is_admin():
        raise WinApiError(f"{what} changes users and WFP filters: run it from an elevated (administrator) terminal")


def _same_account(api: WinApi, what: str) -> None:
    """M13: setup binds the sandbox user, its DPAPI-sealed password, the filters' read grant and
    the proxy-port guard to the account running it. Elevated with another administrator's
    credentials, that is not the person at this desktop, whose runs would then never find a setup;
    refused in one line. A session without a user (a service, a CI agent) is not compared."""
    session = api.session_user_sid()
    if session is not None and session != api.current_user_sid():
        raise WinApiError(
            f"{what} is elevated as another account than this session's user; run it as administrator "
            "from your own account (UAC 'Run as administrator'), so that it is set up for you"
        )


def setup(api: WinApi, say: Callable[[str], None], *, transparent: bool = False) -> None:
    """Install every piece that is missing; say one line for each piece made or found.
    `transparent`: also the inbound allow the transparent path needs (firewall.transparent_allow)."""
    _need_admin(api, "sandgate setup")
    _same_account(api, "sandgate setup")
    appdata = api.local_appdata()
    name = state.sandbox_user_name(api.current_user_sid())
    for folder in (state.root(appdata), state.journal_dir(appdata), state.audit_dir(appdata)):
        api.make_dir(folder)
    sid = _user(api, appdata, name, say)
    api.deny_logon_rights(sid, logonrights.DENIED)  # H3: no batch (tasks), service, network, RDP logon
    _deny_services(api, sid, say)  # H3: no Win32_Process.Create, no out-of-process COM server
    edits = _self_edits(api, appdata, sid, say)
    record = state.SetupRecord(name, sid, state.PROXY_PORT, selfprotect.to_record(edits))
    if api.read_file(state.setup_record(appdata)) != state.encode(record):
        api.write_file(state.setup_record(appdata), state.encode(record))  # before any filter or ACE: removable
    added = win32selfprotect.apply(api, sid, edits)  # C3: no code planted where sandgate loads its own
    say(f"sandgate's own folders denied to the sandbox user: {added} added, {len(edits) - added} present")
    plan = wfp.plan_filters(sid, (record.port,), owner=api.current_user_sid())
    if api.wfp_installed(plan):
        say(f"WFP filters for {name}: present ({len(plan.filters)})")
    else:
        api.wfp_remove(plan)  # a half-installed set would make the transaction's adds collide
        api.wfp_install(plan)
        say(f"WFP filters for {name}: installed ({len(plan.filters)})")
    rules = firewall.plan_rules(sid, (record.port,))
    missing = [rule for rule in rules if not api.firewall_has(rule.name)]
    for rule in missing:  # in plan order: off-host first, the dangerous direction
        api.firewall_add(rule)
    say(f"firewall rules for {name}: {len(missing)} added, {len(rules) - len(missing)} present")
    if transparent:
        allow = firewall.transparent_allow(api.current_user_sid(), api.python(), TRANSPARENT_PORT)
        if not api.firewall_has(allow.name):
            api.firewall_add(allow)
        say(f"transparent mode: inbound TCP {TRANSPARENT_PORT} allowed for {api.python()} (this user only)")


def _self_edits(api: WinApi, appdata: str, sid: str, say: Callable[[str], None]) -> tuple[selfprotect.Edit, ...]:
    """This interpreter's deny edits, plus those an earlier setup recorded for this SID whose folder
    still exists (another interpreter set up before: its runs stay protected, remove takes all out)."""
    plan = win32selfprotect.make_plan(api)
    for path, why in plan.skipped:
        say(f"not denied to the sandbox user: {path} ({why})")
    try:
        old = _record(api, appdata)
    except WinApiError:
        old = None  # an unreadable record is rewritten below
    kept = selfprotect.from_record(old.protected) if old is not None and old.sid == sid else ()
    return selfprotect.merged(plan.edits, tuple(e for e in kept if api.dacl(e.path) is not None))


def _sd(api: WinApi, edit: servicedeny.SdEdit) -> str | None:
    if edit.kind == "wmi":
        return api.wmi_namespace_sd(edit.target)
    return api.com_restriction_sd(edit.target)


def _set_sd(api: WinApi, edit: servicedeny.SdEdit, sd: str) -> None:
    if edit.kind == "wmi":
        api.set_wmi_namespace_sd(edit.target, sd)
    else:
        api.set_com_restriction_sd(edit.target, sd)


def _deny_services(api: WinApi, sid: str, say: Callable[[str], None]) -> None:
    """H3: the sandbox SID's deny ACE on WMI's root and root\\cimv2 and in DCOM's machine-wide
    launch/access limits (servicedeny.py), each only where it is missing."""
    added = 0
    for edit in servicedeny.plan(sid):
        sd = _sd(api, edit)
        if sd is None:  # no value: DCOM's built-in limits apply, and a value of ours alone would deny all
            raise WinApiError(
                f"{servicedeny.OLE_KEY}\\{edit.target} is missing; set the COM security limits once "
                "(dcomcnfg: My Computer > Properties > COM Security > Edit Limits > OK) and run setup again"
            )
        if edit.kind == "com" and not servicedeny.com_format_ok(sd):  # S4: never write a mixed COM ACL
            raise WinApiError(
                f"{servicedeny.OLE_KEY}\\{edit.target} is in the old COM ACL format (execute-only entries), "
                "which sandgate's entry would make invalid for every COM server; re-save the limits once "
                "(dcomcnfg: My Computer > Properties > COM Security > Edit Limits > OK) and run setup again"
            )
        if not servicedeny.has(sd, edit):
            _set_sd(api, edit, servicedeny.applied(sd, edit))
            added += 1
    say(f"WMI and DCOM denies for the sandbox user: {added} added, {len(servicedeny.plan(sid)) - added} present")


def _undeny_services(api: WinApi, sid: str) -> None:
    """Exactly our deny ACEs out again (reverse order); anything else in those descriptors kept."""
    for edit in reversed(servicedeny.plan(sid)):
        sd = _sd(api, edit)
        if sd is not None and servicedeny.has(sd, edit):
            _set_sd(api, edit, servicedeny.undone(sd, edit))


def _user(api: WinApi, appdata: str, name: str, say: Callable[[str], None]) -> str:
    """The sandbox user's SID; the user made, or its password reset, only when the sealed copy
    is missing or unreadable (then nobody can log on as it with the old one anyway)."""
    sealed_at = state.sealed_password(appdata)
    sid = api.user_sid(name)
    sealed = api.read_file(sealed_at)
    if sid is not None and sealed is not None and _readable(api, sealed):
        say(f"sandbox user {name}: present ({sid})")
        return sid
    password = _password()
    if sid is None:
        sid = api.create_user(name, password)
        say(f"sandbox user {name}: created ({sid})")
    else:
        api.set_password(name, password)
        say(f"sandbox user {name}: password renewed (its sealed copy was missing)")
    api.write_file(sealed_at, api.protect(password.encode()))  # DPAPI: only this user, this machine
    return sid


def _readable(api: WinApi, sealed: bytes) -> bool:
    try:
        api.unprotect(sealed)
    except WinApiError:
        return False  # sealed by another user or machine: renew rather than run without it
    return True


def _password() -> str:
    """A random password no human types (secrets: a CSPRNG): 32 characters over four classes,
    so it meets any local complexity policy."""
    body = secrets.token_urlsafe(24)
    return body + "aZ9!"


def remove(api: WinApi, say: Callable[[str], None]) -> None:
    """Firewall rules, WFP filters, the user, the sealed password: in reverse, missing pieces skipped."""
    _need_admin(api, "sandgate setup --remove")
    appdata = api.local_appdata()
    record = _record(api, appdata)
    if record is None:
        name = state.sandbox_user_name(api.current_user_sid())
        sid = api.user_sid(name)
        record = state.SetupRecord(name, sid, state.PROXY_PORT) if sid else None
    if record is not None:
        _sweep_first(api, appdata, record, say)  # before anything of the user goes (its SID's leftovers)
        for rule in reversed(firewall.plan_rules(record.sid, (record.port,))):
            if api.firewall_has(rule.name):
                api.firewall_remove(rule.name)
        # by derived key; missing is fine, any other failure stops here with the record kept (M7)
        api.wfp_remove(wfp.plan_filters(record.sid, (record.port,), owner=api.current_user_sid()))
        allow = firewall.transparent_allow(api.current_user_sid(), api.python(), TRANSPARENT_PORT)
        if api.firewall_has(allow.name):
            api.firewall_remove(allow.name)
        api.undeny_logon_rights(record.sid, logonrights.DENIED)  # LSA keeps rights by SID: no orphans
        _undeny_services(api, record.sid)
        # by meaning (C3): the recorded ones, and this interpreter's in case the record was lost
        edits = selfprotect.merged(selfprotect.from_record(record.protected), win32selfprotect.make_plan(api).edits)
        win32selfprotect.remove(api, record.sid, edits)
        api.delete_profile(record.sid)  # NetUserDel would leave C:\Users\<name> and its hive (M10)
        if api.user_sid(record.name) is not None:
            api.delete_user(record.name)
        say(f"removed the sandbox user {record.name}, its profile, WFP filters and firewall rules")
    else:
        say("nothing to remove: no sandbox user and no setup record")
    api.remove_file(state.sealed_password(appdata))
    api.remove_file(state.setup_record(appdata))


def _sweep_first(api: WinApi, appdata: str, record: state.SetupRecord, say: Callable[[str], None]) -> None:
    """The teardown sweep as the sandbox user, before it is deleted. Threat: a scheduled task or an
    escaped process of a deleted account outlives it, orphaned: nobody can log on as that SID any
    more to end it, and a task's action runs again with whatever the SID still has. What the sweep
    leaves (or a sweep that cannot run) stops the removal in one line, nothing deleted yet."""
    if api.user_sid(record.name) != record.sid:
        return  # deleted (or re-created) by hand: nothing can log on as this SID to sweep it
    _, live = sweep.pending(api, state.journal_dir(appdata))
    if live:  # its processes are a live run's command, not leftovers: never ended under it
        raise WinApiError("a sandgate run is still running; let it finish, then run 'sandgate setup --remove' again")
    done = sweep.sweep(api, record.name, _sweep_password(api, appdata, record.name), record.sid, api.own_pid())
    left = sweep.describe(done)
    if left is not None:
        raise WinApiError(
            f"{left}; the sandbox user was not removed: end them as administrator (Task Manager, "
            "schtasks /delete), then run 'sandgate setup --remove' again"
        )
    if done.killed or done.deleted:
        say(f"swept {len(done.killed)} process(es) and {len(done.deleted)} scheduled task(s) of the sandbox user")


def _sweep_password(api: WinApi, appdata: str, name: str) -> str:
    """The sealed password, or (missing, unreadable) a fresh one set now: the sweep logs on with it."""
    sealed = api.read_file(state.sealed_password(appdata))
    if sealed is not None:
        try:
            return api.unprotect(sealed).decode()
        except (WinApiError, UnicodeDecodeError):
            pass  # sealed by another user or machine: renewed below (the user is going anyway)
    password = _password()
    api.set_password(name, password)
    return password


def _record(api: WinApi, appdata: str) -> state.SetupRecord | None:
    raw = api.read_file(state.setup_record(appdata))
    if raw is None:
        return None
    try:
        return state.decode(raw)
    except state.StateError as e:
        raise WinApiError(f"{state.setup_record(appdata)}: {e}; delete it and run 'sandgate setup' again") from None


def check(api: WinApi) -> Ready:
    """Before a run touches anything: the user, its sealed password, every persistent filter and
    the denies on sandgate's own folders are there, or the run is refused (fail closed: without the
    filters CMD would have the network; without the denies it could plant code the next `sandgate`
    runs as the real user)."""
    appdata = api.local_appdata()
    try:
        record = _record(api, appdata)
    except WinApiError as e:
        raise NotSetUp(f"{e}") from None
    sealed = api.read_file(state.sealed_password(appdata))
    if record is None or sealed is None:
        raise NotSetUp(f"sandgate run on Windows needs its one-time setup (no sandbox user yet); {SETUP_HINT}")
    if api.user_sid(record.name) != record.sid:
        raise NotSetUp(f"the sandbox user {record.name} is missing or was re-created; {SETUP_HINT}")
    try:  # unelevated: needs the FWPM_ACTRL_READ that setup grants this user on each filter (W2)
        present = api.wfp_installed(wfp.plan_filters(record.sid, (record.port,), owner=api.current_user_sid()))
    except WinApiError as e:
        raise NotSetUp(f"{e}; {SETUP_HINT} again") from None  # e names the missing read right
    if not present:
        raise NotSetUp(f"the persistent WFP filters for {record.name} are missing or outdated; {SETUP_HINT}")
    folders = _check_self(api, record)
    try:
        password = api.unprotect(sealed).decode()
    except (WinApiError, UnicodeDecodeError):
        raise NotSetUp(f"the sandbox user's sealed password cannot be read; {SETUP_HINT}") from None
    return Ready(record, password, folders)


def _check_self(api: WinApi, record: state.SetupRecord) -> tuple[str, ...]:
    """C3: every deny this interpreter needs was recorded by setup and is still in its folder's DACL
    (one read per folder, no walk). Returns the code folders for refuse_overlap."""
    plan = win32selfprotect.make_plan(api)
    new = selfprotect.missing(plan, selfprotect.from_record(record.protected))
    if new:  # a venv made after setup, or a setup from before this layer
        raise NotSetUp(
            f"sandgate's own folder {new[0].path} is not protected from the sandbox user; {SETUP_HINT} again"
        )
    gone = win32selfprotect.absent(api, record.sid, plan.edits)
    if gone is not None:
        raise NotSetUp(f"the sandbox user's deny ACE on {gone} is missing; {SETUP_HINT} again")
    return selfprotect.code_folders(plan)


def refuse_overlap(ready: Ready, steps: tuple[acl.AclStep, ...]) -> None:
    """C3: a run whose writable folder is or lies in sandgate's own code (an editable install's
    checkout used as the workspace) could rewrite sandgate itself: refused before anything is applied."""
    hit = selfprotect.overlap(tuple(s.path for s in steps if s.why == "write"), ready.code, _edits(ready))
    if hit is not None:
        raise WinApiError(f"{hit}; run from another folder (sandgate's code must stay out of the sandbox's reach)")


def _edits(ready: Ready) -> tuple[selfprotect.Edit, ...]:
    return selfprotect.from_record(ready.record.protected)
