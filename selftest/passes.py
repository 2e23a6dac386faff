"""One pass of the probe set: who the command is inside, its workspace, home and outside files, its
spec, and the `sandgate run` of the probe runner; root verify runs the command as root and as
`nobody`, rootless verify as root inside (--user 0) and as itself."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from fsguard.policy import DEFAULT_READ_DENY
from netguard.daemon import control
from netguard.decision import limits
from selftest import fakenet, inspectnet, otherdaemon
from selftest.configstage import ConfigStage
from selftest.errors import VerifyError
from selftest.fakenet import SECRET_ENV, VISIBLE_ENV, WorldFacts
from selftest.hostrows import DAEMON_AFTER_RUN
from selftest.judge import Row, daemon_row, judge
from selftest.otherdaemon import OtherDaemon
from selftest.planted import Planted, file_handle
from selftest.probes.core import Record, attempt
from selftest.probes.host import handle_from_spec, read_by_handle
from selftest.selection import Selection
from selftest.sidecar import Sidecar, VictimRun
from selftest.spec import FileHandleSpec, VerifySpec, dump_spec
from selftest.staged import Staged
from selftest.terminal import run_on_a_terminal
from selftest.world import World

#: The checkout or install holding the `selftest` and `launcher` packages: the probes' and canaries' PYTHONPATH.
REPO = Path(__file__).resolve().parents[1]
FALLBACK_PYTHONS = ("/usr/bin/python3", "/bin/python3")
HOG_EXTRA = 256  # silent connections the starvation probe opens past its share: all must be refused
Evidence = tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]  # (seen, missing) for the judge


@dataclass(frozen=True)
class Pass:
    """One run of the probe set: who the command is inside, and whose files it works on."""

    identity: str  # "root" | "user": the rows' identity, and the markers' tag
    run_args: tuple[str, ...]  # how `sandgate run` is told (--user ...)
    uid: int  # owner of the pass's workspace, home and outside files: the command's host ids,
    gid: int  # so that only sandgate (never file modes) keeps the command out
    python: str  # an interpreter this command can execute (root's may live under a 0700 /root)
    name_home: bool  # sandgate knows another home (--user NAME): name the fake home's secrets for it


def passes() -> list[Pass]:
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
    check = "import sys, selftest.probes; sys.exit(sys.version_info < (3, 10))"
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


def sandbox_view() -> list[str]:
    """The sandbox has a private /tmp: make sandgate's own code visible if it is installed under /tmp."""
    return ["--write", str(REPO)] if str(REPO).startswith("/tmp/") else []


def side_run(p: Pass, audit: Path, *flags: str) -> list[str]:
    """`sandgate run` for a row of its own beside the probe run (untrusted, front door), up to and with `--`."""
    return [sys.executable, "-m", "launcher.cli", "run", "-q", *p.run_args, *sandbox_view(), *flags,
            "--audit-log", str(audit), "--"]  # fmt: skip


def side_tree(p: Pass, ws: Path, audit_name: str, *owned: Path) -> Path:
    """Such a row's workspace (made, with `owned` files in it, the pass's own) and its audit log, which lives
    there like the probe run's: never under a home sandgate may not know."""
    audit = ws / audit_name
    audit.touch()
    for path in (ws, *owned, audit):
        os.lchown(path, p.uid, p.gid)
    return audit


def side_output(w: World, cmd: list[str], ws: Path, env: dict[str, str]) -> tuple[str, str]:
    """Such a row's command run: its stdout and stderr (a timeout said in the latter)."""
    try:
        r = w.run(cmd, cwd=ws, env=env, timeout=90)
        return r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        said = e.stderr if isinstance(e.stderr, str) else ""  # text mode: str, or None
        return str(e.stdout or ""), f"timed out after 90 s; {said}"


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


def base_env(home: Path, secret: str, token: str) -> dict[str, str]:
    """The environment `sandgate run` is started with: the fake home, and the secret it must keep out."""
    return {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
        SECRET_ENV: secret,
        VISIBLE_ENV: token,
    }


@dataclass(frozen=True)
class PassFiles:
    """The pass's files, made by make_tree and staged for it."""

    ws: Path
    home: Path
    outside: Path
    handle: FileHandleSpec


