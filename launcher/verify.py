"""`sandgate verify`: prove the boundary on this machine, with this kernel and this policy.

Builds a disposable world (a network namespace with canary servers that log everything they
see; run by an ordinary user, inside a user namespace of its own), plants host state for the
probes to reach for (a SysV segment, a key, the file handle of a fake key), and runs the probe
runner (launcher/probes.py, probes_host.py) inside a real `sandgate run`, from the command
itself, a grandchild and a setsid daemon, in two passes: the command as root inside and as an
unprivileged command (the rows' "identity"). Every probe is judged twice: by what the probe
saw, and by what the canaries or the host saw. A blocked probe whose marker reached a canary,
or that left a trace on the host, is a failure, whatever the probe thought.

Nothing leaves the world: its namespace has no route out, every canary lives inside it, and
everything is removed afterwards (also on Ctrl-C).
"""

from __future__ import annotations

import json
import os
import pty
import pwd
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

from fsguard.policy import DEFAULT_READ_DENY
from launcher import probes, probes_host, probes_review
from launcher.world import DUMMY_IF, World

REPO = Path(__file__).resolve().parent.parent
ALLOWED, BLOCKED, ROGUE = "198.51.100.10", "198.51.100.20", "198.51.100.54"
ALLOWED_HOST, BLOCKED_HOST = "allowed.verify.test", "blocked.verify.test"
LOOPBACK_HOST, METADATA_HOST, EXFIL = "loopback.verify.test", "metadata.verify.test", "exfil.verify.test"
WILD_DOMAIN = "wild.verify.test"  # allowed only as *.wild.verify.test: A/AAAA forwarded, TXT/NULL/MX refused
#: An address the world (the proxy host) holds outside TEST-NET-2, so not exempt from the own-address veto.
OWN_IP, OWN_HOST = "203.0.113.77", "own.verify.test"
IDENTITIES = ("root", "user")
TCP_PORT, UDP_PORT, QUIC_PORT, OTHER_PORT, HOST_LOOPBACK_PORT = 9000, 9999, 443, 8080, 2222
RUN_TIMEOUT = 150.0
SECRET_ENV, VISIBLE_ENV = "SANDGATE_VERIFY_TOKEN", "SANDGATE_VERIFY_VISIBLE"
FALLBACK_PYTHONS = ("/usr/bin/python3", "/bin/python3")

POLICY = f"""\
# sandgate verify's own policy: the canaries it may reach (merged with any --policy given)
version: 1
network:
  allow:
    - {ALLOWED_HOST}
    - {LOOPBACK_HOST}     # allowed name that resolves to 127.0.0.1: the SSRF guard must refuse it
    - {METADATA_HOST}     # allowed name that resolves to 169.254.169.254
    - {OWN_HOST}          # allowed name that resolves to {OWN_IP}, an address of the proxy host itself
    - "*.{WILD_DOMAIN}"   # a wildcard: only address types may be asked for below it
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
    identity: str = "root"  # who the command was inside the sandbox: "root" (uid 0) or "user" (no privilege)

    def as_text(self) -> str:
        mark = "ok  " if self.ok else ("SKIP" if self.observed == "unsupported" else "FAIL")
        line = (
            f"{mark} {self.group:<10} {self.probe:<24} {self.context:<10} {self.identity:<4} "
            f"expected {self.expected:<9} observed {self.observed}"
        )
        return line + (f"\n       evidence: {self.evidence}" if not self.ok and self.evidence else "")


class VerifyError(Exception):
    pass


@dataclass(frozen=True)
class Pass:
    """One run of the probe set: who the command is inside, and whose files it works on."""

    identity: str  # "root" | "user": the rows' identity, and the markers' tag
    run_args: tuple[str, ...]  # how `sandgate run` is told (--user ...)
    uid: int  # owner of the pass's workspace, home and outside files: the command's host ids,
    gid: int  # so that only sandgate (never file modes) keeps the command out
    python: str  # an interpreter this command can execute (root's may live under a 0700 /root)
    name_home: bool  # sandgate knows another home (--user NAME): name the fake home's secrets for it


def _passes() -> list[Pass]:
    """Root verify: CMD as root (the default) and as `nobody`; rootless: as root inside (--user 0) and as itself."""
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        return [
            Pass("root", ("--user", "0"), uid, gid, sys.executable, False),
            Pass("user", (), uid, gid, sys.executable, False),
        ]
    nobody = pwd.getpwnam("nobody")
    return [
        Pass("root", (), 0, 0, sys.executable, False),
        Pass("user", ("--user", "nobody"), nobody.pw_uid, nobody.pw_gid, _python_for(nobody), True),
    ]


def _python_for(user: pwd.struct_passwd) -> str:
    """The first interpreter `user` can run the probes with (stdlib only, Python >= 3.10)."""
    check = "import sys, launcher.probes; sys.exit(sys.version_info < (3, 10))"
    for python in (sys.executable, *FALLBACK_PYTHONS):
        try:
            r = subprocess.run(
                [python, "-c", check],
                user=user.pw_uid,
                group=user.pw_gid,
                extra_groups=[],
                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                cwd="/",
                capture_output=True,
                timeout=30,
            )
        except OSError:
            continue
        if r.returncode == 0:
            return python
    raise VerifyError(
        f"no Python >= 3.10 that user {user.pw_name} can run the probes with "
        f"(tried {sys.executable}, {', '.join(FALLBACK_PYTHONS)}; {REPO} must be readable)"
    )


def _markers(probe: str, mark: str) -> tuple[str, ...]:
    """How a probe's traffic is recognised in canary logs (see launcher/probes.py); mark = <context>-<tag>."""
    return (
        f"/verify/{mark}/{probe}",
        f"verify:{mark}:{probe}",
        f"{probe}-{mark}.".replace("_", "-"),
        f"{probe}-{mark}.",
    )


