"""A fake git host for the e2e tests: git's smart HTTP over TLS, served by the real `git http-backend`.

    root = gitfake.bare_repo(world.tmp / "git", "o/r.git")     # a bare repository with one commit
    fake = gitfake.start(world, "git.test", "198.51.100.71", root)
    ... `git clone https://git.test/o/r.git` in a sandbox ...
    gitfake.refs(root / "o/r.git")    # what a push would have changed

The server is tests/support/httpsfake.py's (HTTP/1.1 keep-alive and HTTP/2, every request logged)
with git-http-backend as the CGI behind it, so clone, fetch and push are the real protocol and a
push that got through really changes the repository. Pushing is enabled (http.receivepack).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from tests.support import httpsfake
from tests.support.httpsfake import Request, Response

BACKEND = "/usr/lib/git-core/git-http-backend"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "fake",
    "GIT_AUTHOR_EMAIL": "fake@git.test",
    "GIT_COMMITTER_NAME": "fake",
    "GIT_COMMITTER_EMAIL": "fake@git.test",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def cgi(root: Path) -> httpsfake.Handler:
    """A handler that runs git-http-backend for each request (CGI/1.1), the repositories under `root`."""

    def handle(req: Request) -> Response:
        path, _, query = req.target.partition("?")
        env = {
            "PATH": "/usr/bin:/bin",
            "GIT_PROJECT_ROOT": str(root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": req.method,
            "PATH_INFO": unquote(path),
            "QUERY_STRING": query,
            "CONTENT_TYPE": req.header("content-type") or "",
            "CONTENT_LENGTH": str(len(req.body)),
            "REMOTE_ADDR": "198.18.0.1",
            "REMOTE_USER": "tester",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        for name in ("content-encoding", "git-protocol"):
            value = req.header(name)
            if value is not None:
                env["HTTP_" + name.upper().replace("-", "_")] = value
        out = subprocess.run([BACKEND], input=req.body, capture_output=True, env=env, timeout=30, check=False).stdout
        return _cgi_response(out)

    return handle


def _cgi_response(out: bytes) -> Response:
    """Split a CGI reply into status, headers and body (`Status:` defaults to 200)."""
    ends = [(i, len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (i := out.find(sep)) >= 0]
    end, size = min(ends) if ends else (len(out), 0)
    head, body = out[:end], out[end + size :]
    status, headers = 200, []
    for line in head.decode("latin-1").splitlines():
        if ":" not in line:
            continue
        k, v = (x.strip() for x in line.split(":", 1))
        if k.lower() == "status":
            status = int(v.split()[0])
        else:
            headers.append((k, v))
    return Response(status, body, headers)


def bare_repo(root: Path, name: str = "o/r.git") -> Path:
    """A bare repository root/name with one commit on main (receive-pack enabled); returns root."""
    repo = root / name
    work = root / f".work-{name.replace('/', '-')}"
    repo.parent.mkdir(parents=True, exist_ok=True)
    script = f"""
        git init -q --bare -b main {repo}
        git -C {repo} config http.receivepack true
        git init -q -b main {work} && cd {work}
        echo hello > README && git add README && git commit -qm init
        git push -q {repo} main
        """
    subprocess.run(["sh", "-ec", script], check=True, capture_output=True, env={**GIT_ENV, "PATH": "/usr/bin:/bin"})
    return root


def refs(repo: Path) -> str:
    """Every ref and what it points at: equal before and after means nothing was pushed."""
    return subprocess.run(
        ["git", "-C", str(repo), "for-each-ref", "--format=%(refname) %(objectname)"],
        check=True,
        capture_output=True,
        text=True,
        env={**GIT_ENV, "PATH": "/usr/bin:/bin"},
    ).stdout


def start(world: Any, name: str, ip: str, root: Path, port: int = 443) -> httpsfake.Fake:
    """Start the git host `name` on ip:port in `world`, serving the repositories under `root`."""
    return httpsfake.start(world, name, ip, port, module=__name__, extra=["--root", str(root)])


if __name__ == "__main__":
    ap = httpsfake.parser()
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    httpsfake.serve_forever(cgi(Path(args.root)), args)
