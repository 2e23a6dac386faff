"""A cache of parsed policy documents, keyed by their exact text.

Only for speed (every run parses the bundled lists). It lives in sandgate's runtime
directory, which the sandbox can neither see nor write: a sandbox able to write this cache
could widen its own next policy. Keyed by the SHA-256 of the text, so a hit is always the
same document; anything odd (unreadable, malformed, a type JSON cannot hold) is a miss.
Only documents that validated as policies are stored (launcher.config.load calls
yamlfile.remember once a file's sections parsed): a hostile `include: /etc/shadow` is parsed,
then refused, and no file of sandgate's may keep what it read. Entries of sandgates before that
rule (named without SUFFIX) may hold any parsed text: the next store removes them.

A hosts_file's names are kept the same way (HOSTS_SUFFIX), once they all validated: a list of
10^5 names then costs a run one JSON load instead of 10^5 checks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config.hostilefile import digest
from launcher.config.locs import LocDict, LocList

if TYPE_CHECKING:
    from netguard.hostsfile import HostsList

MISS = object()
CACHE_DIR: Path | None = None  # set by the run path (launcher/cli.py); None: no cache
SUFFIX = ".policy.json"
_HITS: set[Path] = set()  # entries read by this process
HOSTS_SUFFIX = ".hosts.json"


def _cache_file(text: str, suffix: str = SUFFIX) -> Path | None:
    if CACHE_DIR is None:
        return None
    return CACHE_DIR / f"{digest(text.encode())}{suffix}"


def get(text: str) -> Any:
    """The document stored for `text`, or MISS."""
    path = _cache_file(text)
    if path is None:
        return MISS
    try:
        doc = _decode(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
        return MISS
    _HITS.add(path)
    return doc


def get_hosts(text: str, where: str) -> HostsList | None:
    """The names stored for a hosts file's `text` (named `where` in origins), or None."""
    path = _cache_file(text, HOSTS_SUFFIX)
    if path is None:
        return None
    from netguard.hostsfile import HostsList

    try:
        lines, names, wild = json.loads(path.read_bytes())
        if not (len(lines) == len(names) == len(wild)):
            return None
        return HostsList(where, tuple(lines), tuple(names), tuple(map(bool, wild)))
    except (OSError, ValueError, TypeError, RecursionError):
        return None


def put_hosts(text: str, listed: HostsList) -> None:
    """Store a validated hosts file's names; a failure costs only the next run's parse."""
    _store(_cache_file(text, HOSTS_SUFFIX), lambda: [listed.lines, listed.names, [int(w) for w in listed.wildcard]])


def put(text: str, doc: Any) -> None:
    """Store `doc` for `text`; a failure costs only the next run's parse."""
    path = _cache_file(text)
    if path not in _HITS:  # a hit is already stored: writing 10^5 entries again would cost ~0.5 s a run
        _store(path, lambda: _encode(doc))


def _store(path: Path | None, make: Any) -> None:
    if path is None:
        return
    try:
        data = json.dumps(make()).encode()
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        tmp.replace(path)
        _drop_legacy(path.parent)
    except (OSError, TypeError, ValueError, RecursionError):
        pass


def _drop_legacy(cache: Path) -> None:
    """Remove entries an older sandgate stored before validation (they may quote any file it parsed)."""
    with os.scandir(cache) as entries:
        old = [e.path for e in entries if e.name.endswith(".json") and not e.name.endswith((SUFFIX, HOSTS_SUFFIX))]
    for path in old:
        os.unlink(path)


def _encode(v: Any) -> Any:
    if isinstance(v, LocDict):
        return {"m": [[k, _encode(x), v.lines.get(k)] for k, x in v.items()], "l": v.line}
    if isinstance(v, LocList):
        return {"s": [_encode(x) for x in v], "l": v.line, "ls": [v.lines.get(i) for i in range(len(v))]}
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise TypeError(f"not cacheable: {type(v).__name__}")  # e.g. a YAML timestamp


def _decode(v: Any) -> Any:
    """A stored document; every JSON object in an entry is one of _encode's (user text is only strings)."""
    return json.loads(v, object_hook=_hook) if isinstance(v, (bytes, str)) else v


def _hook(v: dict[str, Any]) -> Any:
    """One LocDict or LocList, built as json parses (no second walk over 10^5 entries)."""
    if "m" in v:
        d = LocDict()
        d.line, d.lines = v["l"], {}
        for k, x, line in v["m"]:
            d[k] = x
            d.lines[k] = line
        return d
    lst = LocList(v["s"])
    lst.line, lst.lines = v["l"], dict(enumerate(v["ls"]))
    return lst
