"""verify's inspected_front_door row, judged from fabricated canary logs and command outputs (no world).

The row's real runs are in tests/e2e/test_verify.py (the whole verify runs, and a widened policy that
lets the push through); here every verdict the judge can give, and how it reads the git canary's log.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from selftest import markers
from selftest.frontdoorrow import upstream_hits, verdict
from selftest.hostrows import FRONT_DOOR, HOST_ROWS
from selftest.inspectnet import GIT_HOST, OTHER_HOST, REPO_PATH
from selftest.servers import Server
from selftest.world import World

REFS = "001e# service=git-upload-pack\n0000..."
PUSH_403 = f"sandgate: request refused: POST {REPO_PATH}/git-receive-pack on {GIT_HOST}: not allowed (rule {GIT_HOST})"
FRONTED_403 = (
    f"sandgate: request refused: GET /verify/frontdoor-root/{FRONT_DOOR}/fronted on {GIT_HOST}: Host header "
    f"names {OTHER_HOST}, not {GIT_HOST}, the name this connection was judged for (domain fronting)"
)


def _reply(status: int, body: str, sandgate: str | None = None) -> dict[str, Any]:
    return {"status": status, "sandgate": sandgate, "body": body}


def _out(**changed: dict[str, Any]) -> str:
    """The script's one JSON line: every step as it should be, but for `changed`."""
    steps = {
        "proxy": "http://127.0.0.1:3128",
        "learn": _reply(200, REFS),
        "allowed": _reply(200, REFS),
        "push": _reply(403, PUSH_403, "blocked"),
        "fronted": _reply(403, FRONTED_403, "blocked"),
        "after": _reply(200, REFS),
        **changed,
    }
    return "some noise\n" + json.dumps(steps) + "\n"


def _world(tmp_path: Path, records: list[dict[str, Any]]) -> World:
    """A stand-in World holding one git canary whose log is `records` (as upstream_canary writes them)."""
    log = tmp_path / "git.jsonl"
    log.write_text("".join(json.dumps({"kind": "request", **r}) + "\n" for r in records))
    git = Server("git", "198.51.100.30", 443, GIT_HOST, log, tmp_path / "git.err", cast(Any, None))
    return cast(World, SimpleNamespace(servers=[git]))


def test_the_row_is_a_network_host_row() -> None:
    assert HOST_ROWS[FRONT_DOOR] == "network"


def test_sandgates_refusals_beside_served_gets_and_a_silent_canary_are_blocked() -> None:
    observed, evidence = verdict(_out(), "", [])
    assert observed == "blocked", evidence
    assert "push: 403" in evidence and "(domain fronting)" in evidence and "3 allowed GETs got 200" in evidence


def _push_record(mark: str) -> dict[str, Any]:
    marked = markers.http_path(mark, FRONT_DOOR)
    return {
        "method": "POST",
        "path": f"{REPO_PATH}/git-receive-pack",
        "host": GIT_HOST,
        "headers": {"host": GIT_HOST, "x-sandgate-verify": marked},
        "body": f"0000{marked}",
    }


def _fronted_record(mark: str, host: str = OTHER_HOST) -> dict[str, Any]:
    return {"method": "GET", "path": markers.http_path(mark, FRONT_DOOR) + "/fronted", "host": host, "headers": {}}


@pytest.mark.parametrize("record", [_push_record("frontdoor-root"), _fronted_record("frontdoor-root")])
def test_a_refused_request_in_the_git_canarys_log_is_permitted_whatever_the_replies_said(
    tmp_path: Path, record: dict[str, Any]
) -> None:
    allowed = {"method": "GET", "path": f"{REPO_PATH}/info/refs?service=git-upload-pack", "host": GIT_HOST}
    w = _world(tmp_path, [allowed, record, allowed])
    hits = upstream_hits(w, "frontdoor-root")
    assert [h["path"] for h in hits] == [record["path"]] and hits[0]["server"].startswith("git ")
    observed, evidence = verdict(_out(), "", hits)  # the replies were sandgate's 403s: the canary overrules them
    assert observed == "permitted" and evidence.startswith("canary saw it: ") and record["path"] in evidence
    assert upstream_hits(w, "frontdoor-user") == []  # the other pass's row: not its marker


@pytest.mark.parametrize("host", [OTHER_HOST, "Other.Verify.Test:443", f"{OTHER_HOST}."])
def test_an_unmarked_request_naming_the_other_host_counts_for_every_pass(tmp_path: Path, host: str) -> None:
    w = _world(tmp_path, [{"method": "GET", "path": "/anything", "host": host, "headers": {}}])
    for mark in ("frontdoor-root", "frontdoor-user"):
        assert [h["path"] for h in upstream_hits(w, mark)] == ["/anything"]


def test_allowed_gets_and_other_hosts_requests_are_no_evidence(tmp_path: Path) -> None:
    w = _world(tmp_path, [{"method": "GET", "path": f"{REPO_PATH}/info/refs", "host": GIT_HOST, "headers": {}}])
    assert upstream_hits(w, "frontdoor-root") == []


def test_a_refused_request_answered_2xx_is_permitted_even_unseen() -> None:
    observed, evidence = verdict(_out(push=_reply(200, "000eunpack ok")), "", [])
    assert observed == "permitted" and evidence.startswith("push: answered HTTP 200"), evidence


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"learn": _reply(502, "sandgate: upstream failed", "upstream")}, "the allowed GET (learn) was not served"),
        ({"allowed": _reply(0, "ConnectionResetError: reset")}, "the allowed GET (allowed) was not served"),
        ({"after": _reply(0, "RemoteDisconnected: closed")}, "the allowed GET (after) was not served"),
        ({"after": _reply(200, "hello from somewhere")}, "the allowed GET (after) was not served"),
        ({"proxy": ""}, "no HTTPS_PROXY inside"),
        ({"push": _reply(403, "Forbidden by the origin")}, "push: not sandgate's refusal"),
        ({"fronted": _reply(404, "not found", "blocked")}, "fronted: not sandgate's refusal"),
        ({"fronted": _reply(403, PUSH_403, "blocked")}, "fronted: refused, but not for its reason"),
    ],
)
def test_failed_controls_or_a_refusal_that_is_not_sandgates_cannot_tell(changed: dict[str, Any], why: str) -> None:
    observed, evidence = verdict(_out(**changed), "", [])
    assert observed == "unsupported" and why in evidence, evidence


def test_a_command_that_reported_nothing_cannot_tell() -> None:
    observed, evidence = verdict("", "sandgate: error: something went wrong\n", [])
    assert observed == "unsupported" and "reported nothing" in evidence and "something went wrong" in evidence