#: Probes whose correct outcome sends the marker to the *allowed* host (the name wins over the
#: address): only the blocked host's canaries count as evidence against them.
NAME_WINS = ("sni_spoof", "host_mismatch")


def _canary_hits(world: World, probe: str, mark: str) -> list[dict[str, Any]]:
    markers = _markers(probe, mark)
    if probe == "dns_smuggling":  # letter case is its channel too: the name as the probe spelled it
        markers += (f'"{probes_review.case_name(ALLOWED_HOST, mark)}"',)
    hits = []
    for server in world.servers:
        if probe in NAME_WINS and server.ip != BLOCKED:
            continue
        for rec in server.log_records():
            text = json.dumps(rec)
            if any(m in text for m in markers):
                hits.append({"server": f"{server.kind} {server.name} {server.address}", **rec})
    return hits


def _sandbox_view() -> list[str]:
    """The sandbox has a private /tmp: make sandgate's own code visible if it is installed under /tmp."""
    return ["--write", str(REPO)] if str(REPO).startswith("/tmp/") else []


def run_verify(policies: list[Path], only: str | None = None) -> list[Row]:
    """Root: the world is named network namespaces; anyone else: a world in a user namespace of its own."""
    passes = _passes()
    scratch = Path(tempfile.mkdtemp(prefix="sandgate-verify-", dir="/var/tmp"))
    scratch.chmod(0o755)  # the unprivileged pass's command must reach its own tree below
    sockdir = Path(tempfile.mkdtemp(prefix="sandgate-verify-", dir="/tmp"))
    sockdir.chmod(0o755)  # like an ssh-agent dir a user could enter: only sandgate may keep the probe out
    try:
        with World(prefix="sandgate-v") as w:
            return _in_world(w, scratch, sockdir, policies, only, passes)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(scratch))  # the fake homes' sandbox layers go with them
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def _build_world(w: World, scratch: Path, sockdir: Path, token: str) -> dict[str, Any]:
    """Fake hosts and canaries, shared by every pass; returns their part of the probes' spec."""
    # A routing host is the worst case: without sandgate's rules, packets would reach the canaries.
    w.admin(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    w.add_host(ALLOWED_HOST, ALLOWED)
    w.add_host(BLOCKED_HOST, BLOCKED)
    w.add_host(LOOPBACK_HOST, "127.0.0.1")
    w.add_host(METADATA_HOST, "169.254.169.254")
    for kind, ip, port, name in (
        ("http", ALLOWED, 80, ALLOWED_HOST),
        ("https", ALLOWED, 443, ALLOWED_HOST),
        ("tcp", ALLOWED, OTHER_PORT, ALLOWED_HOST),
        ("http", BLOCKED, 80, BLOCKED_HOST),
        ("https", BLOCKED, 443, BLOCKED_HOST),
        ("tcp", BLOCKED, TCP_PORT, BLOCKED_HOST),
        ("udp", BLOCKED, UDP_PORT, BLOCKED_HOST),
        ("udp", BLOCKED, QUIC_PORT, BLOCKED_HOST),
        ("dns", ROGUE, 53, "rogue-resolver"),
        ("http", "127.0.0.1", 80, "loopback"),
        # the sandgate host's own loopback services: inside, 127.0.0.1 is the sandbox's
        ("tcp", "127.0.0.1", HOST_LOOPBACK_PORT, "host-loopback"),
        ("udp", "127.0.0.1", HOST_LOOPBACK_PORT, "host-loopback"),
    ):
        w.serve(kind, ip, port, name)
    abstract = f"sandgate-verify-{token}"
    path_sock = sockdir / "agent.sock"
    w.serve_unix("abstract", abstract, "abstract-socket")  # the host's netns: where X11 and D-Bus listen
    w.serve_unix("unix", str(path_sock), "path-socket")
    _control_unix(w, ["\0" + abstract, str(path_sock)])
    _own_address_canary(w)
    for ctx in probes.CONTEXTS:  # the canary answers exact names only: the controls of wildcard_dns_types
        for who in IDENTITIES:
            w.add_host(_wild_control(ctx, who), ALLOWED)
    dev, dev_path = probes_host.root_device()
    return {
        "allowed_host": ALLOWED_HOST,
        "allowed_ip": ALLOWED,
        "blocked_host": BLOCKED_HOST,
        "blocked_ip": BLOCKED,
        "tcp_port": TCP_PORT,
        "udp_port": UDP_PORT,
        "quic_port": QUIC_PORT,
        "other_port": OTHER_PORT,
        "rogue_resolver": ROGUE,
        "exfil_domain": EXFIL,
        "rebind_loopback_host": LOOPBACK_HOST,
        "rebind_metadata_host": METADATA_HOST,
        "host_loopback_port": HOST_LOOPBACK_PORT,
        "abstract_socket": abstract,
        "path_socket": str(path_sock),
        "secret_env": SECRET_ENV,
        "visible_env": f"{VISIBLE_ENV}={token}",
        "world_netns": str(w.netns_file(scratch / "world-netns")),
        "root_dev": list(dev),
        "root_dev_path": dev_path,
        "wild_domain": WILD_DOMAIN,
        "wild_ip": ALLOWED,
        "rebind_own_host": OWN_HOST,
    }


def _wild_control(ctx: str, who: str) -> str:
    return probes_review.wild_control_name(probes.dns_label(f"wildcard_dns_types-{ctx}-{who}"), WILD_DOMAIN)


OWN_CONTROL = """\
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(f"http://{sys.argv[1]}/verify/control/rebind_own_address", timeout=5) as r:
    assert r.status == 200 and sys.argv[2].encode() in r.read(4096), r.status
"""


def _own_address_canary(w: World) -> None:
    """An http canary on an address the world holds outside TEST-NET-2 (the own-address veto's case);
    outside the sandbox it answers, so a refusal inside is the proxy's doing."""
    w.admin(["ip", "addr", "add", f"{OWN_IP}/32", "dev", DUMMY_IF])
    w.add_host(OWN_HOST, OWN_IP)
    w.serve("http", OWN_IP, 80, OWN_HOST)
    r = w.run([sys.executable, "-c", OWN_CONTROL, OWN_IP, f"hello from {OWN_HOST}"])
    if r.returncode != 0:
        raise VerifyError(f"the canary on {OWN_IP} does not answer even without the sandbox: {r.stderr.strip()[-300:]}")


def _in_world(
    w: World, scratch: Path, sockdir: Path, policies: list[Path], only: str | None, passes: list[Pass]
) -> list[Row]:
    token = uuid.uuid4().hex[:10]
    shared = _build_world(w, scratch, sockdir, token)
    policy = scratch / "verify.yaml"
    policy.write_text(POLICY)
    policy.chmod(0o644)
    planted = probes_host.Planted.plant(token)
    rows: list[Row] = []
    try:
        planted.controls()
        for p in passes:
            rows += _run_pass(
                w, p, scratch / p.identity, {**shared, **planted.spec()}, [policy, *policies], only, planted, token
            )
    finally:
        planted.remove()
    return rows


def _make_tree(base: Path, secret: str, p: Pass) -> tuple[Path, Path, Path]:
    """The pass's workspace (a git checkout), fake home with a fake key, and an outside directory."""
    ws, home, outside = base / "ws", base / "home", base / "outside"
    for d in (ws / "results", home / ".ssh", outside):
        d.mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(secret + "\n")
    (home / ".bashrc").write_text("# verify\n")
    (outside / "victim.txt").write_text("original\n")
    for args in (["init", "-q"], ["config", "user.email", "verify@sandgate.test"], ["config", "user.name", "verify"]):
        subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True)
    if (p.uid, p.gid) != (os.getuid(), os.getgid()):  # the user's own files: no file mode keeps it out
        for d in (base, ws, home, outside):
            for path in (d, *d.rglob("*")):
                os.lchown(path, p.uid, p.gid)
    base.chmod(0o755)
    return ws, home, outside


