"""python -P -m launcher.forkserver --socket PATH --key KEY [--idle-exit SECONDS]

Started by a warm `sandgate run` that found no server for its context (client.spawn_missed), detached
like the daemon. It checks that it is its starter's twin (context.key), claims the socket, imports
everything a run imports, and serves (server.py) until it has been idle for --idle-exit seconds (300),
its code changes, `sandgate daemon stop` asks, or SIGTERM.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

from launcher.forkserver import client, codewatch, context

USAGE = "usage: python -P -m launcher.forkserver --socket PATH --key KEY [--idle-exit SECONDS]"
# What a run imports beyond launcher.cli's own imports (the lazy ones every run reaches); a module
# missing here is imported by the first worker that needs it (and again by every later one).
RUN_MODULES = (
    "launcher.cli",
    "launcher.run.launch",
    "launcher.audit.refusals",
    "launcher.audit.bydesign",
    "launcher.approvals.prompt",
    "netguard.daemon.specbytes",
    "netguard.daemon.control",
    "yaml",
)


def main(argv: list[str]) -> int:
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    if (
        len(argv) % 2
        or not {"--socket", "--key"} <= opts.keys()
        or not set(opts) <= {"--socket", "--key", "--idle-exit"}
    ):
        print(USAGE, file=sys.stderr)
        return 2
    root = os.path.dirname(client.LAUNCHER_DIR)
    watch_fd = codewatch.watch(root)  # first: a change during the imports below counts
    own = context.key(os.environ, client.LAUNCHER_DIR)
    if own != opts["--key"]:  # started from another context than the one it would serve: never again
        print(
            f"sandgate fork server: key {own} is not {opts['--key']}; parts:",
            *context.parts(os.environ, client.LAUNCHER_DIR),
            sep="\n",
            file=sys.stderr,
        )
        with open(opts["--socket"] + ".refused", "w") as f:  # (client.spawn_missed honours it for a while)
            f.write(own + "\n")
        return 2
    from netguard.daemon import daemonpath

    sock = daemonpath.DaemonSocket(opts["--socket"])
    if not sock.claim() or sock.sock is None:
        return 0  # another server got there first
    try:
        _warm()
        from launcher.forkserver import server

        gc.freeze()  # what every worker shares: no collection walks it, no copy-on-write from one
        server.Server(sock.sock, own, watch_fd, float(opts.get("--idle-exit", "300")), sock.release).serve()
    finally:
        sock.release()
    return 0


def _warm() -> None:
    """Import what a run imports and do, once, the work of each run that depends on nothing of the
    caller's: a worker inherits it (the code watch ends the server before any of it can go stale)."""
    for name in RUN_MODULES:
        importlib.import_module(name)
    from fsguard import env
    from launcher import cli
    from netguard.daemon import daemonpath

    cli.PREBUILT["run"] = cli.build_parser("run")
    daemonpath.code_id()  # the daemon's code fingerprint: ~25 stat calls
    env.precompile_defaults()  # the default name patterns, one regex each


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
