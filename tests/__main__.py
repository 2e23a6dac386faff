"""`.venv/bin/python -m tests [pytest options] [paths]`: the whole suite, as README command 2 and .ci/run run it.

The rest in two processes, then the machine-wide tests/e2e/ one at a time (tests/support/suiterun.py).
"""

import sys

from .support import suiterun

raise SystemExit(suiterun.main(sys.argv[1:]))