def _run_pass(
    w: World,
    p: Pass,
    base: Path,
    shared: dict[str, Any],
    policies: list[Path],
    only: str | None,
    planted: probes_host.Planted,
    token: str,
) -> list[Row]:
    secret = f"FAKE-KEY-{token}"
    ws, home, outside = _make_tree(base, secret, p)
    key = home / ".ssh" / "id_ed25519"
    handle = probes_host.file_handle(key)
    _handle_control(handle, secret)
    shutil.copy(w.ca_pem, ws / "ca.pem")
    staged = probes_review.Staged.stage(ws, home, token, p.uid, p.gid)
    staged.controls()
    daemon_token = f"sgvd{token}{p.identity[0]}"
    spec = {
        **shared,
        "ca": str(ws / "ca.pem"),
        "home": str(home),
        "outside_file": str(outside / "victim.txt"),
        "outside_dir": str(outside),
        "secret_marker": secret,
        "results_dir": str(ws / "results"),
        "daemon_token": daemon_token,
        "python": p.python,
        "only": only,
        "marker_tag": p.identity,
        "ssh_key_handle": handle,
        **staged.spec(),
    }
    (ws / "spec.json").write_text(json.dumps(spec))
    # nobody's passwd home is not the fake one: tell sandgate the same secret paths its default
    # rules (DEFAULT_READ_DENY) would hide in a home it knew.
    deny = [a for d in DEFAULT_READ_DENY for a in ("--read-deny", d.replace("~", str(home), 1))] if p.name_home else []
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "-q",
        *p.run_args,
        *deny,
        *_sandbox_view(),
        *(a for pol in policies for a in ("--policy", str(pol.resolve()))),
        "--audit-log",
        str(staged.audit_log),
        "--",
        p.python,
        "-m",
        "launcher.probes",
        str(ws / "spec.json"),
    ]
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
        SECRET_ENV: secret,
        VISIBLE_ENV: token,
        **staged.env(),
    }
    if os.environ.get("SANDGATE_INTERNAL_WEAKEN"):
        env["SANDGATE_INTERNAL_WEAKEN"] = os.environ["SANDGATE_INTERNAL_WEAKEN"]
    out, err, code = _run_on_a_terminal(w, cmd, ws, env)
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not results:
        raise VerifyError(f"the probe runner ({p.identity}) produced no results (exit {code}): {err.strip()[-500:]}")
    host = {**planted.evidence(ws, p.identity), **staged.evidence()}
    # ~ is the sandbox's own overlay (writes inside succeed there): the real dotfile must be untouched.
    if (rc := (home / ".bashrc").read_text(errors="replace")) != "# verify\n":
        host["write_outside", "*"] = f"the real ~/.bashrc changed: {rc[-120:]!r}"
        (home / ".bashrc").write_text("# verify\n")
    rows = [_judge(w, r, p.identity, host) for r in results if only is None or r["group"] == only]
    if only in (None, "process"):
        rows.append(_daemon_row(daemon_token, ws / "results" / f"daemon-{daemon_token}.heartbeat", p.identity))
    if only in (None, "filesystem"):
        rows.append(_untrusted_row(w, p, base, home, secret, token))
    return rows


