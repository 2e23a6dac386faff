"""The effective policy of a run: --policy files, their includes, a workspace file and --allow/--deny.

No enforcement here: each section goes to the guard that owns it (`network:` to netguard.policy,
`filesystem:` and `env:` to fsguard.policy). Every user mistake becomes a PolicyFileError naming
FILE:LINE. Files are read through launcher.config.yamlfile, which bounds what hostile input costs;
here the number of files and how deep includes nest are bounded too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fsguard import policy as fspolicy
from fsguard.env import EnvPolicy
from launcher.config import hostilefile, hostsfiles, yamlfile
from launcher.config.bundled import bundled_names, bundled_path, display
from launcher.config.checks import Checks, check_network, check_writes
from launcher.config.errors import PolicyFileError
from launcher.config.flags import flag_entry
from launcher.config.locs import LocDict
from netguard import policy as netpolicy
from netguard import rules
from sgbase.policyerror import PolicyError, line_of

if TYPE_CHECKING:
    from launcher.config.narrowing import Narrowed
    from launcher.config.trust import Store
    from netguard.hostsfile import HostsList

MAX_INCLUDE_DEPTH = 16
MAX_FILES = 64  # distinct files in one policy: includes may fan out, each file is read once


@dataclass(frozen=True)
class Policy:
    """The effective policy of one run, merged from every file, include and command-line entry."""

    network: netpolicy.NetworkPolicy
    sources: tuple[str, ...]
    filesystem: fspolicy.FsPolicy = field(default_factory=fspolicy.FsPolicy)
    env: EnvPolicy = field(default_factory=EnvPolicy)
    files: tuple[Path, ...] = ()  # applied in full (--policy, a trusted ./.sandgate.yaml); "always" goes to the first
    narrowed: Narrowed | None = None  # an untrusted ./.sandgate.yaml, applied only where it narrows
    # Every file read for it, includes and bundled lists too, absolute as named (symlinks and '..'
    # kept: the next run resolves the same names). The run keeps each read-only inside
    # (launcher/run/configfiles.py): the threat is a run rewriting what configures the next one.
    read: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Sections:
    """One file's sections, each parsed by the guard that owns it."""

    network: netpolicy.NetworkPolicy
    filesystem: fspolicy.FsPolicy = field(default_factory=fspolicy.FsPolicy)
    env: EnvPolicy = field(default_factory=EnvPolicy)


#: An include of another file: (the including file as named, its include line, the include as written).
IncludeRef = tuple[str, int | None, str]


def _doc(data: bytes, where: str, ref: IncludeRef | None) -> LocDict:
    """The document of a file; when it is no policy, an included file is reported at its include line."""
    if ref is None:
        return yamlfile.policy_document(data, where)
    try:
        return yamlfile.document(data, where)
    except yamlfile.NotPolicy as e:
        at = f" at line {e.line}" if e.line else ""
        raise PolicyFileError(ref[0], ref[1], f"include '{ref[2]}' is not a sandgate policy ({e.short}{at})") from None


def _sections(doc: LocDict, where: str, hosts: dict[str, HostsList] | None = None) -> Sections:
    try:
        return Sections(
            netpolicy.parse_network(doc.get("network"), where, hosts),
            fspolicy.parse_filesystem(doc.get("filesystem")),
            fspolicy.parse_env(doc.get("env")),
        )
    except PolicyError as e:
        raise PolicyFileError.of(where, e) from None


def _includes(doc: LocDict, where: str) -> list[tuple[str, int | None]]:
    includes = doc.get("include")
    if includes is None:
        return []
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list):
        raise PolicyFileError(where, line_of(doc, "include"), "'include' must be a list of names or paths")
    out = []
    for i, inc in enumerate(includes):
        line = line_of(includes, i) or line_of(doc, "include")
        if not isinstance(inc, str) or not inc:
            raise PolicyFileError(where, line, "an include must be a bundled list name or a file path")
        out.append((inc, line))
    return out


#: Why an included file (not a bundled list) may not be used, or None: (path, exact bytes read).
IncludeCheck = Callable[[Path, bytes], "str | None"]


