"""`sandgate verify`: prove the boundary on this machine, with this kernel and this policy.

Builds a disposable world (a network namespace with canary servers that log everything they
see, a fake home with a fake key, a git workspace), runs the probe runner (launcher/probes.py)
inside a real `sandgate run` against it, from the command itself, a grandchild and a setsid
daemon, and judges every probe twice: by what the probe saw, and by what the canaries saw.
A blocked probe whose marker reached a canary is a failure, whatever the probe thought.

Nothing leaves the world: its namespace has no route out, every canary lives inside it, and
everything is removed afterwards (also on Ctrl-C).
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher import probes
from launcher.world import World

REPO = Path(__file__).resolve().parent.parent
ALLOWED, BLOCKED, ROGUE = "198.51.100.10", "198.51.100.20", "198.51.100.54"
ALLOWED_HOST, BLOCKED_HOST = "allowed.verify.test", "blocked.verify.test"
LOOPBACK_HOST, METADATA_HOST, EXFIL = "loopback.verify.test", "metadata.verify.test", "exfil.verify.test"
TCP_PORT, UDP_PORT, QUIC_PORT, OTHER_PORT, GATEWAY_PORT = 9000, 9999, 443, 8080, 2222
RUN_TIMEOUT = 150.0

POLICY = f"""\
# sandgate verify's own policy: the canaries it may reach (merged with any --policy given)
version: 1
network:
  allow:
    - {ALLOWED_HOST}
    - {LOOPBACK_HOST}     # allowed name that resolves to 127.0.0.1: the SSRF guard must refuse it
    - {METADATA_HOST}     # allowed name that resolves to 169.254.169.254
"""


@dataclass
class Row:
    group: str
    probe: str
    context: str
    expected: str
    observed: str
    ok: bool
    evidence: str

    def as_text(self) -> str:
        mark = "ok  " if self.ok else ("SKIP" if self.observed == "unsupported" else "FAIL")
        line = f"{mark} {self.group:<10} {self.probe:<24} {self.context:<10} expected {self.expected:<9} observed {self.observed}"
        return line + (f"\n       evidence: {self.evidence}" if not self.ok and self.evidence else "")


class VerifyError(Exception):
    pass


def _markers(probe: str, ctx: str) -> tuple[str, ...]:
    """How a probe's traffic is recognised in canary logs (see launcher/probes.py)."""
    return (f"/verify/{ctx}/{probe}", f"verify:{ctx}:{probe}", f"{probe}-{ctx}.".replace("_", "-"),
            f"{probe}-{ctx}.")


#: Probes whose correct outcome sends the marker to the *allowed* host (the name wins over the
#: address): only the blocked host's canaries count as evidence against them.
NAME_WINS = ("sni_spoof", "host_mismatch")


def _canary_hits(world: World, probe: str, ctx: str) -> list[dict[str, Any]]:
    hits = []
    for server in world.servers:
        if probe in NAME_WINS and server.ip != BLOCKED:
            continue
        for rec in server.log_records():
            text = json.dumps(rec)
            if any(m in text for m in _markers(probe, ctx)):
                hits.append({"server": f"{server.kind} {server.name} {server.address}", **rec})
    return hits


def _sandbox_view() -> list[str]:
    """The sandbox has a private /tmp: make sandgate's own code visible if it is installed under /tmp."""
    return ["--write", str(REPO)] if str(REPO).startswith("/tmp/") else []


