"""The daemon decides dnspython's optional features itself, without importing package metadata (issue 25).

dns._features imports importlib.metadata (~10 ms of a cold daemon's start) only to read versions;
the daemon answers every feature first. The answers must be the ones dnspython would have given:
IDNA 2008 names where the installed idna allows it (a different codec would change which names
resolve), and none of the transports the daemon never uses.
"""

from __future__ import annotations

import subprocess
import sys

PLAIN = "import dns._features as f, dns.name; print(f.have('idna'), dns.name.have_idna_2008)"
DAEMON = (
    "import sys; from netguard.daemon import __main__ as m; m._plain_dns_only();"
    "import dns._features as f, dns.name, dns.asyncquery;"
    "print(f.have('idna'), dns.name.have_idna_2008, 'importlib.metadata' in sys.modules,"
    " [x for x in ('doq', 'doh', 'trio', 'dnssec', 'wmi') if f.have(x)])"
)


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout


def test_features_decided_as_dnspython_would_without_metadata() -> None:
    plain = _run(PLAIN).split()
    assert plain[0] == "True", "the installed idna meets dnspython's minimum: the check below would prove nothing"
    assert _run(DAEMON).split() == [plain[0], plain[1], "False", "[]"]


def test_idna_minimum_compared_as_versions() -> None:
    from netguard.daemon.__main__ import _idna_as_required

    assert _idna_as_required(["idna>=1.0"]) is True
    assert _idna_as_required(["idna>=999.0"]) is False
    assert _idna_as_required(["idna>=3.9"]) is True  # 3.20 > 3.9 as versions, not as text
    assert _idna_as_required(["other>=1.0"]) is False
