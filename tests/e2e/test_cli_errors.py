"""The CLI's contract with scripts: one-line errors with exit 125, and readiness as JSON on --ready-fd."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
SANDGATE = [sys.executable, "-m", "launcher.cli"]


def _env(tmp: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp), "XDG_STATE_HOME": str(tmp / "st")}


def _sandgate(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SANDGATE, *args], capture_output=True, text=True, cwd=tmp, env=_env(tmp), timeout=60, check=False
    )


def test_user_mistakes_are_one_line_and_exit_125(tmp_path: Path) -> None:
    for args in (("run",), ("proxy", "--allow", "a.test", "--listen", "1:99999"), ("proxy", "--ready-fd", "97")):
        r = _sandgate(tmp_path, *args)
        assert r.returncode == 125, (args, r.stderr)
        assert r.stderr.startswith("sandgate: error: ") and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_bad_ready_fd_is_refused_before_anything_listens(tmp_path: Path) -> None:
    r = _sandgate(tmp_path, "proxy", "--allow", "a.test", "--ready-fd", "97", "--audit-log", str(tmp_path / "a"))
    assert r.returncode == 125 and "--ready-fd 97 is not an open file descriptor" in r.stderr
    assert not (tmp_path / "a").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_proxy_readiness_is_one_json_line_on_the_ready_fd(tmp_path: Path) -> None:
    port, audit = _free_port(), tmp_path / "audit.jsonl"
    r, w = os.pipe()
    args = ["proxy", "--allow", "a.test", "--listen", f"127.0.0.1:{port}", "--audit-log", str(audit)]
    proc = subprocess.Popen(
        [*SANDGATE, *args, "--ready-fd", str(w)],
        pass_fds=(w,),
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    os.close(w)
    try:
        data = b""
        deadline = time.monotonic() + 30
        while (left := deadline - time.monotonic()) > 0 and select.select([r], [], [], left)[0]:
            chunk = os.read(r, 4096)
            if not chunk:
                break  # closed after the line: EOF is part of the contract
            data += chunk
        assert data.count(b"\n") == 1, (data, proc.poll())
        assert json.loads(data) == {"ready": True, "listen": [f"regular@127.0.0.1:{port}"], "audit": str(audit)}
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # ready means accepting
    finally:
        os.close(r)
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert b"sandgate: proxy ready on regular@127.0.0.1:" in err  # the human line stays
    assert f"sandgate: 0 allowed, 0 denied -> {audit}".encode() in err  # the exit line `sandgate run` prints


def test_a_deleted_current_directory_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    for args in (("run", "--", "true"), ("audit", "summary"), ("verify", "--only", "process")):
        p = subprocess.Popen(
            [*SANDGATE, *args],
            cwd=gone,
            env=_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=gone.rmdir,  # removed after the child entered it: its cwd no longer exists
        )
        _, err = p.communicate(timeout=60)
        assert p.returncode == 125 and "Traceback" not in err, (args, err)
        assert (
            err
            == "sandgate: error: the current directory no longer exists; cd to an existing directory and run again\n"
        )
        gone.mkdir()
