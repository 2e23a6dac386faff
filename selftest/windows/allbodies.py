"""Every Windows probe body `sandgate verify` runs, in one tuple.

Apart from probebody.py (the record every body module imports) so that the list of mechanisms
and the record they share form no import circle; a new body module is added here.
"""

from __future__ import annotations

from selftest.windows import probeacl, probedesktop, probelogon, probenet, probeself
from selftest.windows.probebody import ProbeBody


def bodies() -> tuple[ProbeBody, ...]:
    return (*probedesktop.BODIES, *probelogon.BODIES, *probeacl.BODIES, *probenet.BODIES, *probeself.BODIES)
