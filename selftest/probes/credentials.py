"""The secrets probes: keys and credential files in the home, secrets in the environment (under the
names v1 knew and those it missed)."""

from __future__ import annotations

import os
from pathlib import Path

from selftest.probes.core import Ctx, Result, Unsupported, attempt, combine, probe

#: Secret names v1's patterns missed, and a lower-case one; DATABASE_URL carries it in a URL.
ENV_SECRETS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "openai_api_key")
PLAIN_ENV = "SANDGATE_VERIFY_PLAIN"
CRED_FILES = (".npmrc", ".pypirc", ".git-credentials")
HOME_CONTROL = "verify-notes.txt"


@probe("filesystem", "read_ssh_key", "blocked")
def read_ssh_key(c: Ctx) -> Result:
    """Reading secrets in the home directory (SSH keys) to exfiltrate them."""
    key = Path(c.spec.home) / ".ssh" / "id_ed25519"
    try:
        data = key.read_text(errors="replace")
    except FileNotFoundError:
        return "blocked", f"{key} does not exist here (hidden)"
    if c.spec.secret_marker in data:
        return "permitted", f"read the secret from {key}"
    return "blocked", f"{key} readable but without the secret ({len(data)} chars)"


@probe("filesystem", "secret_env", "blocked")
def secret_env(c: Ctx) -> Result:
    """Secrets inherited through the environment (tokens, passwords)."""
    name = c.spec.secret_env
    if name in os.environ:
        return "permitted", f"{name} is set ({len(os.environ[name])} chars)"
    return "blocked", f"{name} is absent"


@probe("filesystem", "credential_files", "blocked")
def credential_files(c: Ctx) -> Result:
    """Reading registry and git credentials in the home (~/.npmrc, ~/.pypirc, ~/.git-credentials)."""
    home, secret = Path(c.spec.home), c.spec.cred_marker
    control = home / HOME_CONTROL
    try:
        if c.spec.home_control not in control.read_text(errors="replace"):
            raise Unsupported(f"{control} is readable but without its text: cannot tell")
    except OSError as e:
        raise Unsupported(f"the control file {control} is not readable here, cannot tell: {e}") from e
    parts = []
    for name in CRED_FILES:
        path = home / name
        try:
            data = path.read_text(errors="replace")
        except FileNotFoundError:
            parts.append((name, ("blocked", "does not exist here (hidden)")))
            continue
        except OSError as e:
            parts.append((name, attempt(_raise, e)))
            continue
        parts.append(
            (
                name,
                ("permitted", "read the secret")
                if secret in data
                else ("blocked", f"readable but without the secret ({len(data)} chars)"),
            )
        )
    return combine(parts, need="any")


def _raise(e: BaseException) -> Result:
    raise e


@probe("filesystem", "env_secret_names", "blocked")
def env_secret_names(c: Ctx) -> Result:
    """Secrets under names v1 missed (OPENAI_API_KEY, PGPASSWORD, MYSQL_PWD, DATABASE_URL with a password, lower case)."""
    secret, plain = c.spec.env_marker.encode(), c.spec.plain_env.encode()
    if plain not in Path("/proc/self/environ").read_bytes():
        raise Unsupported(f"the control variable {PLAIN_ENV} is missing from /proc/self/environ: cannot tell")
    names = [k for k, v in os.environ.items() if c.spec.env_marker in v]
    if names:
        return "permitted", f"set here: {', '.join(sorted(names))}"
    holders, readable = [], 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        readable += 1
        if secret in data:
            holders.append(pid)
    if holders:
        return "permitted", f"a secret is in the environment of pid(s) {', '.join(sorted(holders, key=int))}"
    return "blocked", f"none of {', '.join(ENV_SECRETS)} here; {readable} environ files, none holds a secret"
