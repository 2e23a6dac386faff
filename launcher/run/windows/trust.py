"""The run's inspection CA, trusted by CMD on Windows (session 38, r2-user U2), pure.

Why: with an `inspect: true` host the proxy child signs that host's certificates with a per-run CA
whose certificate it writes to `--ca-cert`. By default that is next to the audit log, inside
sandgate's own folder, which every run's ACL plan denies the sandbox user (journals, the sealed
password, the audit logs), and no variable told CMD's TLS clients about it: every connection to an
inspected host failed verification. Windows keeps its roots in a certificate store, not in a PEM
file a variable could extend, so the bundle is the machine's roots (read by the real user:
`ssl.enum_certificates`), the bundles the real user's own variables name (a corporate root), and the
run's CA, written into a per-run folder outside `sandgate\\` that the plan grants the sandbox user
read on; the bundle variables (trustpaths.BUNDLE_VARIABLES, as on Linux) point at it. The CA's
private key never leaves the proxy's memory; the folder is removed at teardown.
"""

from __future__ import annotations

import ntpath
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from launcher.run.trustpaths import BUNDLE_VARIABLES
from sgbase.windows.api import WinApiError

if TYPE_CHECKING:
    from launcher.run.windows.winapi import WinApi

CA_FILE = "ca.pem"  # the proxy's --ca-cert (the certificate only)
BUNDLE_FILE = "ca-bundle.pem"  # what the variables name
_CERT = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


def folder(appdata: str, task: str) -> str:
    """The run's trust folder: beside `sandgate\\` (whose read-deny would cover it), never inside it."""
    return ntpath.join(appdata, f"sandgate-trust-{task}")


def certificates(text: str) -> list[str]:
    """The PEM certificate blocks of `text`, nothing else (a combined file's private key stays out)."""
    return [c + "\n" for c in _CERT.findall(text)]


def bundle(roots: Iterable[str], extra: Iterable[str], ca: str) -> str:
    """The machine's roots, the real user's own bundles' certificates, then the run's CA; each once."""
    blocks = [*(c for r in roots for c in certificates(r)), *(c for e in extra for c in certificates(e))]
    blocks = list(dict.fromkeys(blocks))
    return "".join([*blocks, "# sandgate: this run's inspection CA\n", *certificates(ca)])


def user_bundles(env: Mapping[str, str]) -> list[str]:
    """The files the real user's bundle variables name (read by the real user: they may lie in its profile)."""
    names = {v.casefold() for v in BUNDLE_VARIABLES}
    return list(dict.fromkeys(v for k, v in env.items() if k.casefold() in names and v))


def env(bundle_path: str) -> tuple[tuple[str, str], ...]:
    return tuple((v, bundle_path) for v in BUNDLE_VARIABLES)


# ---- effects, through the WinApi (the backend's order: folder -> plan -> proxy -> bundle -> ACLs) ----


def make_folder(api: WinApi, appdata: str, task: str) -> str:
    """Before the plan, so its read grant finds the folder (the grant is inheritable: what the proxy
    and install() write into it later is readable too)."""
    where = folder(appdata, task)
    api.make_dir(where)
    return where


def _text(api: WinApi, path: str) -> str:
    try:
        return (api.read_file(path) or b"").decode("ascii", errors="replace")
    except WinApiError:
        return ""  # a bundle the real user cannot read either: nothing to add


def install(api: WinApi, where: str, environ: Mapping[str, str]) -> str:
    """After the proxy is ready (it wrote CA_FILE): the bundle written; its path."""
    ca = _text(api, ntpath.join(where, CA_FILE))
    if not certificates(ca):
        raise WinApiError(f"the proxy wrote no CA certificate to {ntpath.join(where, CA_FILE)}; run again")
    path = ntpath.join(where, BUNDLE_FILE)
    api.write_file(path, bundle(api.system_roots(), [_text(api, p) for p in user_bundles(environ)], ca).encode())
    return path


def remove(api: WinApi, where: str) -> None:
    """At teardown, after the ACLs are back and the proxy is stopped."""
    for name in (BUNDLE_FILE, CA_FILE):
        api.remove_file(ntpath.join(where, name))
    api.remove_empty_dir(where)
