"""Brokered credentials (issue 13): the real secrets for the daemon, sentinels for the sandbox.

For each `network.credentials` entry the launcher reads the secret (the entry's `file:`, else its
${VARIABLE} in the launcher's environment), renders the header the daemon adds, and makes a
per-run sentinel. Inside, the variable holds the sentinel (an SDK that insists on a key still
starts); no other variable may carry the real value, and the credential file is hidden. The real
value lives in the launcher's memory and the spec only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.config.errors import PolicyFileError
from netguard.credentials import Credential, Secret, render, sentinel_for, too_short

MAX_SECRET = 64 << 10  # bytes of a credential file: a token, not a database


@dataclass(frozen=True)
class Brokered:
    """What the credentials give the daemon (secrets), the sandbox (sentinels) and the mounts (files to hide)."""

    secrets: tuple[Secret, ...]
    env: dict[str, str]  # variable -> sentinel
    files: tuple[str, ...]  # credential files, absolute: hidden inside


def _fail(c: Credential, message: str) -> PolicyFileError:
    return PolicyFileError.at(c.origin, message)


def _owners() -> frozenset[int]:
    """Who may own a credential file: the caller (as root: also the sudo caller, whose file it is)."""
    sudo = os.environ.get("SUDO_UID", "") if os.geteuid() == 0 else ""
    return frozenset({os.geteuid(), *((int(sudo),) if sudo.isdigit() else ())})


def read_secret_file(c: Credential, path: str) -> str:
    """The file's content less one trailing newline. Only a regular file the caller owns and nobody
    else may write (the threat: another user swapping the token, or a FIFO that blocks the launch)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise _fail(c, f"credential file {path} for {c.host} cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _fail(c, f"credential file {path} for {c.host} is not a regular file")
        if st.st_uid not in _owners() or st.st_mode & 0o022:
            raise _fail(
                c,
                f"credential file {path} for {c.host} is owned by another user or writable by others; "
                f"chown it to yourself and chmod go-w {path}",
            )
        data = os.read(fd, MAX_SECRET + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET:
        raise _fail(c, f"credential file {path} for {c.host} is larger than {MAX_SECRET >> 10} KiB")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise _fail(c, f"credential file {path} for {c.host} is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text


def _secret(c: Credential, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """(the secret, the file it came from)."""
    path = os.path.expanduser(c.file) if c.file else None
    value = read_secret_file(c, os.path.abspath(path)) if path else environ.get(c.variable, "")
    if not value:
        raise _fail(c, f"credential for {c.host} needs ${c.variable} (set it, or give file:)")
    if any(ch in value for ch in "\r\n\0"):
        raise _fail(c, f"the secret for {c.host} holds a line break or NUL: a header cannot carry it")
    if why := too_short(value):
        raise _fail(c, f"credential ${c.variable} for {c.host}: {why}")
    return value, os.path.abspath(path) if path else None


def resolve(creds: tuple[Credential, ...], environ: Mapping[str, str] = os.environ) -> Brokered:
    """Every credential's secret and sentinel; one `FILE:LINE:` error for the first that cannot be used."""
    import secrets  # here: it loads OpenSSL, which a run without credentials never needs

    out: list[Secret] = []
    sentinels: dict[str, tuple[str, str]] = {}  # variable -> (real, sentinel): one variable holds one sentinel
    files: list[str] = []
    for c in creds:
        real, file = _secret(c, environ)
        files.extend([file] if file else [])
        if c.variable in sentinels and sentinels[c.variable][0] != real:
            raise _fail(c, f"${c.variable} stands for two different secrets; give each credential its own variable")
        _, sentinel = sentinels.setdefault(c.variable, (real, sentinel_for(real, secrets.token_hex(16))))
        out.append(Secret(c.host, c.header, render(c, real), real, sentinel, c.variable, c.origin))
    return Brokered(tuple(out), {v: s for v, (_, s) in sentinels.items()}, tuple(dict.fromkeys(files)))


def apply_env(env: dict[str, str], dropped: list[str], b: Brokered) -> tuple[dict[str, str], list[str]]:
    """The sandbox's environment with each credential variable holding its sentinel (winning over the
    filter that drops secret-looking names) and without any other variable that carries a real value."""
    reals = [s.real for s in b.secrets]
    kept = {k: v for k, v in env.items() if not any(r in v for r in reals)}
    leaked = [k for k in env if k not in kept and k not in b.env]
    kept.update(b.env)
    return kept, sorted({*(d for d in dropped if d not in b.env), *leaked})