class _Reader:
    """The files of one policy: each read once, includes bounded, file includes vetted by `check`."""

    def __init__(self, checks: Checks, check: IncludeCheck | None = None) -> None:
        self.checks, self.check = checks, check
        self.done: set[Path] = set()
        self.read: list[Path] = []  # as named, absolute, in the order read

    def load(
        self, path: Path, data: bytes | None = None, stack: tuple[Path, ...] = (), ref: IncludeRef | None = None
    ) -> list[Sections]:
        """Sections of `path` and of everything it includes, depth first, includes before the file itself."""
        where = display(path)
        real = path.resolve()
        if real in stack:
            raise PolicyFileError(where, None, f"include cycle: {' -> '.join(display(p) for p in (*stack, real))}")
        if len(stack) >= MAX_INCLUDE_DEPTH:
            raise PolicyFileError(where, None, f"includes nested deeper than {MAX_INCLUDE_DEPTH}")
        if real in self.done:
            return []  # included twice (a diamond): its rules are already in
        if len(self.done) >= MAX_FILES:
            raise PolicyFileError(where, None, f"more than {MAX_FILES} files in one policy; include fewer")
        self.done.add(real)
        self.read.append(path.absolute())
        data = yamlfile.read(path, where) if data is None else data
        doc = _doc(data, where, ref)
        out: list[Sections] = []
        for inc, line in _includes(doc, where):
            out.extend(self._include(inc, line, path, where, (*stack, real)))
        sections = _sections(doc, where, hostsfiles.read_all(doc.get("network"), path, where, self.check, self.read))
        check_writes(doc, sections.filesystem, where, self.checks)
        yamlfile.remember(data, doc)  # only now: the parse cache keeps nothing but validated policies
        return [*out, sections]

    def _include(self, ref: str, line: int | None, path: Path, where: str, stack: tuple[Path, ...]) -> list[Sections]:
        if "/" in ref or ref.endswith((".yaml", ".yml")):
            target = Path(ref).expanduser()
            target = target if target.is_absolute() else path.parent / target
        elif (bundled := bundled_path(ref)) is not None:
            return self.load(bundled, None, stack)
        else:
            from launcher import didyoumean

            hint = didyoumean.phrase(ref, bundled_names()) or f" (bundled: {', '.join(bundled_names())})"
            raise PolicyFileError(where, line, f"unknown allowlist '{ref}'{hint} (a file path needs a '/' or '.yaml')")
        try:
            data = hostilefile.read_file(target, yamlfile.MAX_BYTES)
        except hostilefile.Unreadable as e:
            raise PolicyFileError(where, line, f"include '{ref}' cannot be used: {e}") from None
        why = self.check(target, data) if self.check is not None else None
        if why:
            raise PolicyFileError(where, line, f"include '{ref}' {why}")
        return self.load(target, data, stack, (where, line, ref))


def load_policy_file(path: Path) -> list[Sections]:
    """Sections of a file named by the user (or bundled) and of everything it includes."""
    return _Reader(Checks()).load(path)


def trust_chain(path: Path) -> list[tuple[Path, bytes]]:
    """What `sandgate trust FILE` records: FILE and every file it includes, each as read (and validated) now."""
    data = yamlfile.read(path, display(path))
    chain = [(path, data)]

    def collect(target: Path, content: bytes) -> None:
        chain.append((target, content))

    _Reader(Checks(), collect).load(path, data)
    return chain


