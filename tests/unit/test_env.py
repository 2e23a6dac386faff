"""fsguard/env.py: which variables a sandboxed command never sees (issue 10), and that only names,
never values, reach the audit log and `-v`."""

from __future__ import annotations

import fnmatch
import io
import json
import os
import re
import subprocess
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsguard import env as fe

GHP = "ghp_" + "A1b2C3d4E5" * 3 + "f6G7h8"  # 36 after the prefix, like a real classic token
ISSUE_10 = {
    "OPENAI_API_KEY": "sk-proj-x",
    "ANTHROPIC_API_KEY": "x",
    "PGPASSWORD": "x",
    "MYSQL_PWD": "x",
    "DATABASE_URL": "postgres://u:pw@h/db",
    "openai_api_key": "x",
    "anthropic_api_key": "x",
    "pgpassword": "x",
    "Mysql_Pwd": "x",
}


NO_POLICY = fe.EnvPolicy()


def kept(name: str, value: str = "v", policy: fe.EnvPolicy = NO_POLICY) -> bool:
    env, dropped = fe.filter_env({name: value}, policy)
    assert (name in env) != (name in dropped)
    return name in env


def test_issue_10_secrets_go_and_the_ca_bundle_stays() -> None:
    env, dropped = fe.filter_env({**ISSUE_10, "AWS_CA_BUNDLE": "/etc/ssl/ca.pem", "PATH": "/bin"})
    assert env == {"AWS_CA_BUNDLE": "/etc/ssl/ca.pem", "PATH": "/bin"}
    assert dropped == sorted(ISSUE_10)


SECRET_NAMES = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "openai_api_key",
    "Anthropic_Api_Key",
    "API_KEY",
    "HEROKU_API_KEY",
    "GEM_HOST_API_KEY",
    "MAILGUN_APIKEY",
    "SSH_KEY",
    "STRIPE_KEY",
    "ssh_key",
    "GOOGLE_API_KEY",
    "SSH_KEY_PATH",
    "RELEASE_KEYS",
    "GOOGLE_CLOUD_KEYFILE_JSON",
    "DJANGO_SECRET_KEY",
    "CLIENT_SECRET",
    "SECRET",
    "secret",
    "GITHUB_TOKEN",
    "github_token",
    "GH_TOKEN",
    "NPM_TOKEN",
    "VAULT_TOKEN",
    "HF_TOKEN",
    "CI_JOB_TOKEN",
    "ACCESSTOKEN",
    "TOKEN",
    "TF_TOKEN_app_terraform_io",
    "GITHUB_TOKEN_2",
    "PGPASSWORD",
    "DB_PASSWORD_X",
    "TWINE_PASSWORD",
    "pgpassword",
    "LDAP_PASSWD",
    "GPG_PASSPHRASE",
    "MYSQL_PWD",
    "mysql_pwd",
    "DB_PASS",
    "DOCKER_PASS",
    "SSHPASS",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_CREDENTIALS",
    "DB_CREDS",
    "NPM_AUTH",
    "REDISCLI_AUTH",
    "NPM_CONFIG__AUTH",
    "NODE_AUTH_TOKEN",
    "DOCKER_AUTH_CONFIG",
    "SSH_AUTH_SOCK",
    "ssh_auth_sock",
    "NPM_CONFIG__AUTHTOKEN",
    "GITHUB_PAT",
    "AZURE_DEVOPS_EXT_PAT",
    "SENTRY_DSN",
    "AZURE_STORAGE_CONNECTION_STRING",
    "SQL_CONNECTION_STRING",
    "SLACK_WEBHOOK_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "aws_access_key_id",
    "AWS_CONFIG_FILE",
    "AZURE_CLIENT_ID",
    "AZURE_USERNAME",
    "ARM_CLIENT_SECRET",
    "ARM_ACCESS_KEY",
    "DIGITALOCEAN_ACCESS_TOKEN",
    "PYPI_API_TOKEN",
    "GITLAB_PRIVATE_TOKEN",
    "DOCKER_PASSWORD",
    "GPG_AGENT_INFO",
    "KUBECONFIG",
    "BW_SESSION",
    "OP_SESSION_my",
    "CLOUDSDK_AUTH_ACCESS_TOKEN",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_credential_names_are_dropped_in_any_case(name: str) -> None:
    assert not kept(name) and fe.why_dropped(name, "v") == "name"


