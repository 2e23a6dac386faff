"""`python -m pip install -e ".[test]"` on Windows must resolve (issue 28, win-py P1).

Linux CI never evaluates a `sys_platform == "win32"` marker as true, so a pin that only Windows' resolver
sees is invisible here: mitmproxy 12 requires `pydivert<=3.1.3; sys_platform == "win32"` while the test
extra pinned pydivert==4.0.1 for every platform, and the workflow's install step could not succeed.
This test evaluates every requirement of the project and of every installed distribution with
Windows' markers and refuses two that no version satisfies together (pytest brings `packaging`).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parent.parent.parent
WINDOWS = {"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt", "python_version": "3.12"}
PYDIVERT = canonicalize_name("pydivert")
LINUX = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "python_version": "3.12"}


def _env(over: dict[str, str]) -> dict[str, str]:
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(over, extra="")
    return env


def _ours(env: dict[str, str]) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in (*project["dependencies"], *project["optional-dependencies"]["test"])]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def _installed(env: dict[str, str]) -> list[tuple[str, Requirement]]:
    out = []
    for dist in metadata.distributions():
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                out.append((str(dist.metadata["Name"]), req))
    return out


def _compatible(a: Requirement, b: Requirement) -> bool:
    """Some version satisfies both specifier sets (tried: every version either one names, and a newest one)."""
    names = {m.group(0) for spec in (a.specifier, b.specifier) for m in re.finditer(r"\d+(\.\d+)*", str(spec))}
    candidates = []
    for name in names:
        try:
            candidates.append(Version(name))
        except InvalidVersion:
            continue
    candidates.append(Version("999999"))
    return any(
        a.specifier.contains(v, prereleases=True) and b.specifier.contains(v, prereleases=True) for v in candidates
    )


@pytest.mark.parametrize("platform", [WINDOWS, LINUX], ids=["windows", "linux"])
def test_no_installed_distribution_forbids_what_we_require(platform: dict[str, str]) -> None:
    env = _env(platform)
    ours = {canonicalize_name(r.name): r for r in _ours(env)}
    clashes = [
        f"{who} requires {req} but pyproject.toml says {ours[canonicalize_name(req.name)]}"
        for who, req in _installed(env)
        if canonicalize_name(req.name) in ours and not _compatible(req, ours[canonicalize_name(req.name)])
    ]
    assert clashes == []


def test_windows_gets_a_pydivert_with_the_socket_layer_and_linux_the_ebpf_one() -> None:
    win = {canonicalize_name(r.name): r for r in _ours(_env(WINDOWS))}
    lin = {canonicalize_name(r.name): r for r in _ours(_env(LINUX))}
    assert win[PYDIVERT].specifier.contains("3.1.3") and not win[PYDIVERT].specifier.contains("2.1.0")
    assert lin[PYDIVERT].specifier.contains("4.0.1")


def test_the_check_bites_on_the_old_pin() -> None:
    mitm = Requirement('pydivert<=3.1.3,>=2.0.3; sys_platform == "win32"')
    assert not _compatible(mitm, Requirement("pydivert==4.0.1"))
    assert _compatible(mitm, Requirement("pydivert>=3.1,<=3.1.3"))
