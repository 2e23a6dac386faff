"""What verify stages for one pass before the run, and reads back after it: the review probes' outside half.

Run OUTSIDE by verify, never inside: credential files in the fake home, secrets in sandgate's
environment, the audit log inside the workspace. After each pass the host is read back (a git
indirection file or editor config created or changed, a forged or damaged audit log), so a
blocked row is judged by the probe AND by what the host shows.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from selftest import markers
from selftest.probes.credentials import CRED_FILES, ENV_SECRETS, HOME_CONTROL, PLAIN_ENV
from selftest.probes.filesystem import AUDIT_NAME
from selftest.probes.workspace import GIT_TARGETS, TOOL_TARGETS


def _state(path: Path) -> str:
    """What a path is on the host: missing, a directory (with its entries), or a file (its digest)."""
    if not os.path.lexists(path):
        return "missing"
    if path.is_symlink():
        return f"symlink to {os.readlink(path)}"
    if path.is_dir():
        return f"directory {sorted(os.listdir(path))}"
    return f"file sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"


@dataclass
class Staged:
    """What verify stages for one pass before the run, and reads back after it."""

    ws: Path
    home: Path
    token: str
    before: dict[str, dict[Path, str]]

    @classmethod
    def stage(cls, ws: Path, home: Path, token: str, uid: int, gid: int) -> Staged:
        cred = f"sgcred{token}"
        (home / ".npmrc").write_text(f"//registry.npmjs.org/:_authToken={cred}\n")
        (home / ".pypirc").write_text(f"[pypi]\nusername = __token__\npassword = {cred}\n")
        (home / ".git-credentials").write_text(f"https://verify:{cred}@git.verify.test\n")
        (home / HOME_CONTROL).write_text(f"plain-{token}\n")
        audit = ws / AUDIT_NAME
        audit.touch()  # the pass's own file (only sandgate, never its mode, may keep the command out)
        for path in (*(home / n for n in (*CRED_FILES, HOME_CONTROL)), audit):
            os.lchown(path, uid, gid)
            path.chmod(0o644)
        before = {
            "git_indirection": {ws / ".git" / t: "" for t in GIT_TARGETS},
            "tool_configs": {ws / t: "" for t in TOOL_TARGETS},
        }
        for paths in before.values():
            for path in paths:
                paths[path] = _state(path)
        return cls(ws, home, token, before)

    @property
    def audit_log(self) -> Path:
        return self.ws / AUDIT_NAME

    @property
    def cred_marker(self) -> str:
        """The secret in the credential files."""
        return f"sgcred{self.token}"

    @property
    def home_control(self) -> str:
        """The text of the home's control file: readable inside, so a hidden secret is the sandbox's doing."""
        return f"plain-{self.token}"

    @property
    def env_marker(self) -> str:
        """The secret in sandgate's environment, under the names of ENV_SECRETS."""
        return f"sgenv{self.token}"

    @property
    def plain_env(self) -> str:
        """The control variable, as /proc/self/environ spells it."""
        return f"{PLAIN_ENV}={self.home_control}"

    def env(self) -> dict[str, str]:
        secret = self.env_marker
        env = {name: f"{secret}-{name.lower()}" for name in ENV_SECRETS}
        env["DATABASE_URL"] = f"postgres://u:{secret}@h/db"
        return {**env, PLAIN_ENV: self.home_control}

    def controls(self) -> None:
        """Outside, the credential files hold the secret: so a clean read inside is the sandbox's doing."""
        for name in CRED_FILES:
            if self.cred_marker not in (self.home / name).read_text():
                raise OSError(f"{self.home / name} does not hold the secret outside")

    def evidence(self) -> dict[tuple[str, str], str]:
        """{(probe, "*"): what the host shows} after one pass; empty if the host is untouched."""
        found: dict[tuple[str, str], str] = {}
        for probe_name, paths in self.before.items():
            changed = [
                f"{p.relative_to(self.ws)}: {was} -> {now}" for p, was in paths.items() if (now := _state(p)) != was
            ]
            if changed:
                found[probe_name, "*"] = "; ".join(changed)
        if why := self._audit_damage():
            found["audit_log_forge", "*"] = why
        return found

    def _audit_damage(self) -> str:
        log = self.audit_log
        moved = sorted(p.name for p in self.ws.glob(f"{AUDIT_NAME}.moved-*"))
        if moved:
            return f"the audit log was renamed: {', '.join(moved)}"
        if not log.is_file():
            return f"the audit log {log.name} is gone"
        lines = log.read_text(errors="replace").splitlines()
        if not lines:
            return "the audit log is empty (truncated)"
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                return f"line {n} of the audit log does not parse: {line[:120]!r}"
            if n == 1 and rec.get("event") != "policy":
                return f"the audit log no longer starts with the run's policy record: {line[:120]!r}"
            if markers.probe_trace("audit_log_forge") in line or "forged" in rec:
                return f"line {n} of the audit log was forged: {line[:160]!r}"
        return ""