HARMLESS_NAMES = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "LC_ALL",
    "TZ",
    "PWD",
    "OLDPWD",
    "pwd",
    "EDITOR",
    "PAGER",
    "DISPLAY",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_SESSION_TYPE",
    "DESKTOP_SESSION",
    "KEYMAP",
    "XKB_DEFAULT_LAYOUT",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "TOKENIZERS_PARALLELISM",
    "SSH_ASKPASS",
    "GIT_ASKPASS",
    "SUDO_ASKPASS",
    "BYPASS_CACHE",
    "SSH_CONNECTION",
    "SSH_TTY",
    "GPG_TTY",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "MANPATH",
    "CI",
    "GITHUB_ACTIONS",
    "GITHUB_SHA",
    "GITHUB_REPOSITORY",
    "GITHUB_WORKSPACE",
    "CI_COMMIT_REF_NAME",
    "GOOGLE_CLOUD_PROJECT",
    "NODE_ENV",
    "NPM_CONFIG_REGISTRY",
    "PIP_INDEX_URL",
    "SUDO_USER",
    "SUDO_UID",
    "SANDGATE_TEST_PLAIN",
    "LS_COLORS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "AWS_CA_BUNDLE",
    "aws_ca_bundle",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
]


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_everyday_and_well_known_names_are_kept(name: str) -> None:
    assert kept(name, "/usr/share/x") and fe.why_dropped(name, "/usr/share/x") is None


SECRET_VALUES = [
    "postgres://u:pw@h/db",
    "mysql://root:hunter2@127.0.0.1:3306/app",
    "redis://:s3cret@cache:6379/0",
    "HTTPS://USER:PASS@proxy.corp:3128",
    "amqp://guest:guest@rabbit",
    "https://x-access-token:abc@github.com/o/r",
    "mongodb+srv://admin:p%40ss@cluster0.example.net/db?retryWrites=true",
    "a,b postgres://u:pw@h/db",
    "Server=tcp:db,1433;Database=app;User ID=sa;Password=Secr3t;",
    "host=db;pwd=x",
    "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=bXlrZXk=;EndpointSuffix=core.windows.net",
    "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=abc=",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----",
    GHP,
    "token " + GHP,
    "gho_" + "a" * 36,
    "ghs_" + "Z9" * 18,
    "github_pat_11ABCDEFG0123456789_abcdefghij",
    "glpat-abcdefghij0123456789",
    "xoxb-1234567890-abcdefghij",
    "xoxp-12345-67890-abcdef",
    "sk-" + "a" * 20,
    "sk-ant-api03-" + "x" * 40,
    "sk-proj-" + "AbC_-1" * 8,
    "sk_live_" + "a1" * 12,
    "rk_test_" + "b2" * 10,
    "AKIAIOSFODNN7EXAMPLE",
    "key=ASIAY34FZKBOKMUTVV7A",
    "npm_" + "a1B2" * 9,
    "pypi-AgEIcHlwaS5vcmcCJGI0ZjE2",
    "hf_" + "AbCdEfGhIj" * 3,
    "AIzaSyA-" + "b" * 31,
    "dop_v1_" + "0f" * 32,
    "eyJhbGciOiJSUzI1NiIsImtpZCI6IiJ9.eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50In0.c2lnbmF0dXJl",
]


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_credentials_in_values_are_dropped_whatever_the_name(value: str) -> None:
    for name in ("INNOCENT", "DATABASE_URL", "HTTP_PROXY", "PWD", "SSL_CERT_FILE", "AWS_REGION"):
        assert not kept(name, value) and fe.why_dropped(name, value) == "value", (name, value)
    assert fe.value_is_secret(value)


HARMLESS_VALUES = [
    "",
    "1",
    "/usr/bin:/bin",
    "https://pypi.org/simple",
    "http://127.0.0.1:8080/",
    "http://[::1]:8080",
    "http://[::1]:8080/x",
    "ssh://git@github.com/o/r.git",
    "git@github.com:o/r.git",
    "https://user@example.com/",
    "postgres://u:@h/db",
    "postgres://h:5432/db",
    "mailto:a@b.c",
    "user:pw@host",
    "sk-short",
    "task-" + "a" * 30,
    "desk-" + "b" * 30,
    "ghp_tooshort",
    "xghp_" + "a" * 36,
    "akiaiosfodnn7example",
    "AKIAIOSFODNN7EXAMPLEX",
    "npm_short",
    "eyJhbGciOiJIUzI1NiJ9",
    "password",
    "my password is long",
    "-----BEGIN CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----",
    "local password=$1",
    "di=01;34:ln=01;36",
    "() { echo hi; }",
    "C.UTF-8",
    "xterm-256color",
]


@pytest.mark.parametrize("value", HARMLESS_VALUES)
def test_ordinary_values_are_kept(value: str) -> None:
    assert kept("PLAIN", value) and not fe.value_is_secret(value), value


# ---- precedence --------------------------------------------------------------------------------


def test_user_keep_wins_over_everything_and_is_case_insensitive() -> None:
    pol = fe.EnvPolicy(keep=("openai_api_key", "DATABASE_*"), drop=("OPENAI_*",))
    assert kept("OPENAI_API_KEY", "sk-" + "a" * 30, pol) and kept("database_url", "postgres://u:pw@h/db", pol)
    assert not kept("ANTHROPIC_API_KEY", "x", pol)


