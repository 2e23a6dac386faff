"""REAL-REGISTRY SMOKE TEST: the one place the tests use the real network (issue 11, DEVELOPERS.md).

Through `sandgate run` with the bundled lists and default settings, the ordinary clients (npm,
npx pnpm, pip, uv, poetry, corepack, apt-get; three `npm ci` at once) install from PyPI, the npm registry and Debian's repositories
(the only registries these machines reach), each twice: the second run must work from the
sandbox home's warm cache. The clients that do not come with the machine (uv, poetry) are
installed through sandgate too. One destination off the allowlist is named in the exit summary.
Nothing else is contacted. Timings are printed (pytest -s), not asserted.

The home used here is a throwaway one (HOME points into a temporary directory outside /tmp),
seeded with a few files; after every client its tree is hashed and must be byte for byte what
it was: the caches those clients wrote live in sandgate's layer, which is removed afterwards.
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

from ..support.runner import REPO, VIEW
from ..support.trees import tree_hash

SANDGATE = [sys.executable, "-m", "launcher.cli", "run", *VIEW]  # VIEW: this interpreter, under a /tmp checkout
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


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
    # What a real home holds where these clients write: the sandbox may read it, never change it.
    for rel, text in (
        (".bashrc", "# smoke\n"),
        (".cache/README", "real cache\n"),
        (".local/share/x", "x\n"),
        (".config/pip/pip.conf.example", "[global]\n"),
    ):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    had_daemon = _daemon("status") == 0  # this runs in the host's namespace: someone's daemon may be up
    try:
        yield d
    finally:
        if not had_daemon:
            _daemon("stop")  # the one these runs started: leave no process behind
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(d))
        shutil.rmtree(d, ignore_errors=True)


def run(
    home: Path, ws: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    # The machine's own settings (CA bundles, pip's index...) are what "as set up here" means.
    full = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8", **(env or {})}
    # A client that ships its own roots (uv, node, requests' certifi) trusts the machine's registry
    # mirror only through these; a bare CI environment (env -i) may lack them: point them at the
    # system bundle, as this machine's own login environment does.
    if os.path.isfile(SYSTEM_BUNDLE):
        for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE"):
            full.setdefault(name, SYSTEM_BUNDLE)
    t0 = time.monotonic()
    r = subprocess.run([*SANDGATE, *args], cwd=ws, env=full, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def twice(
    home: Path,
    ws: Path,
    name: str,
    args: list[str],
    reset: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run `sandgate run ARGS` twice in `ws` (the second from a warm cache); the real home stays as it was."""
    ws.mkdir(exist_ok=True)
    before = tree_hash(home)
    times = []
    for attempt in ("cold", "warm"):
        r, took = run(home, ws, *args, env=env)
        assert r.returncode == 0, f"{name} ({attempt}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        assert " 0 denied" in r.stderr, r.stderr
        times.append(took)
        if reset and attempt == "cold":
            subprocess.run(reset, cwd=ws, check=True)
    print(f"\n{name}: first {times[0]:.2f} s, second (warm) {times[1]:.2f} s")
    assert tree_hash(home) == before, f"{name} changed the real home"


@pytest.fixture(scope="module")
def tools(home: Path) -> Iterator[Path]:
    """A venv with uv and poetry, installed from PyPI through sandgate (pip in the sandbox).

    It lives outside /tmp: the sandbox's /tmp is its own, so a tool under the host's /tmp is not there.
    """
    ws = Path(tempfile.mkdtemp(prefix="sandgate-smoke-tools-", dir="/var/tmp"))
    try:
        # Without pip of its own (ensurepip costs ~7 s here): this interpreter's pip installs into it.
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(ws / "v")], check=True)
        pip = [sys.executable, "-m", "pip", "--python", str(ws / "v/bin/python"), "install", "-q", "uv", "poetry"]
        r, took = run(home, ws, "--allow", "pypi", "--", *pip)
        assert r.returncode == 0 and " 0 denied" in r.stderr, (r.stdout[-1500:], r.stderr[-1500:])
        print(f"\ninstalling uv and poetry through sandgate: {took:.2f} s")
        yield ws / "v/bin"
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def test_npm_install_is_number_twice(home: Path, tmp_path: Path) -> None:
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed on this machine", pytrace=False)
    npm = ["npm", "install", "--no-audit", "--no-fund", "is-number"]
    reset = ["rm", "-rf", "node_modules", "package.json", "package-lock.json"]
    twice(home, tmp_path / "npm", "npm", ["--allow", "npm", "--", *npm], reset=reset)
    assert not (home / ".npm").exists()  # npm's cache went to the sandbox's home layer


