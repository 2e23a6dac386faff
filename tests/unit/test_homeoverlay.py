"""fsguard.homeoverlay.plan as an unprivileged user (issue 11: sandgate for non-root users).

A home's group need not be its user's (a home made by root and handed over with `chown USER`
keeps group root): planning its layer must still work, with the caller's own ids on the layer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fsguard import homeoverlay, layerstore

NOBODY = 65534


def test_a_home_whose_group_is_not_the_callers_gets_a_layer() -> None:
    home = Path(tempfile.mkdtemp(prefix="sandgate-test-home-", dir="/var/tmp"))
    top = Path(f"/var/tmp/sandgate-{NOBODY}")  # an unprivileged user's store (root's is elsewhere)
    layer = top / "homes" / layerstore.home_key(str(home))  # the home's path and identity
    existed = top.exists()
    try:
        os.chown(home, NOBODY, 0)  # owner nobody, group root: nobody cannot give a file group root
        pid = os.fork()
        if pid == 0:  # the child becomes nobody and plans the layer
            code = 1
            try:
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                ov = homeoverlay.plan(str(home), (), uid=NOBODY, owner=NOBODY)
                st = os.stat(ov.upper) if ov else None
                code = 0 if st is not None and (st.st_uid, st.st_gid) == (NOBODY, NOBODY) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (layer / "home").read_text() == f"{home}\n{layerstore.home_identity(str(home))}\n"
    finally:
        shutil.rmtree(top if not existed else layer, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