def test_user_drop_adds_patterns_case_insensitively_and_beats_the_default_keep_list() -> None:
    pol = fe.EnvPolicy(drop=("npm_*", "SSL_CERT_FILE", "pwd"))
    for name in ("NPM_CONFIG_REGISTRY", "npm_config_cache", "SSL_CERT_FILE", "PWD"):
        assert not kept(name, "/x", pol) and fe.why_dropped(name, "/x", pol) == "env.drop"
    assert kept("OLDPWD", "/x", pol) and kept("SSL_CERT_DIR", "/x", pol)


def test_a_default_kept_name_is_no_excuse_for_a_secret_value() -> None:
    assert fe.why_dropped("AWS_CA_BUNDLE", "/etc/ca.pem") is None
    assert fe.why_dropped("AWS_CA_BUNDLE", "https://u:p@h/ca.pem") == "value"


def test_user_patterns_are_shell_style_and_match_whole_names() -> None:
    pol = fe.EnvPolicy(drop=("MY_?", "[XY]_VAR"))
    assert not kept("MY_A", "v", pol) and kept("MY_AB", "v", pol)
    assert not kept("x_var", "v", pol) and kept("Z_VAR", "v", pol) and kept("X_VARS", "v", pol)


def test_filter_env_is_pure_and_keeps_values_and_order() -> None:
    env = {"B": "2", "GH_TOKEN": "t", "A": "1", "PWD": "/w"}
    before = dict(env)
    out, dropped = fe.filter_env(env)
    assert env == before and list(out.items()) == [("B", "2"), ("A", "1"), ("PWD", "/w")] and dropped == ["GH_TOKEN"]
    assert fe.filter_env({}) == ({}, [])


# ---- properties --------------------------------------------------------------------------------

FRAGMENT = st.from_regex(r"[A-Za-z0-9_]{0,8}", fullmatch=True)


def _in_default_keep(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), k.upper()) for k in fe.DEFAULT_ENV_KEEP)


@st.composite
def family_names(draw: st.DrawFn) -> str:
    """A name built from one DEFAULT_ENV_DROP pattern (each `*` filled in), in random letter case."""
    pattern = draw(st.sampled_from(fe.DEFAULT_ENV_DROP))
    name = "".join(draw(FRAGMENT) if part == "*" else part for part in re.split(r"(\*)", pattern))
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.lower() if f else c.upper() for c, f in zip(name, flips, strict=True)) or "X"


@given(family_names())
def test_any_name_of_a_family_in_any_case_is_dropped(name: str) -> None:
    assert kept(name) == _in_default_keep(name), name


@given(
    st.sampled_from(fe.DEFAULT_ENV_KEEP),
    st.lists(st.booleans(), min_size=20, max_size=20),
    st.from_regex(r"/[a-z/.]{0,20}", fullmatch=True),
)
def test_the_default_keep_list_is_kept_in_any_case(name: str, flips: list[bool], value: str) -> None:
    name = "".join(c.lower() if f else c for c, f in zip(name, flips, strict=False))
    assert kept(name, value)


NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)


@given(st.dictionaries(NAMES, st.text(max_size=40), max_size=25), st.data())
def test_partition_and_user_keep_always_wins(env: dict[str, str], data: st.DataObject) -> None:
    out, dropped = fe.filter_env(env)
    assert set(out) | set(dropped) == set(env) and not set(out) & set(dropped)
    assert all(out[k] == env[k] for k in out) and dropped == sorted(dropped)
    keep = data.draw(st.lists(st.sampled_from(sorted(env)), unique=True) if env else st.just([]))
    out, _ = fe.filter_env(env, fe.EnvPolicy(keep=tuple(k.swapcase() for k in keep), drop=("*",)))
    wanted = {k.upper() for k in keep}  # kept in any case (`o` too when `O` is kept); `*` drops the rest
    assert set(out) == {n for n in env if n.upper() in wanted}


USERINFO = st.from_regex(r"[A-Za-z0-9._~%!$&'()*+,;=-]{1,12}", fullmatch=True)


@given(
    NAMES,
    st.sampled_from(["postgres", "mysql", "redis", "https", "amqp", "mongodb+srv", "git+ssh"]),
    st.from_regex(r"[A-Za-z0-9._-]{0,8}", fullmatch=True),
    USERINFO,
    st.text(max_size=10),
    st.text(max_size=10),
)
def test_any_url_with_a_password_is_dropped(
    name: str, scheme: str, user: str, password: str, before: str, after: str
) -> None:
    value = f"{before} {scheme}://{user}:{password}@host.example/db {after}"
    assert not kept(name, value), value