def test_pip_install_into_a_venv_twice(home: Path, tmp_path: Path) -> None:
    ws = tmp_path / "pipws"
    ws.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(ws / "v")], check=True)
    pip = [str(ws / "v/bin/pip"), "install", "--no-input", "--force-reinstall", "six"]
    twice(home, ws, "pip", ["--allow", "pypi", "--", *pip])
    assert subprocess.run([str(ws / "v/bin/python"), "-c", "import six"]).returncode == 0


def test_uv_pip_install_twice(home: Path, tmp_path: Path, tools: Path) -> None:
    ws = tmp_path / "uvws"
    ws.mkdir()
    venv = [sys.executable, "-m", "venv", "--clear", "--without-pip", str(ws / "v")]  # uv needs no pip in it
    subprocess.run(venv, check=True)
    uv = [str(tools / "uv"), "pip", "install", "--python", str(ws / "v/bin/python"), "six"]
    twice(home, ws, "uv", ["--allow", "pypi", "--", *uv], reset=venv)


def test_poetry_add_twice(home: Path, tmp_path: Path, tools: Path) -> None:
    ws = tmp_path / "poetryws"
    ws.mkdir()
    project = '[project]\nname = "smoke"\nversion = "0.1.0"\nrequires-python = ">=3.12"\ndependencies = []\n'
    project += "\n[tool.poetry]\npackage-mode = false\n"
    (ws / "pyproject.toml").write_text(project)
    # Poetry keeps its cache and the project's virtualenv under ~/.cache/pypoetry: the sandbox home's.
    reset = ["sh", "-c", f"rm -f poetry.lock && printf '%s' '{project}' > pyproject.toml"]
    twice(
        home,
        ws,
        "poetry",
        ["--allow", "pypi", "--", str(tools / "poetry"), "add", "--no-interaction", "six"],
        reset=reset,
    )


def test_npx_pnpm_install_twice(home: Path, tmp_path: Path) -> None:
    """Issue 23: pnpm through npx once failed with registry 403s when one lookup was lost."""
    if shutil.which("npx") is None:
        pytest.fail("npx is not installed on this machine", pytrace=False)
    ws = tmp_path / "pnpm"
    ws.mkdir()
    (ws / "package.json").write_text('{"name": "t", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}}')
    reset = ["rm", "-rf", "node_modules", "pnpm-lock.yaml"]
    twice(home, ws, "npx pnpm install", ["--allow", "npm", "--", "npx", "--yes", "pnpm@9.15.0", "install"], reset)
    assert (ws / "node_modules" / "is-number" / "package.json").is_file()


