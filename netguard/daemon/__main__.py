"""`python -m netguard.daemon`: start sandgated, the per-user daemon (netguard.daemon.serve).

    python -m netguard.daemon --socket PATH [--ready-fd N] [--idle-exit SECONDS] [--verbose]

Claims PATH under its lock before paying for mitmproxy's import, so a second daemon started
for the same socket exits at once (after telling its starter "ready": one is serving).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import NoReturn

from sgbase import dataclasscache

dataclasscache.install(
    dataclasscache.table_path("daemon")
)  # before any record class is made: ~45 of them before a cold daemon is ready

# Only these before the claim: a `sandgate daemon stop` just after a cold run must find the daemon it
# started, so the socket is bound before the imports that serving needs (the rest of main's).
from netguard.daemon.daemonpath import DaemonSocket, report_ready  # noqa: E402

DESCRIPTION = "sandgated: one long-lived proxy per user and network namespace, serving many sandboxes."


def _skip_addons_init() -> None:
    """Register mitmproxy.addons without running its __init__, which imports every addon (flask, ldap3,
    ...: ~150 ms of a cold start); we load only proxyserver, and mitmproxy.master only termlog."""
    import importlib.util

    if "mitmproxy.addons" in sys.modules:
        return
    spec = importlib.util.find_spec("mitmproxy.addons")
    if spec is not None and spec.loader is not None:
        sys.modules["mitmproxy.addons"] = importlib.util.module_from_spec(spec)


def _plain_dns_only() -> None:
    """dnspython without its optional transports: it would import aioquic and OpenSSL (DNS over QUIC, ~40 ms
    of a cold start) and look up package metadata, for transports the daemon never uses (UDP and TCP only).

    dns._features imports importlib.metadata (zipfile, email, csv...: ~10 ms of a cold start) only to
    read package versions in `have`. Every feature is decided here first, so `have` never reads one:
    the import meets a placeholder, removed again at once. idna's answer is the one `have` would give
    (the installed idna against dnspython's own minimum), read from the package instead of its metadata."""
    import types

    placeholder = "importlib.metadata" not in sys.modules
    if placeholder:
        sys.modules["importlib.metadata"] = types.ModuleType("importlib.metadata")
    try:
        import dns._features as features
    finally:
        if placeholder:
            del sys.modules["importlib.metadata"]
    requirements = getattr(features, "_requirements", None)
    if not isinstance(requirements, dict):  # another dnspython: let `have` read versions as it does
        import importlib.metadata  # noqa: F401  (binds the attribute `have` reads)

        requirements = {key: [] for key in ("doq", "doh", "trio", "dnssec", "wmi")}
    for feature, needs in requirements.items():
        features.force(feature, feature == "idna" and _idna_as_required(needs))


def _idna_as_required(requirements: list[str]) -> bool:
    """`have("idna")`: the installed idna meets dnspython's minimum (`idna>=X.Y`)."""
    try:
        from idna.package_data import __version__ as version
    except ImportError:
        return False

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", text)[:3])

    return all(r.startswith("idna>=") and parts(version) >= parts(r[len("idna>=") :]) for r in requirements)


def _log(line: str) -> None:
    from netguard.daemon.serve import log  # the daemon's one log line (a rare path: the import is paid here)

    log(line)


USAGE = "usage: python -m netguard.daemon --socket PATH [--ready-fd N] [--idle-exit SECONDS] [--verbose]"
HELP = f"""{USAGE}

{DESCRIPTION}

  --socket PATH         control socket path (see netguard.daemon.control.socket_path)
  --ready-fd N          write b'ready\\n' to this fd, then close it, once serving
  --idle-exit SECONDS   exit after this many seconds without any control connection (0: never; default 300)
  --verbose             also log every proxied connection (mitmproxy's INFO)
"""


class Args:
    """The daemon's four options (its starters are sandgate's own launchers)."""

    def __init__(self, socket: str, ready_fd: int | None, idle_exit: float, verbose: bool) -> None:
        self.socket, self.ready_fd, self.idle_exit, self.verbose = socket, ready_fd, idle_exit, verbose


def parse_args(argv: list[str]) -> Args:
    """By hand, not argparse: its import (with gettext and locale) is ~8 ms of a cold start, before "ready".
    A mistake ends as argparse's would: the usage and one line on stderr, exit 2."""
    values: dict[str, str] = {}
    verbose = False
    items = iter(argv)
    for item in items:
        name, eq, value = item.partition("=")
        if name in ("-h", "--help") and not eq:
            print(HELP, end="")
            raise SystemExit(0)
        if name == "--verbose" and not eq:
            verbose = True
        elif name in ("--socket", "--ready-fd", "--idle-exit"):
            values[name] = (value if eq else next(items, "")) or _usage(f"{name} needs a value")
        else:
            _usage(f"unrecognized argument: {item}")
    if "--socket" not in values:
        _usage("the following arguments are required: --socket")
    fd, idle = values.get("--ready-fd"), values.get("--idle-exit", "300")
    try:
        return Args(values["--socket"], int(fd) if fd is not None else None, float(idle), verbose)
    except ValueError as e:
        _usage(f"a number is needed: {e}")


def _usage(why: str) -> NoReturn:
    print(f"{USAGE}\npython -m netguard.daemon: error: {why}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    path = os.path.abspath(args.socket)
    named = re.fullmatch(r"daemon-(\d+)(?:-[0-9a-f]+)?\.sock", os.path.basename(path))
    if named and int(named.group(1)) != os.stat("/proc/self/ns/net").st_ino:
        # It would connect upstream from the wrong namespace (e.g. started from inside a sandbox).
        _log(f"{path} names another network namespace than this process's; not serving it")
        return 1
    # SIGTERM while mitmproxy is still being imported must still remove the socket.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        listener = DaemonSocket(path)
        claimed = listener.claim()
    except OSError as e:
        _log(f"cannot listen on {path}: {e}")
        return 1
    if not claimed:
        os.close(listener.lock_fd)
        report_ready(args.ready_fd)  # a daemon serves PATH: that is all the starter waits for
        return 0
    try:
        os.chdir("/")  # hold no directory of the launcher's busy
        import asyncio
        import logging

        from netguard.daemon.serve import Daemon

        logging.basicConfig(
            stream=sys.stderr,
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        )
        _skip_addons_init()
        _plain_dns_only()
        asyncio.run(Daemon(listener, args.idle_exit).run(args.ready_fd))
    finally:
        if listener.sock is not None:
            listener.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