def _pass_spec(
    p: Pass, files: PassFiles, facts: WorldFacts, planted: Planted, staged: Staged, token: str, only: Selection
) -> VerifySpec:
    """Everything the probes of this pass are told: the one place the spec is assembled."""
    ws, home, outside = files.ws, files.home, files.outside
    return VerifySpec(
        allowed_host=fakenet.ALLOWED_HOST,
        allowed_ip=fakenet.ALLOWED,
        blocked_host=fakenet.BLOCKED_HOST,
        blocked_ip=fakenet.BLOCKED,
        tcp_port=fakenet.TCP_PORT,
        udp_port=fakenet.UDP_PORT,
        quic_port=fakenet.QUIC_PORT,
        other_port=fakenet.OTHER_PORT,
        host_loopback_port=fakenet.HOST_LOOPBACK_PORT,
        rogue_resolver=fakenet.ROGUE,
        exfil_domain=fakenet.EXFIL,
        rebind_loopback_host=fakenet.LOOPBACK_HOST,
        rebind_metadata_host=fakenet.METADATA_HOST,
        rebind_own_host=fakenet.OWN_HOST,
        wild_domain=fakenet.WILD_DOMAIN,
        wild_ip=fakenet.ALLOWED,
        abstract_socket=facts.abstract_socket,
        path_socket=facts.path_socket,
        world_netns=facts.world_netns,
        git_url=f"https://{inspectnet.GIT_HOST}{inspectnet.REPO_PATH}",
        git_head=facts.inspect.git_head,
        api_host=inspectnet.API_HOST,
        other_host=inspectnet.OTHER_HOST,
        cred_env=inspectnet.CRED_ENV,
        cred_prefix=inspectnet.CRED_PREFIX,
        cred_sha256=facts.inspect.secret_sha256,
        passthrough_sha256=facts.inspect.passthrough_sha256,
        root_dev=facts.root_dev,
        root_dev_path=facts.root_dev_path,
        shm_id=planted.shm_id,
        host_key=planted.key,
        host_key_description=planted.key_description,
        ssh_key_handle=files.handle,
        ca=str(ws / "ca.pem"),
        home=str(home),
        outside_file=str(outside / "victim.txt"),
        outside_dir=str(outside),
        results_dir=str(ws / "results"),
        secret_marker=secret_of(token),
        secret_env=SECRET_ENV,
        visible_env=f"{VISIBLE_ENV}={token}",
        daemon_token=_daemon_token(token, p),
        python=p.python,
        marker_tag=p.identity,
        only=only.runner_only(),
        cred_marker=staged.cred_marker,
        home_control=staged.home_control,
        env_marker=staged.env_marker,
        plain_env=staged.plain_env,
        audit_log=str(staged.audit_log),
    )


def secret_of(token: str) -> str:
    """The fake key's secret: the one string no probe may get out."""
    return f"FAKE-KEY-{token}"


def _daemon_token(token: str, p: Pass) -> str:
    return f"sgvd{token}{p.identity[0]}"


def _sandgate_run(p: Pass, home: Path, policies: list[Path], audit_log: Path, upstream_ca: Path) -> list[str]:
    """`sandgate run ... --` as this pass's identity: the probe runner's, and the starvation probe's victim's."""
    # nobody's passwd home is not the fake one: tell sandgate the same secret paths its default
    # rules (DEFAULT_READ_DENY) would hide in a home it knew.
    deny = [a for d in DEFAULT_READ_DENY for a in ("--read-deny", d.replace("~", str(home), 1))] if p.name_home else []
    return [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "-q",
        *p.run_args,
        *deny,
        *sandbox_view(),
        *(a for pol in policies for a in ("--policy", str(pol.resolve()))),
        "--audit-log",
        str(audit_log),
        "--upstream-ca",  # the inspected upstreams' certificates come from the world's CA
        str(upstream_ca),
        "--",
    ]


def _prepare(w: World, p: Pass, base: Path, token: str) -> tuple[PassFiles, Staged]:
    """The pass's tree, the handle of its fake key, and what staged.py puts in place; with their controls."""
    ws, home, outside = _make_tree(base, secret_of(token), p)
    handle = file_handle(home / ".ssh" / "id_ed25519")
    _handle_control(handle, secret_of(token))
    shutil.copy(w.ca_pem, ws / "ca.pem")
    staged = Staged.stage(ws, home, token, p.uid, p.gid)
    staged.controls()
    return PassFiles(ws, home, outside, handle), staged


