"""Reading the `hosts_file:` entries of one policy file: the I/O half of netguard.hostsfile.

A hosts file is named relative to the policy that names it (or absolute, or `~/...`). It is read by
the launcher, which runs with the user's rights, so a path outside the policy's directory or a
symlink reads only what the user could read anyway; never by the daemon. Like an include it must
be a regular file (no FIFO to block on, no device), it is bounded in size, it passes the same check
as a file include (a trusted workspace policy's hosts file must be trusted too: otherwise a checkout
could widen its allow list after `sandgate trust`), and it is recorded among the files the run keeps
read-only inside the sandbox (a run must not rewrite what configures the next one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config import hostilefile, parsecache
from launcher.config.bundled import display
from launcher.config.errors import PolicyFileError
from sgbase.policyerror import PolicyError, line_of

if TYPE_CHECKING:
    from netguard.hostsfile import HostsList

#: Why a file may not be used, or None (launcher.config.load.IncludeCheck).
Check = Callable[[Path, bytes], "str | None"]


def entries(network: Any) -> list[tuple[str, int | None]]:
    """Each `hosts_file:` value (a string) of a `network:` mapping, with its line; the rest is netguard.policy's."""
    if not isinstance(network, dict):
        return []
    found = []
    for name in ("allow", "deny", "ask"):
        items = network.get(name)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if isinstance(item, dict) and isinstance(item.get("hosts_file"), str) and item["hosts_file"]:
                found.append((item["hosts_file"], line_of(item, "hosts_file") or line_of(items, i)))
    return found


def read_all(network: Any, policy: Path, where: str, check: Check | None, read: list[Path]) -> dict[str, HostsList]:
    """Every hosts file `network` names, read and parsed; each path is appended to `read`."""
    out: dict[str, HostsList] = {}
    for written, line in entries(network):
        if written not in out:
            out[written] = read_one(written, line, policy, where, check, read)
    return out


def read_one(
    written: str, line: int | None, policy: Path, where: str, check: Check | None, read: list[Path]
) -> HostsList:
    """One hosts file; PolicyFileError at the policy's line when it cannot be read, at its own line when a name is bad."""
    from netguard import hostsfile  # only policies with a hosts_file pay for it

    target = Path(written).expanduser()
    target = target if target.is_absolute() else policy.parent / target
    try:
        data = hostilefile.read_file(target, hostsfile.MAX_BYTES)
    except hostilefile.Unreadable as e:
        why = str(e).partition(";")[0]  # its advice is about policy files
        if why.startswith("no such file"):
            why = f"no such file {target}; a relative path starts at the policy file's directory"
        elif why.startswith("larger than"):
            why = f"{why}, the most a hosts_file may hold; split the list or use '*.suffix' lines"
        elif why.startswith("not a regular file"):
            why = f"{why}; name a text file of host names"
        raise PolicyFileError(where, line, f"hosts_file '{written}' cannot be used: {why}") from None
    problem = check(target, data) if check is not None else None
    if problem:
        raise PolicyFileError(where, line, f"hosts_file '{written}' {problem}")
    named = display(target)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyFileError(
            named, data.count(b"\n", 0, e.start) + 1, "not UTF-8 text; save the list as UTF-8"
        ) from None
    listed = parsecache.get_hosts(text, named)
    if listed is None:
        try:
            listed = hostsfile.parse_hosts_text(text, named)
        except PolicyError as e:
            raise PolicyFileError(named, e.line, str(e)) from None
        parsecache.put_hosts(text, listed)  # only now: nothing of a file that is no list of names is kept
    read.append(target.absolute())
    return listed