def run_verify(policies: list[Path], only: str | None = None) -> list[Row]:
    if os.geteuid() != 0:
        raise VerifyError("sandgate verify needs root (it builds namespaces and runs sandgate run)")
    scratch = Path(tempfile.mkdtemp(prefix="sandgate-verify-", dir="/var/tmp"))
    sockdir = Path(tempfile.mkdtemp(prefix="sandgate-verify-", dir="/tmp"))
    sockdir.chmod(0o755)  # like an ssh-agent dir a user could enter: only sandgate may keep the probe out
    try:
        with World(prefix="sandgate-v") as w:
            return _in_world(w, scratch, sockdir, policies, only)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def _in_world(w: World, scratch: Path, sockdir: Path, policies: list[Path], only: str | None) -> list[Row]:
    # A routing host is the worst case: without sandgate's rules, packets would reach the canaries.
    w.run(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], check=True)
    w.add_host(ALLOWED_HOST, ALLOWED)
    w.add_host(BLOCKED_HOST, BLOCKED)
    w.add_host(LOOPBACK_HOST, "127.0.0.1")
    w.add_host(METADATA_HOST, "169.254.169.254")
    for kind, ip, port, name in (("http", ALLOWED, 80, ALLOWED_HOST), ("https", ALLOWED, 443, ALLOWED_HOST),
                                 ("tcp", ALLOWED, OTHER_PORT, ALLOWED_HOST), ("http", BLOCKED, 80, BLOCKED_HOST),
                                 ("https", BLOCKED, 443, BLOCKED_HOST), ("tcp", BLOCKED, TCP_PORT, BLOCKED_HOST),
                                 ("udp", BLOCKED, UDP_PORT, BLOCKED_HOST), ("udp", BLOCKED, QUIC_PORT, BLOCKED_HOST),
                                 ("dns", ROGUE, 53, "rogue-resolver"), ("http", "127.0.0.1", 80, "loopback"),
                                 ("tcp", "0.0.0.0", GATEWAY_PORT, "gateway-service")):
        w.serve(kind, ip, port, name)
    token = uuid.uuid4().hex[:10]
    abstract = f"sandgate-verify-{token}"
    path_sock = sockdir / "agent.sock"
    w.serve_unix("abstract", abstract, "abstract-socket")  # the host's netns: where X11 and D-Bus listen
    w.serve_unix("unix", str(path_sock), "path-socket")
    _control_unix(w, ["\0" + abstract, str(path_sock)])

    ws, home, outside = scratch / "ws", scratch / "home", scratch / "outside"
    for d in (ws / "results", home / ".ssh", outside):
        d.mkdir(parents=True)
    secret = f"FAKE-KEY-{token}"
    (home / ".ssh" / "id_ed25519").write_text(secret + "\n")
    (home / ".bashrc").write_text("# verify\n")
    (outside / "victim.txt").write_text("original\n")
    for args in (["init", "-q"], ["config", "user.email", "verify@sandgate.test"], ["config", "user.name", "verify"]):
        subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True)
    shutil.copy(w.ca_pem, ws / "ca.pem")
    daemon_token = f"sgvd{token}"
    spec = {
        "ca": str(ws / "ca.pem"), "allowed_host": ALLOWED_HOST, "allowed_ip": ALLOWED, "blocked_host": BLOCKED_HOST,
        "blocked_ip": BLOCKED, "tcp_port": TCP_PORT, "udp_port": UDP_PORT, "quic_port": QUIC_PORT,
        "other_port": OTHER_PORT, "rogue_resolver": ROGUE, "exfil_domain": EXFIL,
        "rebind_loopback_host": LOOPBACK_HOST, "rebind_metadata_host": METADATA_HOST, "gateway_port": GATEWAY_PORT,
        "abstract_socket": abstract, "path_socket": str(path_sock), "home": str(home),
        "outside_file": str(outside / "victim.txt"), "outside_dir": str(outside), "secret_env": "SANDGATE_VERIFY_TOKEN",
        "secret_marker": secret, "results_dir": str(ws / "results"), "daemon_token": daemon_token,
        "python": sys.executable, "only": only,
    }
    (ws / "spec.json").write_text(json.dumps(spec))
    policy = scratch / "verify.yaml"
    policy.write_text(POLICY)
    cmd = [sys.executable, "-m", "launcher.cli", "run", "-q", *_sandbox_view(), "--policy", str(policy),
           *(a for p in policies for a in ("--policy", str(p.resolve()))), "--audit-log", str(scratch / "audit.jsonl"),
           "--", sys.executable, "-m", "launcher.probes", str(ws / "spec.json")]
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": str(home),
           "PYTHONPATH": str(REPO), "LANG": "C.UTF-8", "SANDGATE_VERIFY_TOKEN": secret}
    if os.environ.get("SANDGATE_INTERNAL_WEAKEN"):
        env["SANDGATE_INTERNAL_WEAKEN"] = os.environ["SANDGATE_INTERNAL_WEAKEN"]
    out, err, code = _run_on_a_terminal(w, cmd, ws, env)
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not results:
        raise VerifyError(f"the probe runner produced no results (exit {code}): {err.strip()[-500:]}")
    rows = [_judge(w, r) for r in results if only is None or r["group"] == only]
    if only in (None, "process"):
        rows.append(_daemon_row(daemon_token, ws / "results" / f"daemon-{daemon_token}.heartbeat"))
    return rows


