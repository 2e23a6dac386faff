"""The core of the probe runner: the probe registry, the Ctx a probe gets, and how outcomes are classified.

`observed` is the probe's own view: "permitted" (the action succeeded: data came back, the file
was written), "blocked" (it failed), "unsupported" (the probe could not run here, or the probe
itself broke: a bug in a probe must never read as a pass). Stdlib only, like every module the
runner imports inside the sandbox.
"""

from __future__ import annotations

import errno
import signal
import socket
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypedDict

from selftest import markers
from selftest.spec import VerifySpec

GROUPS = ("network", "filesystem", "process")
CONTEXTS = ("child", "grandchild", "daemon")
EXPECTED = ("permitted", "blocked")
OBSERVED = ("permitted", "blocked", "unsupported")
PROBE_WATCHDOG = 20.0  # a probe still running after this is reported "unsupported" (probe bug)
DETAIL_LIMIT = 300
#: errno values that mean "the kernel or a boundary said no" (as opposed to a broken probe).
REFUSAL_ERRNOS = frozenset(
    {
        errno.EPERM,
        errno.EACCES,
        errno.EROFS,
        errno.EXDEV,
        errno.EBUSY,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
        errno.EAFNOSUPPORT,
        errno.ECONNREFUSED,
    }
)


REFUSAL_TYPES: tuple[type[BaseException], ...] = (
    PermissionError,
    ConnectionRefusedError,
    ConnectionResetError,
    TimeoutError,
    socket.timeout,
)


Result = tuple[str, str]  # (observed, detail)


class Record(TypedDict):
    """One probe's outcome in one context: a JSON line of the runner's output."""

    group: str
    probe: str
    context: str
    expected: str
    observed: str
    detail: str


#: The run order within a group: the order of verify's rows and of the README's coverage table
#: (v1's probes first, then the host-boundary and the v1-review ones). A new probe is added here.
ORDER = (
    # network
    "https_proxy_vars",
    "http_proxy_vars",
    "https_transparent",
    "blocked_via_proxy",
    "blocked_transparent",
    "direct_tcp_ip",
    "allowed_ip_other_port",
    "connect_ip_literal",
    "sni_spoof",
    "host_mismatch",
    "host_fronting",
    "keepalive_blocked_host",
    "rebind_loopback",
    "rebind_metadata",
    "udp",
    "quic",
    "dns_udp_rogue",
    "dns_tcp_rogue",
    "dns_txt_exfil",
    "ipv6",
    "raw_icmp",
    "abstract_unix",
    "path_unix",
    "setns_host_netns",
    "netns_tamper",
    "host_loopback_service",
    "dns_smuggling",
    "wildcard_dns_types",
    "rebind_own_address",
    # network, issue 13: inspected hosts (probes/inspected.py)
    "inspected_ca_trusted",
    "passthrough_untouched",
    "git_fetch_inspected",
    "git_push_refused",
    "http_rule_refusals",
    "sentinel_leak",
    "credential_fronting",
    "secret_brokered",
    "ca_key_hidden",
    # network, issue 24: requests read differently upstream (probes/requestshape.py), sentinels (inspected.py)
    "path_spellings",
    "method_override",
    "websocket_upgrade",
    "sentinel_prefix",
    # network, issue 22: the shared daemon (probes/daemonpeers.py, starvation.py, endlesshead.py)
    "other_daemon_control",
    "starvation",
    "endless_head",
    # filesystem
    "write_workspace",
    "write_outside",
    "git_hooks",
    "git_config",
    "create_protected",
    "symlink_escape",
    "hardlink_escape",
    "rename_protected",
    "remount_rw",
    "read_ssh_key",
    "secret_env",
    "open_by_handle",
    "mknod_disk",
    "git_commit",
    "git_indirection",
    "tool_configs",
    "credential_files",
    "env_secret_names",
    "audit_log_forge",
    "config_files",
    "runtime_dirs",
    # process
    "tiocsti",
    "ptrace_outside",
    "process_vm_readv",
    "signal_outside",
    "proc_root",
    "setuid_gain",
    "proc_environ",
    "sysv_shm_host",
    "keyring_read",
    "sethostname",
    "bpf_map",
    # process, issue 24: setuid bits and file capabilities left behind, nested user namespaces (probes/privileges.py)
    "setuid_plant",
    "file_caps",
    "nested_userns",
)


class Blocked(Exception):
    """Raised by a probe when the action failed in a way the probe itself recognised as a refusal."""


class Unsupported(Exception):
    """Raised by a probe that cannot run here (no terminal, no proxy variable, no .git...)."""


class ProbeHung(Exception):
    """The watchdog fired: a probe ran past PROBE_WATCHDOG seconds."""


# ---------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Ctx:
    """What a probe gets: the spec, the context it runs in and its own name (for markers)."""

    spec: VerifySpec
    context: str
    probe: str

    @property
    def mark(self) -> str:
        """The context as markers spell it, `<context>-<tag>` when verify runs passes (spec.marker_tag)."""
        return markers.mark(self.context, self.spec.marker_tag)

    @property
    def path(self) -> str:
        """HTTP marker: the request path."""
        return markers.http_path(self.mark, self.probe)

    @property
    def marker(self) -> bytes:
        """TCP/UDP/unix marker: the payload."""
        return markers.wire_payload(self.mark, self.probe)

    @property
    def label(self) -> str:
        """DNS marker: `<probe>-<mark>`, lowercase and label-safe."""
        return markers.label(self.probe, self.mark)

    def dns_name(self) -> str:
        return markers.dns_name(self.probe, self.mark, self.spec.exfil_domain)

    def url(self, scheme: str, host: str) -> str:
        return f"{scheme}://{host}{self.path}"