UNTRUSTED, AUDIT_UNTRUSTED = "untrusted_workspace_policy", "audit-untrusted.jsonl"
UNTRUSTED_POLICY = f"""\
# a checkout's own policy, never trusted: every key here would widen the sandbox
version: 1
network:
  allow:
    - {BLOCKED_HOST}
    - cidr: 0.0.0.0/1
    - cidr: 128.0.0.0/1
env:
  keep: ["*"]
filesystem:
  write: ["~"]
"""
UNTRUSTED_SCRIPT = """\
import json, os, socket, sys, urllib.error, urllib.request
host, ip, path, secret, visible = sys.argv[1:6]
out = {"secret_in": sorted(k for k, v in os.environ.items() if secret in v), "visible": visible in os.environ}
def get(opener, url):
    try:
        with opener.open(url, timeout=5) as r:
            return f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
out["by name, proxy variables"] = get(urllib.request.build_opener(), f"http://{host}{path}")
out["by name, transparent"] = get(urllib.request.build_opener(urllib.request.ProxyHandler({})), f"http://{host}{path}")
try:
    with socket.create_connection((ip, 80), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n".encode())
        out["by IP"] = s.recv(64).decode(errors="replace").split("\\r\\n")[0] or "closed"
except Exception as e:
    out["by IP"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _untrusted_row(w: World, p: Pass, base: Path, home: Path, secret: str, token: str) -> Row:
    """Outside the probe run: `sandgate run` WITHOUT --policy in a scratch checkout whose own .sandgate.yaml
    allows the blocked host, every IPv4 address, every variable and the home. Untrusted, only what it
    forbids may apply: the blocked canary sees nothing, the secret stays out, and sandgate says so."""
    ws = base / "untrusted"
    ws.mkdir()
    (ws / ".sandgate.yaml").write_text(UNTRUSTED_POLICY)
    audit = ws / AUDIT_UNTRUSTED  # like the probe run's: never under a home sandgate may not know
    audit.touch()
    for path in (ws, ws / ".sandgate.yaml", audit):
        os.lchown(path, p.uid, p.gid)
    mark = f"untrusted-{p.identity}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "-q",
        *p.run_args,
        *_sandbox_view(),
        "--audit-log",
        str(audit),
        "--",
        p.python,
        "-c",
        UNTRUSTED_SCRIPT,
        BLOCKED_HOST,
        BLOCKED,
        f"/verify/{mark}/{UNTRUSTED}",
        secret,
        VISIBLE_ENV,
    ]
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
        SECRET_ENV: secret,
        VISIBLE_ENV: token,
    }
    try:
        r = w.run(cmd, cwd=ws, env=env, timeout=90)
        out, err = r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        out, err = str(e.stdout or ""), f"timed out after 90 s; {e.stderr or ''}"
    seen = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    hits = _canary_hits(w, UNTRUSTED, mark)
    notice = next((line for line in err.splitlines() if "is not trusted" in line), "")
    if hits:
        observed, evidence = (
            "permitted",
            "canary saw it: " + "; ".join(json.dumps(h, sort_keys=True)[:300] for h in hits[:3]),
        )
    elif seen and seen[0]["secret_in"]:
        observed, evidence = "permitted", f"{SECRET_ENV} reached the command as {', '.join(seen[0]['secret_in'])}"
    elif not seen:
        observed, evidence = "unsupported", f"the command reported nothing: {err.strip()[-300:]}: cannot tell"
    elif not seen[0]["visible"]:
        observed, evidence = "unsupported", f"the control variable {VISIBLE_ENV} is missing inside: cannot tell"
    elif not notice:
        observed, evidence = "unsupported", f"no 'is not trusted' notice from sandgate: {err.strip()[-300:]}"
    else:
        tries = "; ".join(f"{k}: {v}" for k, v in seen[0].items() if k not in ("secret_in", "visible"))
        observed, evidence = "blocked", f"{tries}; secret absent; {notice[:200]}"
    return Row("filesystem", UNTRUSTED, "child", "blocked", observed, observed == "blocked", evidence, p.identity)


def _handle_control(handle: dict[str, Any], secret: str) -> None:
    """Outside, the handle opens the key (where we may): so a refusal inside is the sandbox's doing."""
    if os.geteuid() != 0:
        return  # open_by_handle_at needs CAP_DAC_READ_SEARCH: an ordinary user cannot run the control
    fh = probes_host.handle_from_spec(handle)
    observed, detail = probes.attempt(probes_host.read_by_handle, "/", fh, secret)
    if observed != "permitted" or "read the secret" not in detail:
        raise VerifyError(f"the file handle of the fake key does not open outside the sandbox: {detail}")


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
        p = w.popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_take_terminal,
        )
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