TOKENS = st.one_of(
    st.from_regex(r"gh[pousr]_[A-Za-z0-9]{36}", fullmatch=True),
    st.from_regex(r"glpat-[A-Za-z0-9_-]{20,30}", fullmatch=True),
    st.from_regex(r"sk-[A-Za-z0-9_-]{20,60}", fullmatch=True),
    st.from_regex(r"AKIA[0-9A-Z]{16}", fullmatch=True),
    st.from_regex(r"npm_[A-Za-z0-9]{36}", fullmatch=True),
    st.from_regex(r"xox[bp]-[0-9]{10}-[A-Za-z0-9]{10,20}", fullmatch=True),
)


@given(NAMES, TOKENS, st.sampled_from(["", " ", "Bearer ", "token=", "x:", "/"]), st.sampled_from(["", " ", "\n", ";"]))
def test_a_well_known_token_anywhere_in_a_value_is_dropped(name: str, token: str, before: str, after: str) -> None:
    assert not kept(name, before + token + after)


# ---- only names reach the audit log and `-v` ---------------------------------------------------


def test_audit_record_and_verbose_output_name_dropped_variables_never_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from launcher.run import confinement
    from launcher.run.options import RunOptions
    from netguard.audit import AuditLog, read_records

    values = {
        "OPENAI_API_KEY": "VAL-openai-41",
        "INNOCENT": GHP,
        "DATABASE_URL": "postgres://u:VAL-pw-42@h/db",
        "mysql_pwd": "VAL-mysql-43",
        "SANDGATE_TEST_PLAIN": "plain-ok",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("fsguard.landlock.abi_version", lambda: 0)
    log = AuditLog(tmp_path / "a.jsonl")
    opts = RunOptions(cmd=["true"], audit_path=tmp_path / "a.jsonl", user=None, verbose=True)
    err = io.StringIO()
    with redirect_stderr(err):
        conf = confinement.plan(opts, log, tmp_path / "rt")
    log.close()
    secret = {k: v for k, v in values.items() if k != "SANDGATE_TEST_PLAIN"}
    assert set(secret) <= set(conf.env_dropped) and not set(secret) & set(conf.env)
    assert conf.env["SANDGATE_TEST_PLAIN"] == "plain-ok"
    rec = read_records(tmp_path / "a.jsonl")[0]
    assert rec["event"] == "policy" and set(secret) <= set(rec["env_dropped"])
    line = next(x for x in err.getvalue().splitlines() if x.startswith("sandgate: environment dropped: "))
    assert set(secret) <= set(line.removeprefix("sandgate: environment dropped: ").split(", "))
    text = (tmp_path / "a.jsonl").read_text() + err.getvalue() + json.dumps(rec)
    for v in secret.values():
        for fragment in (v, "VAL-", GHP[4:]):
            assert fragment not in text, fragment


_GLOB = st.text(alphabet="AB_*?1", min_size=1, max_size=6)


@given(st.lists(_GLOB, min_size=1, max_size=5), st.text(alphabet="ab_AB1-.", max_size=8))
def test_a_compiled_matcher_decides_as_the_plain_one(patterns: list[str], name: str) -> None:
    """The fork server's one-regex matchers (fe.precompile_defaults) and the string globs agree."""
    assert fe.NameMatcher(patterns, compiled=True).match(name) == fe.NameMatcher(patterns).match(name)


def test_the_defaults_compiled_decide_as_before() -> None:
    names = [*os.environ, "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "PATH", "HOME", "npm_config_cache", "X_API_KEY"]
    before = [fe.why_dropped(n, "v") for n in names]
    try:
        fe.precompile_defaults()
        assert [fe.why_dropped(n, "v") for n in names] == before
    finally:
        fe._COMPILED.clear()
        fe._defaults.cache_clear()


def test_git_command_scope_config_is_kept_whole_or_not_at_all(tmp_path: Path) -> None:
    """GIT_CONFIG_KEY_<n> is dropped (`*_KEY_*`); a count left without its keys makes git die on every
    command ("missing config key GIT_CONFIG_KEY_0", r3-new): the count goes with them. Judged by real git."""
    given = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.pager", "GIT_CONFIG_VALUE_0": "cat"}
    kept, dropped = fe.filter_env({**given, "PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert not any(n.startswith("GIT_CONFIG") for n in kept) and set(given) <= set(dropped)
    run = subprocess.run(["git", "config", "--list"], env=kept, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    count_only = {**kept, "GIT_CONFIG_COUNT": "1"}  # the control: what the filter kept before
    run = subprocess.run(["git", "config", "--list"], env=count_only, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode != 0 and "GIT_CONFIG_KEY_0" in run.stderr
    kept, _ = fe.filter_env(given, fe.EnvPolicy(keep=("GIT_CONFIG_*",)))  # the user keeps them: whole, as given
    assert kept == given
