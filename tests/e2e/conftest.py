"""Session-wide results of the machine-wide tests: each whole `sandgate verify` run made once (support/verifyruns.py)."""

from __future__ import annotations

import pytest

from ..support.verifyruns import VerifyRun, whole_run_as_root, whole_run_as_user


@pytest.fixture(scope="session")
def verify_as_root() -> VerifyRun:
    """Every probe as root, with the host's state right before and after (test_verify, test_setid_userns_e2e)."""
    return whole_run_as_root()


@pytest.fixture(scope="session")
def verify_as_user(_sandgate_cleanup_stale_users: None) -> VerifyRun:
    """Every probe as a throwaway ordinary user without sudo; its world and user are already removed."""
    return whole_run_as_user()
