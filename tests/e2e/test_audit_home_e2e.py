"""The audit log cannot be forged from inside, wherever it lives; a home under /tmp works (issue 10).

sandgate runs inside a disposable World; each forgery attempt is judged on the host afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netguard import audit

from ..support.runner import Sandgate, env, write_policy
from ..support.world import World, new_world

FORGE = (
    'echo \'{"event":"decision","action":"allow","forged":1}\' >> {log}; '
    "true > {log}; rm -f {log}; mv {log} {log}.moved; mv $(dirname {log}) $(dirname {log}).moved; "
    "ln -sf /dev/null {log}; echo done"
)


@pytest.fixture(scope="module")
def w() -> Iterator[World]:
    with new_world() as world:
        yield world


def _run(w: World, ws: Path, *args: str, home: Path | None = None) -> tuple[int, str, str]:
    pol = write_policy(w, "version: 1\nnetwork:\n  allow: [allowed.test]\n", f"p{time.monotonic_ns()}")
    e = {**env(), "HOME": str(home or w.tmp)}
    r = Sandgate(w, policy=pol, env=e, cwd=ws).run(*args)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("where", ["explicit", "subdir", "default"])
def test_the_audit_log_inside_the_workspace_cannot_be_forged_or_removed(w: World, where: str) -> None:
    ws = w.tmp / f"ws-{where}-{time.monotonic_ns()}"
    ws.mkdir()
    if where == "default":
        code, _, err = _run(w, ws, "--", "true")  # find where the default log goes
        log = Path(err.rsplit("-> ", 1)[1].strip())
        log = log if log.is_absolute() else ws / log
        args: list[str] = []
    else:
        log = ws / ("a.jsonl" if where == "explicit" else "logs/a.jsonl")
        log.parent.mkdir(exist_ok=True)
        args = ["--audit-log", str(log)]
    before = log.read_text() if log.exists() else ""
    code, out, err = _run(w, ws, *args, "--", "sh", "-c", FORGE.replace("{log}", str(log)))
    assert code == 0 and out.strip() == "done", err
    assert log.is_file() and not log.is_symlink()
    assert not Path(f"{log}.moved").exists() and not Path(f"{log.parent}.moved").exists()
    text = log.read_text()
    assert text.startswith(before) and "forged" not in text
    recs = audit.read_records(log)  # still a valid log (every record fits its type), and this run's is in it
    assert (
        any(r["event"] == "policy" and str(log) in r["protect"] for r in recs[len(before.splitlines()) :])
        or where == "default"
    ), recs[-1]


def test_a_home_under_tmp_works_and_shows_nothing_of_the_real_one(w: World) -> None:
    home = w.tmp.parent / f"sandgate-home-{time.monotonic_ns()}"  # /tmp/...: hidden by the private /tmp
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_test").write_text("SECRET-KEY-MARKER\n")
    (home / ".bashrc").write_text("# real\n")
    ws = w.tmp / f"ws-home-{time.monotonic_ns()}"
    ws.mkdir()
    try:
        code, out, err = _run(
            w,
            ws,
            "-q",
            "--",
            "sh",
            "-c",
            "cd && pwd && ls -A && echo cache > .cachefile && cat .cachefile; "
            "cat .ssh/id_test 2>&1 | grep -c SECRET-KEY-MARKER",
            home=home,
        )
        assert code == 1 and out.split() == [str(home), "cache", "0"], (out, err)  # grep -c 0 exits 1
        assert sorted(p.name for p in home.iterdir()) == [".bashrc", ".ssh"]  # the real home is untouched
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
