r"""`sandgate verify` on Windows: the ACL boundary's probe bodies (issue 28, H2), one row each:
`.git` renamed away, alternate data streams, `.GiT` case variants, 8.3 short names.

The bodies are aclprobes.py's checks (each attack paired with the permitted action it mirrors,
an attack that works undone at once) run as the sandbox user with win32probefs.OsFsOps. The
script carries their source rather than importing sandgate: the sandbox user may not be able to
read the real user's site-packages, and a body that cannot start must fail, never pass.
`prepare` makes the repository the probes attack BEFORE the run (the ACL plan protects the
`.git` that exists when the run starts: a repository made inside is the task's own).
"""

from __future__ import annotations

import inspect
import ntpath
import types
from collections.abc import Callable
from typing import Any

from launcher.run.windows.winapi import WinApi
from selftest.windows import aclprobes, win32probefs
from selftest.windows.probebody import RESULT, ProbeBody, Verdict

NAMES = ("git_rename", "alternate_data_stream", "case_variant", "short_name")


def _source(module: types.ModuleType) -> str:
    lines = inspect.getsource(module).splitlines()
    return "\n".join(line for line in lines if line != "from __future__ import annotations")


SCRIPT = (
    "from __future__ import annotations\n"
    + _source(aclprobes)
    + "\n"
    + _source(win32probefs)
    + f"""
import json, os, sys
_want = sys.argv[-1]
_got = [r for r in probe_all(os.getcwd(), OsFsOps()) if r.name in (_want, "acl_probes")]
with open({RESULT!r}, "w") as _f:
    json.dump({{"probes": [{{"name": r.name, "ok": r.ok, "lines": r.lines}} for r in _got]}}, _f)
"""
)

#: The repository the probes attack: a git directory as git knows one (HEAD), with the config and
#: hooks the plan protects; made by sandgate (the real user) before the run, removed after it.
REPO_DIRS = (".git", ".git\\hooks", ".git\\objects", ".git\\refs")
REPO_FILES = ((".git\\HEAD", b"ref: refs/heads/main\n"), (".git\\config", b"[core]\n\tbare = false\n"))


def prepare(api: WinApi, workdir: str) -> Callable[[], None]:
    """Make the repository in the scratch workspace; returns what removes it (what the real user
    can remove: an attack that worked and was not undone stays, and the row says so)."""
    for d in REPO_DIRS:
        api.make_dir(ntpath.join(workdir, d))
    for f, data in REPO_FILES:
        api.write_file(ntpath.join(workdir, f), data)

    def remove() -> None:
        for f, _ in REPO_FILES:
            api.remove_file(ntpath.join(workdir, f))
        for d in reversed(REPO_DIRS):
            api.remove_empty_dir(ntpath.join(workdir, d))

    return remove


def _judge(name: str) -> Callable[[int, dict[str, Any] | None], Verdict]:
    def judge(code: int, got: dict[str, Any] | None) -> Verdict:
        rows = got.get("probes") if got else None
        rows = rows if isinstance(rows, list) else []
        row = next((r for r in rows if isinstance(r, dict) and r.get("name") in (name, "acl_probes")), None)
        if row is None:
            return Verdict(False, f"the probe wrote no result (exit {code}): it did not run")
        lines = [str(x) for x in row.get("lines", [])]
        return Verdict(row.get("ok") is True and row.get("name") == name, "; ".join(lines) or "no checks ran")

    return judge


BODIES = tuple(ProbeBody(n, "filesystem", SCRIPT, _judge(n), prepare) for n in NAMES)