CONTROL = """\
import socket, sys
for addr in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(addr.replace("\\\\0", "\\0"))
    s.sendall(b"verify:control\\n")
    assert s.recv(64).startswith(b"unix-canary"), addr
"""


def _control_unix(w: World, addrs: list[str]) -> None:
    """Outside the sandbox the unix canaries answer: so a blocked probe means sandgate blocked it."""
    r = w.run([sys.executable, "-c", CONTROL, *(a.replace("\0", "\\0") for a in addrs)])
    if r.returncode != 0:
        raise VerifyError(f"unix socket canaries are not reachable even without the sandbox: {r.stderr.strip()[-300:]}")


def _run_on_a_terminal(w: World, cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str, int]:
    """Run sandgate on a fresh pseudo-terminal, so the terminal-injection probe has a real one to attack."""
    master, slave = pty.openpty()
    try:
        p = w.popen(cmd, cwd=cwd, env=env, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    preexec_fn=_take_terminal)  # noqa: PLW1509 - verify is single-threaded here
        os.close(slave)
        slave = -1
        deadline = time.monotonic() + RUN_TIMEOUT
        chunks: list[str] = []
        errs: list[str] = []
        assert p.stdout is not None and p.stderr is not None
        streams = {p.stdout.fileno(): chunks, p.stderr.fileno(): errs, master: []}
        while p.poll() is None or any(_readable(fd) for fd in (p.stdout.fileno(), p.stderr.fileno())):
            if time.monotonic() > deadline:
                p.kill()
                raise VerifyError(f"the probes did not finish within {RUN_TIMEOUT:.0f} s")
            ready, _, _ = select.select(list(streams), [], [], 0.5)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    streams.pop(fd)
                    continue
                streams[fd].append(data.decode(errors="replace"))
            if not ready and p.poll() is not None:
                break
        p.wait()
        return "".join(chunks), "".join(errs), p.returncode
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)


def _readable(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _take_terminal() -> None:
    """In the child, already a session leader (World.popen starts a new session): adopt the pty as terminal."""
    import fcntl
    import termios
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _judge(w: World, r: dict[str, Any]) -> Row:
    probe, ctx, expected, observed = r["probe"], r["context"], r["expected"], r["observed"]
    evidence = r.get("detail", "")
    hits = _canary_hits(w, probe, ctx) if r["group"] == "network" else []
    if expected == "blocked" and hits:
        observed = "permitted"
        evidence = "canary saw it: " + "; ".join(json.dumps(h, sort_keys=True)[:300] for h in hits[:3])
    ok = observed == expected
    return Row(r["group"], probe, ctx, expected, observed, ok, evidence)


def _daemon_row(token: str, heartbeat: Path) -> Row:
    """After the run: the daemon must be gone, and must have stopped reaching anything."""
    alive = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout.split()
    before = heartbeat.read_text() if heartbeat.exists() else ""
    time.sleep(1.2)
    after = heartbeat.read_text() if heartbeat.exists() else ""
    still_writing = after != before
    observed = "permitted" if alive or still_writing else "blocked"
    evidence = (f"processes {alive} still running" if alive else "") + (" heartbeat still growing" if still_writing else "")
    return Row("process", "daemon_after_run", "daemon", "blocked", observed, observed == "blocked", evidence.strip())


def coverage_markdown() -> str:
    """The README's "What the boundary covers" table, generated from the probe list."""
    lines = ["| group | probe | expected | what it tries |", "|---|---|---|---|"]
    for p in probes.REGISTRY.values():
        where = "" if p.contexts == frozenset(probes.CONTEXTS) else f" ({', '.join(sorted(p.contexts))} only)"
        lines.append(f"| {p.group} | `{p.name}` | {p.expected} | {p.threat.rstrip('.')}{where} |")
    lines.append("| process | `daemon_after_run` | blocked | a setsid daemon started by the task is still running, "
                 "or still reaching the network, after `sandgate run` returned |")
    return "\n".join(lines) + "\n"


def main(policies: list[Path], as_json: bool, only: str | None) -> int:
    rows = run_verify(policies, only)
    if as_json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        for r in rows:
            print(r.as_text())
        bad = [r for r in rows if not r.ok]
        print(f"\n{len(rows) - len(bad)} of {len(rows)} probes behaved as expected"
              + (f"; {len(bad)} did not" if bad else ""))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--coverage-markdown"]:
        sys.stdout.write(coverage_markdown())