def test_three_concurrent_npm_ci(home: Path, tmp_path: Path) -> None:
    """Issue 23: 2 of 3 concurrent `npm ci` once failed (a shared overlay upper dir, lost lookups)."""
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed on this machine", pytrace=False)
    deps = '{"name": "t", "version": "1.0.0", "dependencies": {"is-number": "7.0.0", "is-odd": "3.0.1"}}'
    first = tmp_path / "ci0"
    first.mkdir()
    (first / "package.json").write_text(deps)
    lock = ["--allow", "npm", "--", "npm", "install", "--package-lock-only", "--no-audit", "--no-fund"]
    r, _ = run(home, first, *lock)
    assert r.returncode == 0, r.stderr[-2000:]
    before = tree_hash(home)
    procs = []
    full = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    if os.path.isfile(SYSTEM_BUNDLE):
        full.setdefault("NODE_EXTRA_CA_CERTS", SYSTEM_BUNDLE)
    for i in range(3):
        ws = tmp_path / f"ci{i + 1}"
        ws.mkdir()
        shutil.copy(first / "package.json", ws)
        shutil.copy(first / "package-lock.json", ws)
        argv = [*SANDGATE, "--allow", "npm", "--", "npm", "ci", "--no-audit", "--no-fund"]
        procs.append((ws, subprocess.Popen(argv, cwd=ws, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for ws, p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and b" 0 denied" in err, (out[-1500:], err[-1500:])
        assert (ws / "node_modules" / "is-odd" / "package.json").is_file()
    assert tree_hash(home) == before, "npm ci changed the real home"


def test_cold_npm_ci_through_npm_readonly(home: Path, tmp_path: Path) -> None:
    """Issue 25: a cold `npm ci` of express + chalk (77 packages) through the inspected `npm-readonly` once
    stalled for ever after ~70 requests (the 6th request of each kept-alive connection never left)."""
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed on this machine", pytrace=False)
    ws = tmp_path / "readonly"
    ws.mkdir()
    (ws / "package.json").write_text('{"name": "t", "version": "1.0.0", "dependencies": {"express": "^4.21.0", '
                                     '"chalk": "^4.1.2"}}')  # fmt: skip
    r, _ = run(home, ws, "--allow", "npm", "--", "npm", "install", "--package-lock-only", "--no-fund")
    assert r.returncode == 0, r.stderr[-2000:]
    cold = ["npm", "ci", "--no-fund", "--cache", str(ws / ".cold-cache")]  # an empty cache: every tarball fetched
    r, took = run(home, ws, "--allow", "npm-readonly", "--", *cold, timeout=120)
    assert r.returncode == 0 and " 0 denied" in r.stderr, (r.stdout[-1500:], r.stderr[-1500:])
    assert (ws / "node_modules" / "express" / "package.json").is_file()
    print(f"\ncold npm ci (express + chalk) through npm-readonly: {took:.2f} s")


def test_corepack_fetches_pnpm_twice(home: Path, tmp_path: Path) -> None:
    if shutil.which("corepack") is None:
        pytest.fail("corepack is not installed on this machine", pytrace=False)
    # The registry these machines reach serves metadata without npm's signatures, which corepack
    # checks (outside sandgate as well): the test turns that check off; the env family *_KEYS
    # would drop the variable, so the policy keeps it.
    policy = tmp_path / "corepack.yaml"
    policy.write_text("version: 1\nenv:\n  keep: [COREPACK_INTEGRITY_KEYS]\n")
    env = {"COREPACK_INTEGRITY_KEYS": "0", "COREPACK_ENABLE_DOWNLOAD_PROMPT": "0"}
    args = ["--policy", str(policy), "--allow", "npm", "--", "corepack", "pnpm@9.15.0", "--version"]
    twice(home, tmp_path / "corepack", "corepack", args, env=env)


def test_apt_get_download_hostname_twice(home: Path, tmp_path: Path) -> None:
    if shutil.which("apt-get") is None:
        pytest.fail("apt-get is not installed on this machine", pytrace=False)
    args = ["--allow", "debian", "--", "apt-get", "download", "hostname"]
    twice(home, tmp_path / "apt", "apt", args, reset=["sh", "-c", "rm -f *.deb"])


def test_a_registry_off_the_list_is_named_in_the_summary(home: Path, tmp_path: Path) -> None:
    ws = tmp_path / "denied"
    ws.mkdir()
    r, took = run(
        home,
        ws,
        "--allow",
        "npm",
        "--",
        sys.executable,  # this interpreter's pip: a fresh venv's ensurepip would cost ~7 s
        "-m",
        "pip",
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
