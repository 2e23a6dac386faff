"""The run's inspection CA, and the trust the sandbox gets in it (issue 13).

Only a policy that inspects (an allow entry with `inspect:`/`http:`) or binds a credential needs
any of this; every other run never imports `cryptography` (a fast start matters).

The CA is generated in memory for this run (EC P-256) and its private key goes to the daemon in
the spec only: never to disk, never into the sandbox. It is name-constrained to the inspected
names, so a CA that leaked or was misused cannot sign for any other host (nor any IP address).
The sandbox trusts it through one combined bundle (the host's roots + the CA + bundles the
caller's environment already named) bound read-only over every system bundle path and named by
the variables real tools read.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import RunError
from launcher.run.trustpaths import BUNDLE_VARIABLES, SYSTEM_BUNDLES
from netguard.policy import NetworkPolicy
from netguard.spec import CaPair

if TYPE_CHECKING:  # imported when used: most runs never inspect
    import datetime

BUNDLE_NAME = "ca-bundle.pem"  # in the run directory, which is hidden inside except for the binds
MAX_BUNDLE = 8 << 20  # bytes of one bundle read from the host: far more than any real one
_CERT_BLOCK = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")
VALID_DAYS = 30
BACKDATE_MINUTES = 5  # a clock inside slightly behind ours still accepts the CA


@dataclass(frozen=True)
class Trust:
    """What the sandbox gets: files bound over system bundles, and the variables naming the bundle."""

    bundle: Path  # the combined bundle in the run directory
    binds: tuple[tuple[str, Path], ...]  # (real host path the inside opens, replacement file)
    env: dict[str, str]


def needed(net: NetworkPolicy) -> bool:
    """Whether this policy terminates any TLS: an inspecting allow entry or a bound credential."""
    return bool(net.credentials) or any(r.inspect for r in net.allow)


def inspected_names(net: NetworkPolicy) -> tuple[str, ...]:
    """The names the CA may sign for: inspecting entries' hosts and wildcard suffixes, credential hosts."""
    names = [r.value for r in net.allow if r.inspect and isinstance(r.value, str)]
    names += [c.host for c in net.credentials]
    return tuple(dict.fromkeys(names))


def new_ca(task: str, names: tuple[str, ...], now: datetime.datetime | None = None) -> CaPair:
    """A fresh CA for one run, in memory, constrained to `names`; the key PEM goes only into the spec
    for the daemon."""
    import datetime

    from netguard import tlscerts

    if not names:
        raise RunError("inspection needs at least one host name to sign for")
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=BACKDATE_MINUTES)
    name = tlscerts.subject("sandgate", f"sandgate inspection CA, task {task}"[: tlscerts.MAX_CN])
    valid = tlscerts.Validity(start, start + datetime.timedelta(days=VALID_DAYS))
    ca = tlscerts.ca(tlscerts.new_key(), name, valid, only=names)
    return CaPair(tlscerts.cert_pem(ca.cert).decode(), tlscerts.key_pem(ca.key).decode())


def system_bundles() -> list[str]:
    """The system bundle paths that exist here, each resolved to the file a reader really opens."""
    return list(dict.fromkeys(os.path.realpath(p) for p in SYSTEM_BUNDLES if os.path.isfile(p)))


def _read_pem(path: str) -> str | None:
    """A bundle file's text, or None when it is no readable regular file of sane size (then it adds nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BUNDLE:
            return None
        text = f.read(MAX_BUNDLE).decode("ascii", errors="replace")
    # Certificates only: a combined PEM (certificate + key) named by a variable must not carry its
    # private key into the sandbox.
    certs = _CERT_BLOCK.findall(text)
    return "".join(c + "\n" for c in certs) if certs else None


def compose_bundle(ca_cert: str, environ: Mapping[str, str], system: list[str]) -> str:
    """The host's roots, the run's CA, and every bundle the caller's variables named (a corporate
    root keeps working inside), each file once."""
    sources = [*system, *(environ[v] for v in BUNDLE_VARIABLES if environ.get(v))]
    parts: list[str] = []
    seen: set[str] = set()
    for path in sources:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        text = _read_pem(real)
        if text is not None:
            parts.append(text)
    parts.append(f"# sandgate: this run's inspection CA\n{ca_cert}")
    return "".join(parts)


def install(run_dir: Path, ca_cert: str, environ: Mapping[str, str]) -> Trust:
    """Write the combined bundle into the run directory and say where the sandbox sees it."""
    system = system_bundles()
    if not system:
        raise RunError(
            f"inspection needs a system CA bundle to extend, and none exists here ({', '.join(SYSTEM_BUNDLES)}); "
            "install your distribution's ca-certificates package"
        )
    bundle = run_dir / BUNDLE_NAME
    fd = os.open(bundle, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o644)  # readable by the command's user: only certificates are in it
        f.write(compose_bundle(ca_cert, environ, system))
    inside = next(p for p in SYSTEM_BUNDLES if os.path.isfile(p))  # the name tools know; it resolves to a bind
    return Trust(bundle, tuple((real, bundle) for real in system), {v: inside for v in BUNDLE_VARIABLES})


def read_upstream_ca(path: str | None) -> str | None:
    """--upstream-ca FILE: PEM roots the daemon trusts for inspected upstreams (a private registry's CA)."""
    if path is None:
        return None
    import base64
    import binascii

    try:
        with open(os.path.expanduser(path), "rb") as f:
            data = f.read(MAX_BUNDLE + 1)
    except OSError as e:
        raise RunError(f"--upstream-ca {path}: {e.strerror}") from None
    text = data.decode("ascii", errors="replace")
    blocks = re.findall(r"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]+?)-----END CERTIFICATE-----", text)
    try:
        ders = [base64.b64decode("".join(b.split()), validate=True) for b in blocks]
    except binascii.Error:
        ders = []
    if len(data) > MAX_BUNDLE or not ders or not all(d[:1] == b"\x30" for d in ders):
        raise RunError(f"--upstream-ca {path}: not a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)")
    import ssl

    return "".join(ssl.DER_cert_to_PEM_cert(d) for d in ders)