def _workspace(path: Path, store: Store | None, checks: Checks) -> tuple[list[Sections], Narrowed | None, list[Path]]:
    """./.sandgate.yaml picked up implicitly: in full once trusted (and its file includes too), else
    narrowed; and the files read for it."""
    where = display(path)
    data = yamlfile.read(path, where)
    problem = store.problem((Path.cwd(),)) if store is not None else None
    status, unreadable = store.status(path, data) if store is not None and problem is None else ("unknown", None)
    if status == "trusted" and store is not None:

        def check(target: Path, content: bytes) -> str | None:
            st, _ = store.status(target, content)
            return (
                None
                if st == "trusted"
                else (
                    f"{'changed since it was trusted' if st == 'changed' else 'is not trusted'}; "
                    f"review it, then run: sandgate trust {where}"
                )
            )

        reader = _Reader(checks, check)
        return reader.load(path, data), None, reader.read
    doc = _doc(data, where, None)
    s = _sections(doc, where)
    yamlfile.remember(data, doc)
    from launcher.config import narrowing  # only an untrusted workspace file pays for it

    net, fs, env, ignored = narrowing.narrow(s.network, s.filesystem, s.env, doc.get("include") is not None)
    return (
        [Sections(net, fs, env)],
        narrowing.Narrowed(where, status, ignored, problem or unreadable),
        [path.absolute()],
    )


def build_policy(
    files: list[Path],
    allow: list[str],
    deny: list[str],
    *,
    workspace: Path | None = None,
    store: Store | None = None,
    checks: Checks | None = None,
    user: Path | None = None,
) -> Policy:
    """The effective policy from --policy files (trusted: the user named them), an implicit workspace
    file (narrowed unless `store` trusts it), --allow/--deny entries (each NAME, HOST or HOST:PORT)
    and the user's own defaults file (launcher/config/userconfig.py: below all of them)."""
    checks = checks if checks is not None else Checks.current()
    reader = _Reader(checks)
    parts: list[Sections] = []
    sources: list[str] = []
    full: list[Path] = []
    read: list[Path] = []
    for f in files:
        parts.extend(reader.load(f))
        sources.append(display(f))
        full.append(f.resolve())
    narrowed = None
    if workspace is not None:
        got, narrowed, read = _workspace(workspace, store, checks)
        parts.extend(got)
        sources.append(display(workspace) + (" (untrusted: narrowing only)" if narrowed else ""))
        full.extend([] if narrowed else [workspace.resolve()])
    for ref in allow:
        if (p := bundled_path(ref)) is not None:
            parts.extend(reader.load(p))
            sources.append(display(p))
        else:
            parts.append(Sections(flag_entry(ref, "allow")))
    parts.extend(Sections(flag_entry(ref, "deny")) for ref in deny)
    if allow or deny:
        sources.append("command line")
    mine = _user_config(user, reader, parts) if user is not None else []  # last: a file both name is theirs
    sources.extend([f"user config {display(user)}"] if user is not None else [])
    parts.extend(mine)
    try:
        network = netpolicy.merge([p.network for p in parts])
    except PolicyError as e:
        raise PolicyFileError.of("policy", e) from None
    check_network(network, checks)
    return Policy(
        network,
        tuple(sources),
        fspolicy.merge_fs([p.filesystem for p in parts]),
        fspolicy.merge_env([p.env for p in parts]),
        tuple(full),
        narrowed,
        tuple(dict.fromkeys((*reader.read, *read))),
    )


def _user_config(path: Path, reader: _Reader, higher: list[Sections]) -> list[Sections]:
    """The user's defaults file and its includes, its single values yielding to every `higher` source."""
    from launcher.config import userconfig

    mine = reader.load(path, userconfig.read(path))
    try:
        net = netpolicy.merge([s.network for s in mine])
    except PolicyError as e:
        raise PolicyFileError.of(display(path), e) from None
    under = userconfig.below(net, [s.network for s in higher])
    return [Sections(under, fspolicy.merge_fs([s.filesystem for s in mine]), fspolicy.merge_env([s.env for s in mine]))]


def bundled_rulesets() -> dict[str, rules.Ruleset]:
    """Each bundled allowlist compiled, to say which one would allow a denied host (parse cache: fast).

    One list that does not load is left out rather than failing the caller's exit line or report.
    """
    out: dict[str, rules.Ruleset] = {}
    for name in bundled_names():
        path = bundled_path(name)
        if path is None:
            continue
        try:
            sections = load_policy_file(path)
        except PolicyFileError:
            continue
        out[name] = rules.compile_policy(netpolicy.merge([s.network for s in sections]))
    return out