def _judge(w: World, r: dict[str, Any], tag: str, host: dict[tuple[str, str], str]) -> Row:
    """The probe's view, overruled by what the canaries or the host saw for a blocked probe."""
    probe, ctx, expected, observed = r["probe"], r["context"], r["expected"], r["observed"]
    evidence = r.get("detail", "")
    hits = _canary_hits(w, probe, f"{ctx}-{tag}") if r["group"] == "network" else []
    seen = host.get((probe, ctx)) or host.get((probe, "*"))
    if probe == "dns_smuggling" and observed == "blocked" and not _allowed_query_seen(w):
        observed, evidence = (
            "unsupported",
            f"no query for {ALLOWED_HOST} reached the DNS canary: cannot tell; {evidence}",
        )
    if probe == "wildcard_dns_types" and observed == "blocked" and not _qname_seen(w, _wild_control(ctx, tag)):
        observed, evidence = "unsupported", f"the control A query never reached the DNS canary: cannot tell; {evidence}"
    if expected == "blocked" and hits:
        observed = "permitted"
        evidence = "canary saw it: " + "; ".join(json.dumps(h, sort_keys=True)[:300] for h in hits[:3])
    elif expected == "blocked" and seen:
        observed, evidence = "permitted", f"the host shows it: {seen}; probe: {evidence}"
    ok = observed == expected
    return Row(r["group"], probe, ctx, expected, observed, ok, evidence, tag)


