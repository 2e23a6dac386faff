"""Issue 13, brokered credentials on the launcher's side: where the secret comes from, the errors
when it cannot be used, the sandbox's environment (sentinel in, real value nowhere), the hidden
credential file, the policy check that a credential is reachable, and trust narrowing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fsguard import env as fsenv
from launcher.config import trust
from launcher.config.checks import Checks
from launcher.config.errors import PolicyFileError
from launcher.config.load import build_policy
from launcher.run import brokered, confinement, options
from netguard.credentials import Credential

REAL = "sk-live-REALSECRET-0123456789abcdef"


def _creds(tmp_path: Path, text: str) -> tuple[Credential, ...]:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return build_policy([p], [], [], checks=Checks()).network.credentials


def _policy(cred: str, allow: str = "    - host: api.example.test\n") -> str:
    return f"version: 1\nnetwork:\n  allow:\n{allow}  credentials:\n{cred}"


ENV_CRED = '    - host: api.example.test\n      value: "Bearer ${EXAMPLE_KEY}"\n'


def test_the_secret_comes_from_the_launchers_environment(tmp_path: Path) -> None:
    (c,) = _creds(tmp_path, _policy(ENV_CRED))
    b = brokered.resolve((c,), {"EXAMPLE_KEY": REAL})
    (s,) = b.secrets
    assert (s.host, s.header, s.value, s.real, s.variable) == (
        "api.example.test",
        "Authorization",
        f"Bearer {REAL}",
        REAL,
        "EXAMPLE_KEY",
    )
    assert re.fullmatch(r"sk-sandgate-sentinel-[0-9a-f]{32}", s.sentinel)  # the vendor prefix survives
    assert b.env == {"EXAMPLE_KEY": s.sentinel} and b.files == ()
    assert REAL not in s.sentinel and str(s.origin).endswith("policy.yaml:6")
    again = brokered.resolve((c,), {"EXAMPLE_KEY": REAL})
    assert again.secrets[0].sentinel != s.sentinel  # per run


def test_a_missing_or_empty_secret_names_the_line_and_the_variable(tmp_path: Path) -> None:
    (c,) = _creds(tmp_path, _policy(ENV_CRED))
    for env in ({}, {"EXAMPLE_KEY": ""}):
        with pytest.raises(PolicyFileError) as e:
            brokered.resolve((c,), env)
        assert str(e.value) == f"{c.origin}: credential for api.example.test needs $EXAMPLE_KEY (set it, or give file:)"
        assert str(c.origin).endswith("policy.yaml:6")


def _file_cred(path: str) -> str:
    return f'    - host: api.example.test\n      value: "token ${{NPM_TOKEN}}"\n      file: {path}\n'


def test_the_secret_comes_from_a_file_under_home_less_one_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".config").mkdir()
    f = tmp_path / ".config" / "token"
    f.write_text("npm_fromfile0123456789 \n")
    f.chmod(0o600)
    (c,) = _creds(tmp_path, _policy(_file_cred("~/.config/token")))
    b = brokered.resolve((c,), {"NPM_TOKEN": "ignored-when-a-file-is-given"})
    assert b.secrets[0].real == "npm_fromfile0123456789 " and b.secrets[0].value == "token npm_fromfile0123456789 "
    assert b.files == (str(f),) and b.env == {"NPM_TOKEN": b.secrets[0].sentinel}


@pytest.mark.parametrize("problem", ["group-writable", "world-writable", "directory", "fifo", "other-owner", "missing"])
def test_an_unsafe_credential_file_is_refused_in_one_line(tmp_path: Path, problem: str) -> None:
    f = tmp_path / "token"
    if problem == "directory":
        f.mkdir()
    elif problem == "fifo":
        os.mkfifo(f)
    elif problem != "missing":
        f.write_text("secret-0123456789abcdef\n")
        f.chmod({"group-writable": 0o620, "world-writable": 0o602}.get(problem, 0o600))
        if problem == "other-owner":
            if os.geteuid() != 0:
                pytest.skip("chown to another user needs root")
            os.chown(f, 65534, 65534)
    (c,) = _creds(tmp_path, _policy(_file_cred(str(f))))
    with pytest.raises(PolicyFileError) as e:
        brokered.resolve((c,), {})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{c.origin}: credential file {f} for api.example.test ")
    want = {
        "group-writable": "writable by others",
        "world-writable": "writable by others",
        "other-owner": "owned by another user",
        "directory": "not a regular file",
        "fifo": "not a regular file",
        "missing": "cannot be read: No such file",
    }[problem]
    assert want in msg
    # The control: the same file, made safe, is used.
    if problem in ("group-writable", "world-writable", "other-owner"):
        os.chown(f, os.geteuid(), os.getegid())
        f.chmod(0o600)
        assert brokered.resolve((c,), {}).secrets[0].real == "secret-0123456789abcdef"


@pytest.mark.parametrize("secret", ["x", "sk-short", "a" * 15])
def test_a_secret_shorter_than_sixteen_characters_is_refused_in_one_line(tmp_path: Path, secret: str) -> None:
    """Issue 24: with `x` every request holding an x was an attempted leak and every x of a response masked."""
    (c,) = _creds(tmp_path, _policy(ENV_CRED))
    with pytest.raises(PolicyFileError) as e:
        brokered.resolve((c,), {"EXAMPLE_KEY": secret})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{c.origin}: credential $EXAMPLE_KEY for api.example.test: ")
    assert f"the secret is {len(secret)} character" in msg and "at least 16" in msg
    assert brokered.resolve((c,), {"EXAMPLE_KEY": secret + "p" * 16}).secrets  # the control: long enough


def test_the_sentinel_keeps_a_vendor_prefix_and_nothing_else_of_the_secret(tmp_path: Path) -> None:
    (c,) = _creds(tmp_path, _policy(ENV_CRED))
    for real, kept in (("REALSECRET-0123456789abcdef", ""), ("ghp_" + "Z" * 36, "ghp_"), (REAL, "sk-")):
        (s,) = brokered.resolve((c,), {"EXAMPLE_KEY": real}).secrets
        assert re.fullmatch(re.escape(kept) + r"sandgate-sentinel-[0-9a-f]{32}", s.sentinel), (real, s.sentinel)


def test_one_variable_for_two_hosts_gets_one_sentinel(tmp_path: Path) -> None:
    cred = ENV_CRED + '    - host: b.example.test\n      value: "Bearer ${EXAMPLE_KEY}"\n'
    allow = "    - host: api.example.test\n    - host: b.example.test\n"
    creds = _creds(tmp_path, _policy(cred, allow))
    b = brokered.resolve(creds, {"EXAMPLE_KEY": REAL})
    assert len({s.sentinel for s in b.secrets}) == 1 and len(b.secrets) == 2


def test_the_sandbox_env_holds_the_sentinel_and_no_real_value(tmp_path: Path) -> None:
    (c,) = _creds(tmp_path, _policy(ENV_CRED))
    caller = {"EXAMPLE_KEY": REAL, "COPY": f"x{REAL}y", "PATH": "/usr/bin", "LABEL": "fine"}
    b = brokered.resolve((c,), caller)
    env, dropped = fsenv.filter_env(caller)
    assert "EXAMPLE_KEY" in dropped and "COPY" in env  # the plain filter drops the name, misses the copy
    env, dropped = brokered.apply_env(env, dropped, b)
    assert env == {"EXAMPLE_KEY": b.secrets[0].sentinel, "PATH": "/usr/bin", "LABEL": "fine"}
    assert dropped == ["COPY"]  # recorded by name (never value); the variable itself is not dropped: it is brokered
    assert not any(REAL in v for v in env.values())


def test_a_credential_file_is_hidden_inside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    opts = options.RunOptions(cmd=["true"], audit_path=tmp_path / "a.jsonl", user=None)
    secret = str(tmp_path / "tok")
    eff = confinement._effective(opts, str(tmp_path), tmp_path / "rt", (secret,))
    assert secret in eff.read_deny
    assert secret not in confinement._effective(opts, str(tmp_path), tmp_path / "rt").read_deny


@pytest.mark.parametrize(
    "allow",
    [
        "    - host: other.test\n",
        "    - host: api.example.test\n      ports: [8443]\n",
    ],
)
def test_a_credential_no_rule_reaches_on_443_is_an_error_at_its_line(tmp_path: Path, allow: str) -> None:
    with pytest.raises(PolicyFileError) as e:
        _creds(tmp_path, _policy(ENV_CRED, allow))
    line = len(allow.splitlines()) + 5
    assert str(e.value).endswith(
        f"policy.yaml:{line}: credential for api.example.test would never be used: no allow rule reaches "
        "api.example.test on port 443; allow it (e.g. '- host: api.example.test') or remove the credential"
    )


def test_a_credential_reached_through_a_wildcard_or_denied_host(tmp_path: Path) -> None:
    assert _creds(tmp_path, _policy(ENV_CRED, '    - host: "*.example.test"\n'))
    denied = _policy(ENV_CRED, '    - host: "*.example.test"\n') + "  deny: [api.example.test]\n"
    with pytest.raises(PolicyFileError, match="would never be used"):
        _creds(tmp_path, denied)


def test_an_untrusted_workspace_policy_brokers_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path / "ws")  # the trust list lives outside the workspace
    Path(".sandgate.yaml").write_text(_policy(ENV_CRED) + "  deny: [evil.test]\n")
    store = trust.Store(tmp_path / "state")
    pol = build_policy([], [], [], workspace=Path(".sandgate.yaml"), store=store, checks=Checks())
    assert pol.network.credentials == () and [r.value for r in pol.network.deny] == ["evil.test"]
    assert pol.narrowed is not None and "network.credentials" in pol.narrowed.ignored
    assert "network.credentials" in pol.narrowed.notice()
    # The control: once trusted, the same file brokers its credential.
    store.add([(Path(".sandgate.yaml"), Path(".sandgate.yaml").read_bytes())])
    pol = build_policy([], [], [], workspace=Path(".sandgate.yaml"), store=store, checks=Checks())
    assert [c.host for c in pol.network.credentials] == ["api.example.test"] and pol.narrowed is None
