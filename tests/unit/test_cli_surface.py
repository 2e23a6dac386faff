"""Issue 26 items 3-5, the pure parts: did-you-mean, the user config's place under everything else,
which bundled list `audit suggest` chooses and why, and the explain renderer naming every rule."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import didyoumean, explain
from launcher.audit.suggest import suggest
from launcher.config import bundled, userconfig, yamlfile
from launcher.config import load as lpolicy
from launcher.config.checks import Checks
from launcher.config.errors import PolicyFileError
from netguard import audit
from netguard import policy as netpolicy
from netguard.audit import Record
from netguard.credentials import Credential
from sgbase.origin import Origin

from ..support.audit_records import dec, real_bundled

# ---- did you mean ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "expected"),
    [("pipy", "pypi"), ("pypy", "pypi"), ("npn", "npm"), ("gihtub", "github"), ("ubunut", "ubuntu"), ("xyz", None)],
)
def test_a_close_bundled_name_is_guessed_a_far_one_is_not(word: str, expected: str | None) -> None:
    assert didyoumean.guess(word, bundled.bundled_names()) == expected


def test_a_subcommand_typo_becomes_one_line_with_a_guess() -> None:
    msg = "argument command: invalid choice: 'rnu' (choose from 'proxy', 'run', 'explain')"
    assert didyoumean.invalid_choice(msg) == "no command 'rnu'; did you mean 'run'? (choose from proxy, run, explain)"
    assert didyoumean.invalid_choice("argument command: invalid choice: 'zzzz' (choose from 'run')") is None
    assert didyoumean.invalid_choice("unrecognized arguments: --x") is None


# ---- the user config: where, who may own it, and below the rest -----------------------------


def test_the_user_config_is_xdg_then_home_and_under_sudo_the_callers(tmp_path: Path) -> None:
    assert userconfig.path({"XDG_CONFIG_HOME": "/x/cfg"}, euid=1000) == Path("/x/cfg/sandgate/config.yaml")
    relative = userconfig.path({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}, euid=1000)
    assert relative == Path(os.path.expanduser("~")) / ".config/sandgate/config.yaml"  # a relative XDG is ignored
    import pwd

    me = pwd.getpwuid(os.getuid())
    env = {"SUDO_UID": str(me.pw_uid or 1), "XDG_CONFIG_HOME": "/root/.config"}
    if me.pw_uid == 0:  # root: a sudo caller that exists, else nothing to read
        caller = next((p for p in pwd.getpwall() if p.pw_uid != 0), None)
        assert caller is not None
        env["SUDO_UID"] = str(caller.pw_uid)
        assert userconfig.path(env, euid=0) == Path(caller.pw_dir) / ".config/sandgate/config.yaml"
    assert userconfig.owners(env, euid=0) == {0, int(env["SUDO_UID"])}
    assert userconfig.owners(env, euid=1000) == {0, 1000}  # SUDO_UID means nothing when not root


def _stat(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


def test_a_user_config_someone_else_could_write_is_unsafe() -> None:
    mine = frozenset({0, 1000})
    assert userconfig.unsafe(_stat(1000, stat.S_IFREG | 0o644), mine) is None
    assert "writable by group or others" in str(userconfig.unsafe(_stat(1000, stat.S_IFREG | 0o666), mine))
    assert "writable by group or others" in str(userconfig.unsafe(_stat(1000, stat.S_IFREG | 0o620), mine))
    assert "owned by uid 1001" in str(userconfig.unsafe(_stat(1001, stat.S_IFREG | 0o600), mine))
    assert "writable" in str(userconfig.unsafe(_stat(1000, stat.S_IFDIR | 0o777), mine))


def _cred(host: str, origin: Origin) -> Credential:
    return Credential(host, "Authorization", "Bearer ${K}", "K", None, origin)


def test_the_user_config_yields_single_values_and_keeps_its_rules() -> None:
    user = netpolicy.NetworkPolicy(
        allow=(netpolicy.parse_host_pattern("a.test", None, Origin("user"), 1),),
        deny=(netpolicy.parse_host_pattern("d.test", None, Origin("user"), 2),),
        resolver=("192.0.2.1", 53),
        resolver_origin=Origin("user", 3),
        credentials=(_cred("api.test", Origin("user", 4)), _cred("other.test", Origin("user", 5))),
    )
    ws = netpolicy.NetworkPolicy(resolver=("192.0.2.2", 53), credentials=(_cred("api.test", Origin("ws", 1)),))
    under = userconfig.below(user, [ws])
    assert under.allow == user.allow and under.deny == user.deny
    assert under.resolver is None and [str(c.origin) for c in under.credentials] == ["user:5"]
    assert netpolicy.merge([ws, under]).resolver == ("192.0.2.2", 53)  # no conflict: the workspace's wins
    assert userconfig.below(user, []) == user


def _config(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "cfg" / "sandgate"
    d.mkdir(parents=True, mode=0o700)
    f = d / "config.yaml"
    f.write_text(text)
    f.chmod(0o600)
    return f


def test_deny_beats_a_user_config_allow_and_a_user_deny_stays(tmp_path: Path) -> None:
    from netguard import rules

    f = _config(tmp_path, "version: 1\nnetwork:\n  allow: [a.test, b.test]\n  deny: [c.test]\n")
    pol = lpolicy.build_policy([], ["c.test"], ["b.test"], user=f, checks=Checks())
    rs = rules.compile_policy(pol.network)
    assert rules.decide(rs, "a.test", 443).allowed  # the user's default allow applies
    assert not rules.decide(rs, "b.test", 443).allowed  # the command line's deny beats it
    assert not rules.decide(rs, "c.test", 443).allowed  # and the user's deny beats the command line's allow
    assert pol.sources[-1] == f"user config {f}" and f.absolute() in pol.read  # held read-only inside a run


def test_a_broken_user_config_names_file_and_line(tmp_path: Path) -> None:
    f = _config(tmp_path, "version: 1\nnetwork:\n  allow:\n    - a.test\n  alow: []\n")
    with pytest.raises(PolicyFileError, match=rf"^{f}:5: unknown key 'network.alow'"):
        lpolicy.build_policy([], [], [], user=f, checks=Checks())


# ---- audit suggest: passthrough unless the run inspected ----------------------------------------


def _inspected(host: str, cid: str) -> list[Record]:
    """An allowed connection and one request on it: the request record says it was inspected."""
    return [
        dec("t", host, 443, id=cid),
        audit.request_record("t", cid, "http", "allow", host, 443, "GET", "/p", status=200),
    ]


def test_suggest_prefers_the_passthrough_list_after_a_plain_run() -> None:
    recs = [dec("t", "registry.npmjs.org", 443, id="c1")]
    text = suggest(recs, bundled=real_bundled("npm", "npm-readonly"))
    assert yamlfile.parse_yaml(text, "suggested")["include"] == ["npm"]
    line = next(x for x in text.splitlines() if x.startswith("  - npm"))
    assert "passthrough, not inspected" in line and "chosen over npm-readonly" in line and "registry.npmjs.org" in line


def test_suggest_keeps_the_inspecting_list_when_the_run_inspected() -> None:
    recs = _inspected("registry.npmjs.org", "c1")
    text = suggest(recs, bundled=real_bundled("npm", "npm-readonly"))
    assert yamlfile.parse_yaml(text, "suggested")["include"] == ["npm-readonly"]
    assert "(inspected, as the runs were); chosen over npm\n" in text


def test_every_suggested_host_says_why() -> None:
    text = suggest([dec("t", "other.test", 443), dec("t", "odd.test", 8443)], bundled=real_bundled("npm"))
    assert re.search(r"- other\.test +# no bundled list allows it: 1 connection", text)
    assert re.search(r"- \{host: odd\.test, ports: \[8443\]\} +# its ports are listed", text)


# ---- explain: every rule, by origin; credentials by name only ---------------------------------


def test_explain_lines_name_every_host_of_a_bundled_list_and_no_secret(tmp_path: Path) -> None:
    pol = lpolicy.build_policy([], ["pypi", "npm-readonly"], ["evil.test"], checks=Checks())
    lines = explain.network_lines(pol, learn=False, ask=False, approvals=None)
    text = "\n".join(lines)
    for name in ("pypi", "npm-readonly"):
        path = bundled.bundled_path(name)
        assert path is not None
        doc = yamlfile.policy_document(path.read_bytes(), name)
        for entry in doc["network"]["allow"]:
            host = entry if isinstance(entry, str) else entry["host"]
            assert f"  {host}  (" in text, host
    assert "evil.test  (any port)  command line" in text
    assert "registry.npmjs.org: read-only" in text  # an inspected host and its request rules
    creds = netpolicy.NetworkPolicy(credentials=(_cred("api.test", Origin("p.yaml", 3)),))
    cl = explain.network_lines(lpolicy.Policy(creds, ("p.yaml",)), False, False, None)
    assert any("api.test: header Authorization from $K" in x for x in cl)


# ---- the command line itself: explain, completion, typos (nothing here starts a sandbox) ----------

REPO = Path(__file__).resolve().parents[2]


def _sandgate(tmp: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp / "cfg")}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, cwd=tmp, env=env, check=False
    )


def _bundled_hosts(name: str) -> list[str]:
    path = bundled.bundled_path(name)
    assert path is not None
    doc = yamlfile.policy_document(path.read_bytes(), name)
    return [e if isinstance(e, str) else e["host"] for e in doc["network"]["allow"]]


def test_explain_json_names_every_host_of_the_lists_given(tmp_path: Path) -> None:
    r = _sandgate(tmp_path, "explain", "--json", "--allow", "pypi", "--allow", "npm-readonly", "--deny", "x.test")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    allowed = [a["host"] for a in doc["network"]["allow"]]
    assert allowed == [*_bundled_hosts("pypi"), *_bundled_hosts("npm-readonly")]
    assert doc["network"]["deny"] == [{"host": "x.test", "ports": None, "origin": "command line"}]
    assert doc["network"]["inspected"] == ["registry.npmjs.org", "registry.yarnpkg.com"]
    assert doc["filesystem"]["writable"][0] == str(tmp_path) and doc["command"] == []


def test_explain_names_the_corporate_proxy_and_the_collector_but_none_of_their_secrets(tmp_path: Path) -> None:
    def explain(env: dict[str, str]) -> str:
        base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
        r = subprocess.run(
            [sys.executable, "-m", "launcher.cli", "explain", "--allow", "pypi"],
            capture_output=True, text=True, cwd=tmp_path, env={**base, **env}, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout

    out = explain(
        {
            "HTTPS_PROXY": "http://alice:proxy-pw-1@proxy.sandgate.test:3128",
            "NO_PROXY": "intranet.test",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.sandgate.test",
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=collector-key-2",
        }
    )
    assert "corporate proxy: tunnels via http://proxy.sandgate.test:3128" in out and "NO_PROXY: intranet.test" in out
    assert "decisions exported to: https://otel.sandgate.test/v1/logs (http/protobuf; headers: api-key)" in out
    assert "proxy-pw-1" not in out and "alice" not in out and "collector-key-2" not in out
    plain = explain({})
    assert "corporate proxy: none" in plain and "decisions exported to: the audit log only" in plain


def test_completion_bash_is_a_script_bash_accepts_that_completes_list_names(tmp_path: Path) -> None:
    r = _sandgate(tmp_path, "completion", "bash")
    assert r.returncode == 0, r.stderr
    script = tmp_path / "sandgate.bash"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        probe = (
            f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; "
            f'COMP_POINT=${{#COMP_LINE}}; _shtab_sandgate sandgate {words[-1]} {words[-2]}; printf "%s\\n" "${{COMPREPLY[@]}}"'
        )
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    assert complete("sandgate", "run", "--allow", "py") == ["pypi", "pypi-readonly"]
    assert complete("sandgate", "explain", "--allow", "npm") == ["npm", "npm-readonly"]
    assert complete("sandgate", "r") == ["run"]  # subcommands too
    for shell in ("zsh", "fish"):
        out = _sandgate(tmp_path, "completion", shell)
        assert out.returncode == 0 and "pypi-readonly" in out.stdout, out.stderr


def test_typos_of_commands_and_lists_get_one_line_with_a_guess(tmp_path: Path) -> None:
    for args, line in (
        (["rnu"], "no command 'rnu'; did you mean 'run'?"),
        (["audit", "sugest"], "no command 'sugest'; did you mean 'suggest'?"),
        (["explain", "--allow", "pipy"], "no bundled list 'pipy'; did you mean 'pypi'?"),
    ):
        r = _sandgate(tmp_path, *args)
        assert r.returncode == 125 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"sandgate: error: {line}"), r.stderr


def test_a_broken_or_unsafe_user_config_is_one_line(tmp_path: Path) -> None:
    f = _config(tmp_path, "version: 1\nnetwork:\n  allow: [a.test]\n  deny: 3\n")
    r = _sandgate(tmp_path, "explain")
    assert r.returncode == 125 and r.stderr == f"sandgate: error: {f}:4: 'network.deny' must be a list\n"
    f.write_text("version: 1\nnetwork:\n  allow: [a.test]\n")
    f.chmod(0o646)
    r = _sandgate(tmp_path, "explain")
    assert r.returncode == 125 and "is writable by group or others" in r.stderr
    f.chmod(0o600)
    r = _sandgate(tmp_path, "explain")
    assert r.returncode == 0 and "a.test  (ports 80,443)  " in r.stdout and f"user config {f}" in r.stdout


def test_a_run_imports_none_of_these_commands(tmp_path: Path) -> None:
    """Issue 25: a warm start is mostly imports; explain, completion and the guesses are not on run's path."""
    code = (
        "import json, sys\n"
        "from launcher import cli\n"
        f"args = cli.build_parser('run').parse_args(['run', '-q', '--audit-log', '{tmp_path}/a.jsonl', '--', 'true'])\n"
        "from launcher.run import launch, options\n"
        "options.build(cli.run_args(args))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    modules = set(json.loads(out.stdout))
    assert "launcher.run.launch" in modules and "launcher.config.userconfig" in modules  # the control: it ran
    never = {
        "difflib",
        "shtab",
        "launcher.explain",
        "launcher.cliparsers",
        "launcher.completion",
        "launcher.didyoumean",
    }
    assert not modules & never
