"""This run's OpenTelemetry export settings, read once from sandgate's own environment (issue 27).

The daemon is shared, so the run that binds a sandbox says where its records go: the OTEL_*
variables of `sandgate run` are parsed here (netguard.otlp) and travel in the bind's spec. Read
early (launch.main), so a setting sandgate cannot honour fails before a sandbox is built, and
once: the spec takes the same result. A run without any OTEL_ variable imports nothing for it.
The headers they name are dropped from the command's environment (fsguard.env) and never printed.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

from launcher.errors import RunError

if TYPE_CHECKING:
    from netguard.otlp import OtlpConfig

MAX_PEM = 1 << 20  # a bundle of roots, not a file the daemon should carry for megabytes


@functools.cache
def settings() -> OtlpConfig | None:
    """The config for this run (None: no export); warnings on stderr; RunError for what cannot be honoured."""
    if not any(name.startswith("OTEL_") for name in os.environ):
        return None  # the common case costs one scan of the names
    from netguard import otelenv, otlp

    try:
        config, warnings = otelenv.from_env(os.environ, _read_pem)
    except otlp.OtlpError as e:
        raise RunError(str(e)) from None
    for w in warnings:
        print(f"sandgate: warning: {w}", file=sys.stderr)
    return config


def _read_pem(path: str) -> str:
    """The certificate file, read by the launcher as the user (the daemon never opens a run's paths)."""
    with open(path, "rb") as f:
        data = f.read(MAX_PEM + 1)
    if len(data) > MAX_PEM:
        raise OSError(0, f"larger than {MAX_PEM} bytes")
    text = data.decode("ascii")
    import ssl  # only with a certificate set: checked here, so a bad file fails the run, not its export later

    ssl.create_default_context(cadata=text)  # ssl.SSLError (an OSError) names what is wrong with it
    return text
