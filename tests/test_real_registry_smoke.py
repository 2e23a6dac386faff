"""REAL-REGISTRY SMOKE TEST: the one place the tests use the real network (issue 11, DEVELOPERS.md).

Through `sandgate run` with the bundled lists and default settings, the ordinary clients install
from PyPI, the npm registry and Debian's repositories (the only registries these machines reach),
each twice: the second run must work from the sandbox home's warm cache. One destination off
the allowlist is named in the exit summary. Nothing else is contacted. Timings are printed
(pytest -s), not asserted. The sandbox home used here is a throwaway one (HOME points into a
temporary directory outside /tmp) and its layer is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SANDGATE = [sys.executable, "-m", "launcher.cli", "run"]


def _daemon(*args: str) -> int:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", "daemon", *args],
        cwd=REPO,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).returncode


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandgate-smoke-home-", dir="/var/tmp"))
    had_daemon = _daemon("status") == 0  # this runs in the host's namespace: someone's daemon may be up
    try:
        yield d
    finally:
        if not had_daemon:
            _daemon("stop")  # the one these runs started: leave no process behind
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(d))
        shutil.rmtree(d, ignore_errors=True)


def run(home: Path, ws: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
    # The machine's own settings (CA bundles, pip's index...) are what "as set up here" means.
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    t0 = time.monotonic()
    r = subprocess.run([*SANDGATE, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def twice(home: Path, tmp_path: Path, name: str, allow: str, cmd: list[str], reset: list[str] | None = None) -> None:
    ws = tmp_path / name
    ws.mkdir()
    times = []
    for attempt in ("cold", "warm"):
        r, took = run(home, ws, "--allow", allow, "--", *cmd)
        assert r.returncode == 0, f"{name} ({attempt}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        assert " 0 denied" in r.stderr, r.stderr
        times.append(took)
        if reset:
            subprocess.run(reset, cwd=ws, check=True)
    print(f"\n{name}: first {times[0]:.2f} s, second (warm) {times[1]:.2f} s")


def test_npm_install_is_number_twice(home: Path, tmp_path: Path) -> None:
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed on this machine", pytrace=False)
    twice(
        home,
        tmp_path,
        "npm",
        "npm",
        ["npm", "install", "--no-audit", "--no-fund", "is-number"],
        reset=["rm", "-rf", "node_modules", "package.json", "package-lock.json"],
    )
    assert (home / ".npm").exists() is False  # the real home never got npm's cache: the sandbox home did


def test_pip_install_into_a_venv_twice(home: Path, tmp_path: Path) -> None:
    ws = tmp_path / "pipws"
    ws.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(ws / "v")], check=True)
    for attempt in ("cold", "warm"):
        r, took = run(
            home,
            ws,
            "--allow",
            "pypi",
            "--",
            str(ws / "v/bin/pip"),
            "install",
            "--no-input",
            "--force-reinstall",
            "six",
        )
        assert r.returncode == 0 and " 0 denied" in r.stderr, (attempt, r.stdout[-1500:], r.stderr[-1500:])
        print(f"\npip ({attempt}): {took:.2f} s")
    assert subprocess.run([str(ws / "v/bin/python"), "-c", "import six"]).returncode == 0


def test_uv_pip_install_twice(home: Path, tmp_path: Path) -> None:
    ws = tmp_path / "uvws"
    ws.mkdir()
    tools = ws / "tools"  # inside the workspace: the sandbox's /tmp is its own
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
    # uv itself comes from PyPI (outside the sandbox: installing the client is not the test).
    subprocess.run([str(tools / "bin/pip"), "install", "-q", "uv"], check=True, timeout=300)
    for attempt in ("cold", "warm"):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(ws / "v")], check=True)
        r, took = run(
            home,
            ws,
            "--allow",
            "pypi",
            "--",
            str(tools / "bin/uv"),
            "pip",
            "install",
            "--python",
            str(ws / "v/bin/python"),
            "six",
        )
        assert r.returncode == 0 and " 0 denied" in r.stderr, (attempt, r.stdout[-1500:], r.stderr[-1500:])
        print(f"\nuv ({attempt}): {took:.2f} s")


def test_apt_get_download_hostname_twice(home: Path, tmp_path: Path) -> None:
    if shutil.which("apt-get") is None:
        pytest.fail("apt-get is not installed on this machine", pytrace=False)
    twice(home, tmp_path, "apt", "debian", ["apt-get", "download", "hostname"], reset=["sh", "-c", "rm -f *.deb"])


def test_a_registry_off_the_list_is_named_in_the_summary(home: Path, tmp_path: Path) -> None:
    ws = tmp_path / "denied"
    ws.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(ws / "v")], check=True)
    r, took = run(
        home,
        ws,
        "--allow",
        "npm",
        "--",
        str(ws / "v/bin/pip"),
        "download",
        "--no-deps",
        "--retries",
        "0",
        "-d",
        str(ws),
        "six",
    )
    assert r.returncode != 0
    named = [x for x in r.stderr.splitlines() if x.startswith("sandgate: denied pypi.org:443")]
    assert named and "--allow pypi" in named[0], r.stderr
    print(f"\npip against a denied registry gave up after {took:.2f} s")
