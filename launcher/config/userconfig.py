"""The user's own defaults: `$XDG_CONFIG_HOME/sandgate/config.yaml` (else `~/.config/sandgate/config.yaml`),
and the user's state directory beside it (`state_dir`: the trust list, the audit logs).

The same format as a policy file, applied to every run, proxy and explain without `sandgate trust`:
the user wrote it. Precedence (README/docs): the command line > a workspace `.sandgate.yaml` > this
file > the built-in defaults. Lists (allow, deny, ask, read_deny, write, env keep/drop...) add up,
and deny beats allow whichever file either came from, so a default here can never undo a deny given
on the command line or in the workspace; a single value this file shares with a higher source (the
resolver, the credential for one host and header) is the higher source's.

Under `sudo sandgate`, the invoking user's file (SUDO_UID's home, as the credential files and the
`--user` default already follow the sudo caller), never root's. The threat this file adds: someone
else editing it to loosen your policy. So it (and the directory holding it) must be yours (or
root's) and writable by nobody else, else the run is refused in one line.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.errors import UsageError
from netguard.policy import NetworkPolicy

FILE_NAME = "config.yaml"
MAX_BYTES = 4 << 20  # as any policy file (launcher/config/yamlfile.py)


def _sudo_uid(environ: Mapping[str, str], euid: int) -> int | None:
    sudo = environ.get("SUDO_UID", "") if euid == 0 else ""
    return int(sudo) if sudo.isdigit() and sudo != "0" else None


def path(environ: Mapping[str, str] = os.environ, euid: int | None = None) -> Path | None:
    """Where the user's defaults live; None when the sudo caller has no account (nothing to read)."""
    if euid is None:  # Windows has no euid and no sudo: the file in the user's own profile (issue 28, win-py P2)
        euid = os.geteuid() if sys.platform != "win32" else -1
    sudo = _sudo_uid(environ, euid)
    if sudo is not None:  # root via sudo: the invoking user's file; their XDG variables are not ours to trust
        import pwd

        try:
            return Path(pwd.getpwuid(sudo).pw_dir) / ".config" / "sandgate" / FILE_NAME
        except KeyError:
            return None
    xdg = environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".config"
    return base / "sandgate" / FILE_NAME


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_STATE_HOME/sandgate, else ~/.local/state/sandgate (a relative XDG value is ignored, as the spec says):
    the user's trust list (launcher/config/trust.py) and audit logs, beside their defaults' directory."""
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".local" / "state"
    return base / "sandgate"


def find(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The file, when there is one (one lstat: a run without it reads and imports nothing more)."""
    p = path(environ)
    return p if p is not None and os.path.lexists(p) else None


def owners(environ: Mapping[str, str] = os.environ, euid: int | None = None) -> frozenset[int]:
    """Who may own it: whoever runs sandgate, and root; under sudo also the sudo caller."""
    euid = os.geteuid() if euid is None else euid
    sudo = _sudo_uid(environ, euid)
    return frozenset({euid, 0, *((sudo,) if sudo is not None else ())})


def unsafe(st: os.stat_result, allowed: frozenset[int]) -> str | None:
    """Why a file or directory with this stat could be changed by someone else; None when it cannot."""
    if st.st_uid not in allowed:
        return f"is owned by uid {st.st_uid}, not by you; chown it to yourself"
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0):
        return "is writable by group or others, who could loosen your policy; chmod go-w it"
    return None


def read(p: Path, allowed: frozenset[int] | None = None) -> bytes:
    """Its bytes, after checking that nobody else could have written them; UsageError in one line."""
    if sys.platform == "win32":  # st_uid and the mode bits say nothing there: no honest owner check yet
        raise UsageError(f"user config {p} is not read on Windows yet; move its rules into a --policy file")
    allowed = owners() if allowed is None else allowed
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"user config {p} cannot be read: {e.strerror}; fix or remove it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"user config {p} is not a regular file; a policy is a YAML file")
        if (why := unsafe(st, allowed)) is not None:
            raise UsageError(f"user config {p} {why}")
        folder = os.path.dirname(os.path.realpath(p))  # whoever may write here may replace the file
        if (why := unsafe(os.stat(folder), allowed)) is not None:
            raise UsageError(f"user config {p}: its directory {folder} {why}")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise UsageError(f"user config {p} is larger than {MAX_BYTES >> 20} MiB; a policy is a few kilobytes")
    return data


def below(user: NetworkPolicy, others: Sequence[NetworkPolicy]) -> NetworkPolicy:
    """The user's network section under everything else (pure): its resolver and its credentials yield
    to a higher source's for the same host and header; its rules stay, and deny still beats allow."""
    taken = {(c.host, c.header.lower()) for o in others for c in o.credentials}
    has_resolver = any(o.resolver is not None for o in others)
    return NetworkPolicy(
        allow=user.allow,
        deny=user.deny,
        ask=user.ask,
        resolver=None if has_resolver else user.resolver,
        resolver_origin=None if has_resolver else user.resolver_origin,
        credentials=tuple(c for c in user.credentials if (c.host, c.header.lower()) not in taken),
    )
