"""r2-user U2: an inspecting run's CA never reached the command on Windows.

The proxy wrote its CA next to the audit log, inside sandgate's folder, which the run's plan denies
the sandbox user, and no variable named it. The fake TLS client below reads the bundle the way the
command would, as the sandbox user through the NTFS model (tests/support/ntfsmodel.py: the ACEs in
order, inheritance from the folders), and "verifies" only when the run's CA is in a file it can read.
Fake evidence only.
"""

from __future__ import annotations

import ntpath
from typing import cast

import pytest

from fsguard.windows.launch import Launch
from launcher import cli
from launcher.run import inspection
from launcher.run.trustpaths import BUNDLE_VARIABLES
from launcher.run.windows import trust
from sgbase.windows.api import Proc
from tests.support import ntfsmodel, winfake
from tests.support.winfake import APPDATA, FAKE_CA, FAKE_ROOT, HOME, FakeWinApi

CERT_ERROR = 60  # curl's "peer certificate cannot be authenticated with given CA certificates"
INSPECTED = ("--allow", "npm-readonly")  # a bundled list whose hosts are inspected


def tls_client(api: FakeWinApi, launch: Launch, desk: str) -> int:
    """What CMD's TLS client does: read SSL_CERT_FILE as the sandbox user; trust the run's CA only
    if it is in there (and keep the machine's roots for the hosts that are not inspected)."""
    path = next((v for k, v in launch.env.items() if k.upper() == "SSL_CERT_FILE"), None)
    if path is None:
        return CERT_ERROR
    fs = ntfsmodel.ModelFsOps(ntfsmodel.Ntfs(api.m, api.m.users[launch.user][0]))
    try:
        text = fs.read(path).decode()
    except (ntfsmodel.Denied, FileNotFoundError):
        return CERT_ERROR
    return 0 if FAKE_CA in text and FAKE_ROOT in text else CERT_ERROR


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    fake = winfake.installed(monkeypatch)
    fake.program = tls_client
    return fake


def _env(api: FakeWinApi) -> dict[str, str]:
    ((launch, _),) = api.launches.values()
    return dict(launch.env)


def test_an_inspecting_run_trusts_its_ca_inside_and_leaves_nothing(
    api: FakeWinApi, capsys: pytest.CaptureFixture[str]
) -> None:
    before = api.snapshot()
    assert cli.main(["run", *INSPECTED, "--", "tool"]) == 0
    env = _env(api)
    bundle = env["SSL_CERT_FILE"]
    assert {env[v] for v in BUNDLE_VARIABLES} == {bundle} and ntpath.dirname(bundle).startswith(
        APPDATA + "\\sandgate-trust-"
    )
    (argv,) = [cast(tuple[str, ...], a[0]) for n, a in api.calls if n == "start_proxy"]
    assert argv[argv.index("--ca-cert") + 1] == ntpath.join(ntpath.dirname(bundle), trust.CA_FILE)
    assert "trusted inside via" in capsys.readouterr().err
    after = api.snapshot()  # the folder, its files and its grant gone
    assert not [p for p in (*after.files, *after.dirs) if "sandgate-trust-" in p]
    assert after.dacls == before.dacls  # every grant restored, the folder's DACL gone with it


def test_the_control_the_ca_beside_the_audit_log_is_not_readable(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the trust folder (the old path) the command's client cannot verify the inspected host."""
    monkeypatch.setattr(inspection, "needed", lambda net: False)
    assert cli.main(["run", *INSPECTED, "--", "tool"]) == CERT_ERROR


def test_a_bundle_in_sandgates_own_folder_would_be_denied(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the folder's place: inside `sandgate\\` the run's read-deny covers it."""
    monkeypatch.setattr(trust, "folder", lambda appdata, task: ntpath.join(appdata, "sandgate", f"trust-{task}"))
    assert cli.main(["run", *INSPECTED, "--", "tool"]) == CERT_ERROR


def test_a_run_that_does_not_inspect_changes_no_variable(api: FakeWinApi) -> None:
    api.env["SSL_CERT_FILE"] = r"C:\certs\corp.pem"
    assert cli.main(["run", "--allow", "example.test", "--", "tool"]) == CERT_ERROR  # the fake's client: no CA
    assert _env(api)["SSL_CERT_FILE"] == r"C:\certs\corp.pem"
    assert "system_roots" not in api.names() and not [p for p in api.m.dirs if "sandgate-trust-" in p]


def test_the_users_own_bundle_is_carried_in_certificates_only(api: FakeWinApi) -> None:
    corp = HOME + r"\corp.pem"  # in the real user's profile: unreadable to the sandbox user
    key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"
    cert = "-----BEGIN CERTIFICATE-----\nQ09SUA==\n-----END CERTIFICATE-----\n"
    api.m.files[corp] = (cert + key).encode()
    api.env["REQUESTS_CA_BUNDLE"] = corp
    captured: list[str] = []

    def client(fake: FakeWinApi, launch: Launch, desk: str) -> int:
        captured.append(fake.m.files[dict(launch.env)["SSL_CERT_FILE"]].decode())
        return tls_client(fake, launch, desk)

    api.program = client
    assert cli.main(["run", *INSPECTED, "--", "tool"]) == 0
    assert cert in captured[0] and "PRIVATE KEY" not in captured[0] and captured[0].endswith(FAKE_CA)


def test_a_proxy_that_wrote_no_ca_is_one_line_and_nothing_is_left(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    start_proxy = api.start_proxy

    def silent(argv: tuple[str, ...]) -> Proc:
        proc = start_proxy(argv)
        api.m.files.pop(argv[argv.index("--ca-cert") + 1])
        return proc

    monkeypatch.setattr(api, "start_proxy", silent)
    with pytest.raises(SystemExit) as done:
        cli.main(["run", *INSPECTED, "--", "tool"])
    assert done.value.code == 125
    err = capsys.readouterr().err
    assert "wrote no CA certificate" in err and "Traceback" not in err and not api.launches
    assert not [p for p in (*api.m.files, *api.m.dirs) if "sandgate-trust-" in p]


def test_certificates_keep_no_key() -> None:
    text = FAKE_ROOT + "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"
    assert trust.certificates(text) == [FAKE_ROOT]
    assert trust.bundle([FAKE_ROOT, FAKE_ROOT], [], FAKE_CA).count("BEGIN CERTIFICATE") == 2
