"""`sandgate verify` on Windows (issue 28, W3): the Windows probe bodies, each run in a real
sandbox through the same backend as `sandgate run`, one row each.

Why not the Linux self-test: it needs namespaces, nft and unix sockets. Here every body runs as
the sandbox user in a scratch workspace under %LOCALAPPDATA% (never the user's own directory),
writes what it saw, and is judged; a probe of the shared list without a Windows body yet is
listed as such, never counted as passed. Exit 0: every written probe passed or is a documented gap
(GAP: printed on every run, never counted as passed); 1: one failed.
"""

from __future__ import annotations

import json
import ntpath
import sys
import uuid
from collections.abc import Callable

from fsguard import env as fsenv
from launcher.config.load import Policy
from launcher.errors import UsageError
from launcher.run import seam
from launcher.run.windows import runner
from launcher.run.windows.winapi import WinApi
from launcher.run.windowsbackend import WindowsBackend
from netguard.policy import NetworkPolicy
from selftest.windows import allbodies, probebody, probes
from selftest.windows.probebody import ProbeBody, Verdict
from sgbase.windows.api import WinApiError


def select(only: str | None, found: tuple[ProbeBody, ...]) -> tuple[ProbeBody, ...]:
    if not only:
        return found
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    return tuple(b for b in found if b.name in wanted or b.group in wanted)


def _venv_home(cfg: bytes) -> str | None:
    for line in cfg.decode("utf-8", "replace").splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() == "home" and value.strip():
            return value.strip()
    return None


def interpreter(api: WinApi) -> str:
    """The interpreter the bodies run with: the venv's base one when sandgate lives in a venv (pipx,
    a project's). A venv's python.exe is a redirector, usually in the real user's profile, which the
    sandbox user cannot read; the interpreter it starts is the one pyvenv.cfg's `home` names, beside
    it or one folder up (CPython's getpath: "Override executable_dir ... with the value from 'home'").
    The bodies need only the standard library (`-I`), so the base interpreter runs them as well."""
    python = api.python()
    here = ntpath.dirname(python)
    for folder in (here, ntpath.dirname(here)):
        try:
            cfg = api.read_file(ntpath.join(folder, "pyvenv.cfg"))
        except WinApiError:
            cfg = None
        home = _venv_home(cfg) if cfg is not None else None
        if home is not None:
            base = ntpath.join(home, ntpath.basename(python))
            return base if api.exists(base) else python
    return python


def run_body(api: WinApi, body: ProbeBody, workdir: str, warn: Callable[[str], None]) -> Verdict:
    """One body in its own run: no policy (no proxy; the network is WFP-blocked), its own result."""
    result, script = ntpath.join(workdir, probebody.RESULT), ntpath.join(workdir, probebody.SCRIPT_FILE)
    api.remove_file(result)
    api.write_file(script, body.script.encode())  # a file: the command line holds 1024 characters at most
    pol = Policy(NetworkPolicy(), ())
    env, _ = fsenv.filter_env(api.environ(), pol.env)
    request = seam.SandboxRequest(body.argv(interpreter(api), script), workdir, env, pol, uuid.uuid4().hex[:12])
    try:
        undo = body.prepare(api, workdir) if body.prepare else None  # before the run: the plan must see it
    except BaseException:
        api.remove_file(script)
        raise
    try:
        code = seam.run_in(WindowsBackend(api, None, warn), request)
        return body.judge(code, probebody.parse(api.read_file(result)))
    finally:
        api.remove_file(result)
        api.remove_file(script)
        if undo is not None:
            undo()


def run_rows(api: WinApi, chosen: tuple[ProbeBody, ...], warn: Callable[[str], None]) -> list[tuple[str, Verdict]]:
    workdir = ntpath.join(api.local_appdata(), f"sandgate-verify-{uuid.uuid4().hex[:8]}")
    api.make_dir(workdir)  # a scratch workspace: the probes write only here
    try:
        return [(b.name, run_body(api, b, workdir, warn)) for b in chosen]
    finally:
        if not api.remove_empty_dir(workdir):  # an attack that worked and could not be undone stays there
            warn(f"{workdir} is not empty: look at what a probe left there, then remove it")


def report(rows: list[tuple[str, Verdict]], missing: int, out: Callable[[str], None]) -> int:
    for name, v in rows:
        out(f"  {'ok  ' if v.ok else 'GAP ' if v.gap else 'FAIL'}  {name:<20} {v.detail}")
    failed, gaps = _failed(rows), sum(not v.ok and v.gap for _, v in rows)
    out(
        f"{len(rows) - failed - gaps} passed, {failed} failed, {gaps} known gaps (docs/windows.md, 'Known gaps'); "
        f"{missing} probes of the shared list have no Windows body yet (docs/windows.md, 'sandgate verify on Windows')"
    )
    return 1 if failed else 0


def _failed(rows: list[tuple[str, Verdict]]) -> int:
    """Rows that did not behave as expected and are no documented gap: what the exit code counts."""
    return sum(not v.ok and not v.gap for _, v in rows)


def main(
    policy: tuple[str, ...] = (), as_json: bool = False, only: str | None = None, api: WinApi | None = None
) -> int:
    if policy:
        raise UsageError("--policy is not used by 'sandgate verify' on Windows yet; run it without --policy")
    api = api or runner.make_api()
    found = allbodies.bodies()
    chosen = select(only, found)
    if not chosen:
        names = ", ".join(b.name for b in found)
        raise UsageError(f"--only {only}: no Windows probe body of that name or group (written: {names})")
    written = {b.name for b in found}
    missing = sum(1 for n, (cov, _) in probes.PROBES.items() if cov == "variant" and n not in written)
    missing += sum(1 for n in probes.WINDOWS_ONLY if n not in written)
    try:
        rows = run_rows(api, chosen, lambda line: print(f"sandgate: {line}", file=sys.stderr))
    except WinApiError as e:
        raise UsageError(str(e)) from None
    if as_json:
        doc = {"rows": [{"name": n, "ok": v.ok, "gap": v.gap, "detail": v.detail} for n, v in rows], "missing": missing}
        print(json.dumps(doc, indent=2))
        return 1 if _failed(rows) else 0
    return report(rows, missing, print)
