"""netguard.audit: the record types are the format; one writer, one reader, and docs/audit.md's tables agree with both."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from netguard import audit

AUDIT_DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "audit.md"


def documented_fields() -> dict[str, set[str]]:
    """{event: fields} from the tables of docs/audit.md, the audit log's reference ("–" = not in that event)."""
    section = AUDIT_DOC.read_text(encoding="utf-8")
    out: dict[str, set[str]] = {}
    events: list[str] = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "field":
            events = [re.match(r"`event: (\w+)`", c).group(1) for c in cells[1:]]  # type: ignore[union-attr]
            for e in events:
                out.setdefault(e, set())
            continue
        names = re.findall(r"`(\w+)`", cells[0])
        for event, cell in zip(events, cells[1:], strict=True):
            if cell != "–":
                out[event].update(names)
    return out


def test_readme_documents_exactly_the_record_types() -> None:
    documented = documented_fields()
    assert set(documented) == set(audit.RECORD_TYPES)
    for event, record_type in audit.RECORD_TYPES.items():
        assert documented[event] == set(record_type.__annotations__), event


def written() -> list[audit.Record]:
    return [
        audit.decision_record("t", "i1", "dns", "deny", "x.test", None, qtype="TXT", reason="no"),
        audit.decision_record("t", "i2", "connect", "allow", "y.test", 443, ip="198.51.100.1", would="deny"),
        audit.close_record("t", "i2", "connect", "y.test", 443, "198.51.100.1", 1, 2, 3),
        audit.approval_record("t", id="q1", stage="question", host="z.test", port=443, asked_by="curl (pid 7)"),
        audit.approval_record(
            "t", id="q1", stage="answer", host="z.test", port=443, asked_by=None, answer="once", by="socket"
        ),
        audit.policy_record(
            "t",
            write=["."],
            private_tmp=True,
            protect=[".git/hooks"],
            hidden=["~/.ssh"],
            env_dropped=["OPENAI_API_KEY"],
            landlock_abi=4,
            warnings=[],
        ),
    ]


def test_what_the_writer_writes_the_reader_reads_back_in_field_order(tmp_path: Path) -> None:
    log = audit.AuditLog(tmp_path / "a.jsonl")
    for r in written():
        log.write(r)
    log.close()
    back = list(audit.read(tmp_path / "a.jsonl"))
    assert back == written_without_ts(back)
    for r in back:
        assert list(r) == list(audit.RECORD_TYPES[r["event"]].__annotations__) and r["schema"] == audit.SCHEMA
    assert log.counts == {"allow": 1, "deny": 1}


def written_without_ts(back: list[audit.Record]) -> list[dict[str, Any]]:
    return [{**w, "ts": b["ts"]} for w, b in zip(written(), back, strict=True)]


def test_a_schema_1_record_reads_with_the_fields_it_did_not_have(tmp_path: Path) -> None:
    old = {
        "ts": "2026-11-29T09:48:43.080Z",
        "task": "t",
        "event": "decision",
        "id": "i",
        "kind": "connect",
        "action": "deny",
        "host": "x.test",
        "port": 443,
        "ip": None,
        "proto": None,
        "method": None,
        "url": None,
        "qtype": None,
        "rule": None,
        "reason": "no allow rule matches",
        "unknown": "dropped",
    }
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")
    [r] = audit.read(tmp_path / "old.jsonl")
    assert r["event"] == "decision" and r["would"] is None and r["schema"] == 1 and "unknown" not in r


def test_a_torn_last_line_is_skipped_and_blank_lines_carry_nothing(tmp_path: Path) -> None:
    line = json.dumps(written()[0])
    (tmp_path / "a.jsonl").write_text(line + "\n\n" + line + "\n" + line[:30])
    assert len(audit.read_records(tmp_path / "a.jsonl")) == 2
    (tmp_path / "b.jsonl").write_text(line + "\n" + line)  # complete, only its newline missing: kept
    assert len(audit.read_records(tmp_path / "b.jsonl")) == 2


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"port": "443"}, "'port' is \"443\""),
        ({"port": True}, "'port' is true"),
        ({"action": "maybe"}, "'action' is \"maybe\""),
        ({"event": "forged"}, 'event "forged"'),
        ({"schema": audit.SCHEMA + 1}, "newer sandgate"),
        ({"reason": 7}, "'reason' is 7"),
        ({"ts": None}, "'ts' is null"),
        ({"ts": ...}, "'ts' is missing"),
    ],
)
def test_a_record_that_does_not_fit_its_type_is_named_by_file_and_line(
    tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    good = json.dumps(written()[0])
    bad = json.dumps({k: v for k, v in {**written()[0], **change}.items() if v is not ...})
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n{bad}\n{good}\n")
    with pytest.raises(audit.LogError) as e:
        list(audit.read(path))
    assert str(e.value).startswith(f"{path}:2: ") and why in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_garbage_before_the_last_line_is_an_error(tmp_path: Path) -> None:
    good = json.dumps(written()[0])
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n{{not json\n{good}\n")
    with pytest.raises(audit.LogError, match=r"bad\.jsonl:2: not a JSON record"):
        list(audit.read(path))


def test_readme_lists_every_decision_kind() -> None:
    """A new Kind literal must be documented where users read the log's format."""
    from typing import get_args

    row = next(line for line in AUDIT_DOC.read_text().splitlines() if line.startswith("| `kind` |"))
    decision_cell = row.split("|")[2]
    listed = set(re.findall(r"`(\w+)`", decision_cell))
    decision_kinds = set(get_args(audit.Kind)) - {"approval", "policy"}
    assert listed == decision_kinds


def test_timestamps_are_utc_milliseconds_and_agree_with_the_clock() -> None:
    """now_rfc3339 formats the second once and caches it: across second boundaries it must stay right."""
    import datetime
    import time

    seen: set[str] = set()
    deadline = time.monotonic() + 1.2  # at least one second boundary
    while time.monotonic() < deadline:
        before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        ts = audit.now_rfc3339()
        after = datetime.datetime.now(datetime.UTC)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ts), ts
        when = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
        assert before <= when <= after, (before, ts, after)
        seen.add(ts[:19])
    assert len(seen) >= 2


def test_record_ids_are_twelve_fresh_hex_digits() -> None:
    ids = {audit.new_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)
