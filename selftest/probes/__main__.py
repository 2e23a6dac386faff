"""`python -m selftest.probes SPEC.json ...`: the probe runner (see runner.py)."""

import sys

from selftest.probes.runner import main

sys.exit(main())
