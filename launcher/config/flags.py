"""`--allow` / `--deny` entries from the command line: HOST, HOST:PORT, [V6]:PORT, a CIDR or a pasted URL."""

from __future__ import annotations

from typing import Any

from launcher.config.bundled import bundled_names
from launcher.config.errors import PolicyFileError
from launcher.errors import UsageError
from netguard import policy as netpolicy
from netguard.hosts import split_host_port
from sgbase.policyerror import PolicyError

_SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "git": 9418, "ssh": 22, "ftp": 21}


def _url_host_port(url: str, where: str) -> str:
    """`https://pypi.org/simple` -> `pypi.org:443`; a path, query or user part is dropped."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        port = _SCHEME_PORTS.get(u.scheme.lower()) if u.port is None else u.port
        if port == 0:
            raise ValueError("port 0 is not a destination")
    except ValueError as e:
        raise PolicyFileError(where, None, f"not a usable URL ({e}); use HOST or HOST:PORT") from None
    if not u.hostname or port is None:
        raise PolicyFileError(
            where, None, "a URL needs a host and a known scheme or an explicit port; use HOST or HOST:PORT"
        )
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{host}:{port}"


def unknown_list(name: str) -> str:
    """The one line for a name that is no bundled list: the closest one, else every one."""
    from launcher import didyoumean

    names = bundled_names()
    if guess := didyoumean.guess(name, names):
        return f"no bundled list '{name}'; did you mean '{guess}'? ('sandgate allowlists' lists them)"
    return f"no bundled list '{name}' ({', '.join(names)}), and not a host name with a dot"


def flag_entry(ref: str, which: str) -> netpolicy.NetworkPolicy:
    """`--allow HOST[:PORT]` / `--deny HOST[:PORT]` as a one-entry network section."""
    where = f"--{which} {ref}"
    if "://" in ref:  # a URL (what people paste): its host, and its port or the scheme's
        ref = _url_host_port(ref, where)
    host, port = split_host_port(ref)
    entry: dict[str, Any] = {"host": host}
    if port is not None:
        if not port.isdigit():
            raise PolicyFileError(where, None, f"invalid port '{port}'; use HOST or HOST:PORT")
        entry["ports"] = [int(port)]
    if "/" in host:
        entry = {"cidr": host, **({"ports": entry["ports"]} if "ports" in entry else {})}
    if which == "allow" and "." not in host and ":" not in host and "/" not in host:
        raise UsageError(unknown_list(ref))
    try:
        return netpolicy.parse_network({which: [entry]}, "command line")
    except PolicyError as e:
        raise PolicyFileError.of(where, e) from None