def run_pass(
    w: World,
    p: Pass,
    base: Path,
    facts: WorldFacts,
    policies: list[Path],
    only: Selection,
    planted: Planted,
    token: str,
) -> list[Row]:
    """Run the probes as this pass's identity and judge every record; plus the daemon row."""
    files, staged = _prepare(w, p, base, token)
    ws, home = files.ws, files.home
    spec = _pass_spec(p, files, facts, planted, staged, token, only)
    # the brokered credential's real value: in sandgate's environment, never in the sandbox's
    env = {**base_env(home, secret_of(token), token), **staged.env(), inspectnet.CRED_ENV: facts.inspect.real_secret}
    if os.environ.get("SANDGATE_INTERNAL_WEAKEN"):
        env["SANDGATE_INTERNAL_WEAKEN"] = os.environ["SANDGATE_INTERNAL_WEAKEN"]
    out, err, code, shared = _run_probes(w, p, base, spec, env, policies, staged.audit_log, only)
    results: list[Record] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not results:
        raise VerifyError(f"the probe runner ({p.identity}) produced no results (exit {code}): {err.strip()[-500:]}")
    daemon_log = control.runtime_base(env, os.geteuid()) / "daemon.log"  # where this run's daemon writes
    seen = inspectnet.evidence(facts.inspect, p.identity, w.servers, [staged.audit_log, daemon_log])
    host = {**planted.evidence(ws, p.identity), **staged.evidence(), **seen.seen}
    missing = dict(seen.missing)
    for shown, lacking in shared:
        host.update(shown)
        missing.update({k: v for k, v in lacking.items() if k not in missing})
    # ~ is the sandbox's own overlay (writes inside succeed there): the real dotfile must be untouched.
    if (rc := (home / ".bashrc").read_text(errors="replace")) != "# verify\n":
        host["write_outside", "*"] = f"the real ~/.bashrc changed: {rc[-120:]!r}"
        (home / ".bashrc").write_text("# verify\n")
    rows = [judge(w, r, p.identity, host, missing) for r in results if only.wants(r["group"], r["probe"])]
    if only.wants("process", DAEMON_AFTER_RUN):
        heartbeat = ws / "results" / f"daemon-{spec.daemon_token}.heartbeat"
        rows.append(daemon_row(spec.daemon_token, heartbeat, p.identity))
    return rows


def _run_probes(
    w: World,
    p: Pass,
    base: Path,
    spec: VerifySpec,
    env: dict[str, str],
    policies: list[Path],
    audit: Path,
    only: Selection,
) -> tuple[str, str, int, list[Evidence]]:
    """The probe runner in its sandbox, with issue 22's company: another daemon of the command's uid
    before it starts, the sidecar (victim sandbox, the daemon's memory) while it runs; their evidence."""
    other = OtherDaemon.start(w, base, p.uid, p.gid, p.python) if only.wants("network", otherdaemon.PROBE) else None
    try:
        ws = base / "ws"
        (ws / "spec.json").write_text(dump_spec(_shared_daemon(spec, other)))
        own = ConfigStage.stage(ws, w.ca_pem, p.uid, p.gid)  # issue 24: a policy and a CA in the workspace
        sg = _sandgate_run(p, base / "home", [*policies, own.policy], audit, own.ca)
        cmd = [*sg, p.python, "-m", "selftest.probes"]
        victim = _victim(p, base, policies, w.ca_pem)
        with Sidecar(w, ws / "results", victim, env, fakenet.ALLOWED_HOST) as side:
            out, err, code = run_on_a_terminal(w, [*cmd, str(ws / "spec.json")], ws, env)
        shown = [side.evidence(w, p.identity, audit), *([other.evidence()] if other else []), (own.evidence(), {})]
        return out, err, code, shown
    finally:
        if other is not None:
            other.stop()


def _shared_daemon(spec: VerifySpec, other: OtherDaemon | None) -> VerifySpec:
    """The spec with its issue-22 fields: the other daemon's socket, and the limits the probes must meet."""
    return replace(
        spec,
        other_daemon_socket=str(other.sock) if other is not None else "",
        hog_connections=limits.PER_SANDBOX + HOG_EXTRA,
        connection_share=limits.PER_SANDBOX,
        head_limit=limits.HEAD_MAX,
    )


def _victim(p: Pass, base: Path, policies: list[Path], upstream_ca: Path) -> VictimRun:
    """The starvation probe's victim: another sandbox of the same user and daemon, its own workspace and log."""
    ws = base / "victim"
    ws.mkdir()
    os.chown(ws, p.uid, p.gid)
    return VictimRun(_sandgate_run(p, base / "home", policies, base / "victim-audit.jsonl", upstream_ca), p.python, ws)


def _handle_control(handle: FileHandleSpec, secret: str) -> None:
    """Outside, the handle opens the key (where we may): so a refusal inside is the sandbox's doing."""
    if os.geteuid() != 0:
        return  # open_by_handle_at needs CAP_DAC_READ_SEARCH: an ordinary user cannot run the control
    fh = handle_from_spec(handle)
    observed, detail = attempt(read_by_handle, "/", fh, secret)
    if observed != "permitted" or "read the secret" not in detail:
        raise VerifyError(f"the file handle of the fake key does not open outside the sandbox: {detail}")
