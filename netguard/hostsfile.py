"""The text of a `hosts_file:` (one host name or `*.suffix` per line) as validated names. Pure.

A policy entry `- hosts_file: PATH` stands for a long list (an enterprise allowlist, a threat feed)
that would be unwieldy as YAML. The launcher's loader (launcher.config.hostsfiles) reads the file
with the user's rights and hands its text here; netguard.policy turns the names into rules, each
with the origin "FILE:LINE" of its own line so an audit record points at it.

No message here quotes the file: a policy may name any file the user can read (a hostile checkout's
policy could name a key), and until it proves to be a list of names nothing from it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from netguard import hosts
from sgbase.policyerror import PolicyError

#: Names in one policy, every hosts_file and entry together: each costs the daemon a few hundred bytes.
MAX_NAMES = 1_000_000
#: Bytes of one hosts file: a million names of ~30 characters, with room for comments.
MAX_BYTES = 64 << 20

HOW = "a hosts_file holds one host name or '*.suffix' per line ('#' starts a comment); fix or remove that line"


@dataclass(frozen=True)
class HostsList:
    """A hosts file's names in file order, first occurrence only: canonical names and wildcard suffixes."""

    where: str  # the file as rule origins name it
    lines: tuple[int, ...]  # 1-based line of each name
    names: tuple[str, ...]  # canonical: an exact name, or the suffix of a wildcard (without "*.")
    wildcard: tuple[bool, ...]


def parse_hosts_text(text: str, where: str) -> HostsList:
    """Every name of `text`; PolicyError(line=N) for the first line that is not one (N of this file)."""
    lines: list[int] = []
    names: list[str] = []
    wild: list[bool] = []
    seen: set[tuple[bool, str]] = set()
    for number, raw in enumerate(text.split("\n"), 1):
        item = raw.partition("#")[0].strip()
        if not item:
            continue
        wildcard, name = _name(item, number)
        if (wildcard, name) in seen:
            continue  # a repeated line adds nothing: its first occurrence decides and is reported
        seen.add((wildcard, name))
        if len(names) >= MAX_NAMES:
            raise PolicyError(f"more than {MAX_NAMES:,} names; split the list or use '*.suffix' lines", number)
        lines.append(number)
        names.append(name)
        wild.append(wildcard)
    return HostsList(where, tuple(lines), tuple(names), tuple(wild))


def _name(item: str, number: int) -> tuple[bool, str]:
    """(is a wildcard, canonical name or suffix) of one stripped line."""
    if " " in item or "\t" in item:  # other blanks: hosts.normalise refuses them
        raise PolicyError(f"two words on one line; {HOW}", number)
    wildcard = item.startswith("*.")
    body = item[2:] if wildcard else item
    if not body or "*" in body:
        raise PolicyError(f"'*' may only be the whole first label ('*.example.org'); {HOW}", number)
    try:
        name = hosts.normalise(body)
    except hosts.HostError:
        raise PolicyError(f"not a valid host name; {HOW}", number) from None
    if not isinstance(name, str):
        raise PolicyError("an IP address: a hosts_file lists names; put addresses in 'cidr:' entries", number)
    return wildcard, name
