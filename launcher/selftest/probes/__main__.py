"""`python -m launcher.selftest.probes SPEC.json ...`: the probe runner (see runner.py)."""

import sys

from launcher.selftest.probes.runner import main

sys.exit(main())