@dataclass(frozen=True)
class Probe:
    group: str
    name: str
    expected: str
    contexts: frozenset[str]
    fn: Callable[[Ctx], Result] = field(compare=False)

    @property
    def threat(self) -> str:
        """First line of the probe function's docstring: the threat it represents."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


REGISTRY: dict[str, Probe] = {}


def probe(
    group: str, name: str, expected: str, contexts: Iterable[str] = CONTEXTS
) -> Callable[[Callable[[Ctx], Result]], Callable[[Ctx], Result]]:
    """Register a probe function under a unique name; it returns (observed, detail) or raises."""
    ctxs = frozenset(contexts)
    if group not in GROUPS or expected not in EXPECTED or not ctxs <= set(CONTEXTS) or not ctxs:
        raise ValueError(f"bad probe declaration {group}/{name}/{expected}/{sorted(ctxs)}")
    if name not in ORDER:
        raise ValueError(f"probe {name!r} has no place in ORDER")

    def register(fn: Callable[[Ctx], Result]) -> Callable[[Ctx], Result]:
        if name in REGISTRY:
            raise ValueError(f"duplicate probe name {name!r}")
        REGISTRY[name] = Probe(group, name, expected, ctxs, fn)
        return fn

    return register


def ordered() -> list[Probe]:
    """Every probe in run order: by group (GROUPS), then by ORDER."""
    return sorted(REGISTRY.values(), key=lambda p: (GROUPS.index(p.group), ORDER.index(p.name)))


def probe_list() -> list[tuple[str, str, str]]:
    """(group, probe, expected) of every registered probe, in run order (for documentation)."""
    return [(p.group, p.name, p.expected) for p in ordered()]


def select_probes(context: str, only: Iterable[str] | None = None) -> list[Probe]:
    """The probes that make sense in `context`, optionally restricted to `only` (probe or group names)."""
    wanted = set(only) if only else None
    if wanted is not None and (unknown := wanted - REGISTRY.keys() - set(GROUPS)):
        raise ValueError(f"unknown probe(s) or group(s): {', '.join(sorted(unknown))}")
    return [p for p in ordered() if context in p.contexts and (wanted is None or p.name in wanted or p.group in wanted)]


# ------------------------------------------------------------------------------- running probes


def is_refusal(exc: BaseException) -> bool:
    """True when `exc` means the action was refused (not that the probe is broken)."""
    if isinstance(exc, (Blocked, *REFUSAL_TYPES)):
        return True
    return isinstance(exc, OSError) and exc.errno in REFUSAL_ERRNOS


def describe(exc: BaseException) -> str:
    """Short text for an exception: errno name plus message."""
    if isinstance(exc, (Blocked, Unsupported, ProbeHung)):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _last_line(exc: BaseException) -> str:
    """The traceback's last line plus where it was raised, for an unexpected exception."""
    line = traceback.format_exception_only(exc)[-1].strip()
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{line} (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else line


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 3] + "..."


def run_one(p: Probe, spec: VerifySpec, context: str, *, watchdog: float | None = PROBE_WATCHDOG) -> Record:
    """Run one probe and turn whatever happened into its JSON record (never raises for probe failures)."""

    def alarm(_signum: int, _frame: FrameType | None) -> None:
        raise ProbeHung(f"probe still running after {watchdog:g} s (a probe bug: every wait has a timeout)")

    armed = watchdog is not None
    old: Any = None
    if watchdog is not None:
        try:
            old = signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, watchdog)
        except ValueError:  # not the main thread: no watchdog
            armed = False
    try:
        observed, detail = p.fn(Ctx(spec, context, p.name))
        if observed not in OBSERVED:
            observed, detail = "unsupported", f"probe returned observed={observed!r}"
    except Unsupported as e:
        observed, detail = "unsupported", describe(e)
    except ProbeHung as e:
        observed, detail = "unsupported", describe(e)
    except Exception as e:
        if is_refusal(e):
            observed, detail = "blocked", describe(e)
        else:
            observed, detail = "unsupported", "unexpected " + _last_line(e)
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return {
        "group": p.group,
        "probe": p.name,
        "context": context,
        "expected": p.expected,
        "observed": observed,
        "detail": _clip(str(detail)),
    }


def run_probes(spec: VerifySpec, context: str, only: Iterable[str] | None = None) -> Iterator[Record]:
    """Records of every probe for `context`, one by one (each written as soon as it is done)."""
    for p in select_probes(context, only):
        yield run_one(p, spec, context)


def attempt(fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """Run one part of a multi-part probe, classified like a whole probe (see run_one).

    A part that breaks becomes ("unsupported", why) instead of aborting the probe, so a bypass
    found by another part is still reported as "permitted".
    """
    try:
        return fn(*args, **kwargs)
    except ProbeHung:
        raise
    except Unsupported as e:
        return "unsupported", describe(e)
    except Exception as e:
        if is_refusal(e):
            return "blocked", describe(e)
        return "unsupported", "unexpected " + _last_line(e)


def combine(parts: list[tuple[str, Result]], *, need: str) -> Result:
    """Merge labelled part results.

    need="any": a bypass anywhere counts (expected-blocked probes): permitted if any part was.
    need="all": every action must work (expected-permitted probes): blocked if any part was.
    Either way an unsupported part without a deciding part makes the whole unsupported.
    """
    observed = [r[0] for _, r in parts]
    decisive = "permitted" if need == "any" else "blocked"
    other = "blocked" if need == "any" else "permitted"
    if decisive in observed:
        verdict = decisive
    elif "unsupported" in observed:
        verdict = "unsupported"
    else:
        verdict = other
    return verdict, "; ".join(f"{label}: {detail}" for label, (_, detail) in parts)
