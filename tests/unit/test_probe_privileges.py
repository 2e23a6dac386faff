"""verify's issue-24 probes (selftest/probes/privileges.py), without a sandbox and under the
real seccomp filter.

Without a boundary, as root, each probe must report "permitted" and leave what the host side
(planted.py's walk, privileges.left_behind) then finds: that is what shows the probes can see a
missing boundary. In a forked child with fsguard.seccomp installed the same probes must read
"blocked" and leave nothing. Every probe runs in a forked child (the filter can never be removed,
and a nested namespace must die with its process).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fsguard import seccomp
from selftest import markers
from selftest.probes import core, privileges

from ..support.kernelprobe import in_child

PROBES = ("setuid_plant", "file_caps", "nested_userns")


def _spec(results: Path) -> Any:
    return SimpleNamespace(results_dir=str(results), marker_tag="root")  # all the probes read of the spec


def _run_all(results: Path, filtered: bool) -> dict[str, Any]:
    def body() -> dict[str, Any]:
        if filtered:
            seccomp.install()
        out: dict[str, Any] = {
            name: core.run_one(core.REGISTRY[name], _spec(results), "child", watchdog=None) for name in PROBES
        }
        out["left"] = {
            f"{probe} {path.name}": seen
            for path in sorted(results.iterdir())
            for probe, seen in privileges.left_behind(str(path), os.lstat(path).st_mode).items()
        }
        return out

    result: dict[str, Any] = in_child(body, 20.0)
    return result


def test_without_a_boundary_every_probe_sees_the_privilege_and_the_host_sees_the_files(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "as root the kernel grants all three without a sandbox"
    out = _run_all(tmp_path, filtered=False)
    for name in PROBES:
        assert out[name]["observed"] == "permitted" and out[name]["expected"] == "blocked", out[name]
    assert "chmod 4755: mode 4755" in out["setuid_plant"]["detail"], out["setuid_plant"]
    assert "control chmod 755: done" in out["setuid_plant"]["detail"]
    assert "unshare: a new user+network namespace, CapEff" in out["nested_userns"]["detail"], out["nested_userns"]
    prefix = privileges.planted_name(markers.mark("child", "root"))
    left = out["left"]
    assert f"setuid_plant {prefix}-chmod4755" in left and f"setuid_plant {prefix}-open4755" in left, left
    assert f"setuid_plant {prefix}-mknod4755" in left and f"file_caps {prefix}-caps" in left, left
    assert f"setuid_plant {prefix}-control" not in left  # chmod 755 is no evidence


def test_under_the_filter_every_probe_is_blocked_and_nothing_is_left(tmp_path: Path) -> None:
    out = _run_all(tmp_path, filtered=True)
    for name in PROBES:
        assert out[name]["observed"] == "blocked", out[name]
    assert "control chmod 755: done" in out["setuid_plant"]["detail"]  # the control still works
    assert "chmod 4755: EPERM" in out["setuid_plant"]["detail"], out["setuid_plant"]
    assert "control user.* xattr: set" in out["file_caps"]["detail"]
    assert "unshare: EPERM" in out["nested_userns"]["detail"] and "clone3: ENOSYS" in out["nested_userns"]["detail"]
    assert out["left"] == {}


def test_a_control_that_fails_makes_the_probe_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_xattrs(*_: object, **__: object) -> None:
        raise OSError(errno.ENOTSUP, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", no_xattrs)  # in this process only: the probe runs in-process here
    rec = core.run_one(core.REGISTRY["file_caps"], _spec(tmp_path), "child", watchdog=None)
    assert rec["observed"] == "unsupported" and "cannot tell" in rec["detail"], rec
