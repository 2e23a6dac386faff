"""The probes of `sandgate verify`, by subject; importing this package registers every one of them.

core.py holds the registry, the Ctx a probe gets and how outcomes are classified; runner.py runs
them inside the sandbox (``python -m selftest.probes SPEC.json``, see its docstring).
Stdlib only, every module here: the sandbox's Python may have nothing else.
"""

from selftest.probes import (
    configfiles,
    credentials,
    daemonpeers,
    dns,
    endlesshead,
    filesystem,
    fronting,
    host,
    inspected,
    network,
    privileges,
    process,
    requestshape,
    runtimedirs,
    starvation,
    workspace,
)

__all__ = [
    "configfiles",
    "credentials",
    "daemonpeers",
    "dns",
    "endlesshead",
    "filesystem",
    "fronting",
    "host",
    "inspected",
    "network",
    "privileges",
    "process",
    "requestshape",
    "runtimedirs",
    "starvation",
    "workspace",
]
