"""A complete verify spec for probe tests run without a sandbox (tests/e2e/test_probes.py and the unit tests
of the shared-daemon probes): every field set to a value no probe reaches for unless a test says so.
"""

from __future__ import annotations

import sys
from typing import Any

from selftest.spec import FileHandleSpec, VerifySpec

SECRET = "FAKE-KEY-0123456789"


#: Every field of a spec, with values no probe here reaches for unless a test says so.
BASE: dict[str, Any] = {
    "allowed_host": "allowed.test",
    "allowed_ip": "127.0.0.1",
    "blocked_host": "blocked.test",
    "blocked_ip": "127.0.0.1",
    "tcp_port": 9,
    "udp_port": 9,
    "quic_port": 9,
    "other_port": 9,
    "host_loopback_port": 9,
    "rogue_resolver": "127.0.0.1",
    "exfil_domain": "exfil.test",
    "rebind_loopback_host": "loopback.test",
    "rebind_metadata_host": "metadata.test",
    "rebind_own_host": "own.test",
    "wild_domain": "wild.test",
    "wild_ip": "127.0.0.1",
    "abstract_socket": "sandgate-probes-test-none",
    "path_socket": "/nonexistent/sandgate-probes-test.sock",
    "world_netns": "/run/netns/sandgate-none-such",
    "git_url": "https://git.test/verify/repo.git",
    "git_head": "0" * 40,
    "api_host": "api.test",
    "other_host": "other.test",
    "cred_env": "SANDGATE_PROBES_TEST_API_KEY",
    "cred_prefix": "sk-sgreal-",
    "cred_sha256": "0" * 64,
    "passthrough_sha256": "0" * 64,
    "root_dev": (0, 0),
    "root_dev_path": "",
    "shm_id": -1,
    "host_key": 0,
    "host_key_description": "",
    "ssh_key_handle": FileHandleSpec(type=0, hex=""),
    "ca": "",
    "home": "/nonexistent",
    "outside_file": "/nonexistent/victim.txt",
    "outside_dir": "/nonexistent",
    "results_dir": "/nonexistent",
    "secret_marker": SECRET,
    "secret_env": "SANDGATE_PROBES_TEST_TOKEN",
    "visible_env": "SANDGATE_PROBES_TEST_VISIBLE=yes",
    "daemon_token": "sgvdtest",
    "python": sys.executable,
    "cred_marker": "sgcredtest",
    "home_control": "plain-test",
    "env_marker": "sgenvtest",
    "plain_env": "SANDGATE_VERIFY_PLAIN=plain-test",
    "audit_log": "/nonexistent/audit.jsonl",
}


def make_spec(**fields: Any) -> VerifySpec:
    return VerifySpec(**{**BASE, **fields})