def _allowed_query_seen(w: World) -> bool:
    """The control of dns_smuggling: allowed queries reach the world's DNS canary at all."""
    return _qname_seen(w, ALLOWED_HOST)


def _qname_seen(w: World, name: str) -> bool:
    return w.dns is not None and any(r.get("qname") == name for r in w.dns.log_records("dns"))


def _daemon_row(token: str, heartbeat: Path, identity: str) -> Row:
    """After the run: the daemon must be gone, and must have stopped reaching anything."""
    alive = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout.split()
    before = heartbeat.read_text() if heartbeat.exists() else ""
    time.sleep(1.2)
    after = heartbeat.read_text() if heartbeat.exists() else ""
    still_writing = after != before
    observed = "permitted" if alive or still_writing else "blocked"
    evidence = (f"processes {alive} still running" if alive else "") + (
        " heartbeat still growing" if still_writing else ""
    )
    return Row(
        "process", "daemon_after_run", "daemon", "blocked", observed, observed == "blocked", evidence.strip(), identity
    )


def coverage_markdown() -> str:
    """The README's "What the boundary covers" table, generated from the probe list."""
    lines = ["| group | probe | expected | what it tries |", "|---|---|---|---|"]
    for p in probes.ordered():
        where = "" if p.contexts == frozenset(probes.CONTEXTS) else f" ({', '.join(sorted(p.contexts))} only)"
        lines.append(f"| {p.group} | `{p.name}` | {p.expected} | {p.threat.rstrip('.')}{where} |")
    lines.append(
        "| process | `daemon_after_run` | blocked | a setsid daemon started by the task is still running, "
        "or still reaching the network, after `sandgate run` returned |"
    )
    lines.append(
        f"| filesystem | `{UNTRUSTED}` | blocked | a checkout's own untrusted `.sandgate.yaml` allows the "
        "blocked host, every IPv4 address, every variable and the home: a separate `sandgate run` "
        "without --policy |"
    )
    return "\n".join(lines) + "\n"


def main(policies: list[Path], as_json: bool, only: str | None) -> int:
    rows = run_verify(policies, only)
    if as_json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        for r in rows:
            print(r.as_text())
        bad = [r for r in rows if not r.ok]
        print(
            f"\n{len(rows) - len(bad)} of {len(rows)} probes behaved as expected"
            + (f"; {len(bad)} did not" if bad else "")
        )
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--coverage-markdown"]:
        sys.stdout.write(coverage_markdown())
