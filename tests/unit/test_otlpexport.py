"""netguard.daemon.otlpexport against a fake collector on loopback: batches arrive, retries follow the spec,
a hanging or refusing collector costs the writer nothing, and every loss is a record in the run's log."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netguard import audit
from netguard.daemon import otlpexport
from netguard.otlp import OtlpConfig

from ..support import otlpfake

SECRET = "collector-key-7f3e"


@pytest.fixture
def collector(request: pytest.FixtureRequest) -> Iterator[otlpfake.Collector]:
    c = otlpfake.Collector(otlpfake.listen_in_netns(None, "127.0.0.1", 0), getattr(request, "param", "ok"))
    try:
        yield c
    finally:
        c.close()


def config(c: otlpfake.Collector, **kw: object) -> OtlpConfig:
    host, port = c.server.socket.getsockname()[:2]
    base: dict[str, object] = {"headers": (("api-key", SECRET),), "delay": 0.05, "timeout": 2.0, "deadline": 5.0}
    return OtlpConfig(f"http://{host}:{port}/v1/logs", **{**base, **kw})  # type: ignore[arg-type]


def open_log(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "audit.jsonl"
    return path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)


def decisions(n: int, action: str = "allow") -> list[audit.Record]:
    return [audit.decision_record("t", f"i{i}", "connect", action, f"h{i}.test", 443) for i in range(n)]


def finish(log: otlpexport.ExportingLog, timeout: float = 15) -> None:
    exporter = log.exporter
    log.close()
    assert exporter.join(timeout), "the exporter thread did not end"


def losses(path: Path) -> list[audit.LimitRecord]:
    return [r for r in audit.read_records(path) if r["event"] == "limit" and r["limit"] == "export"]


def test_records_arrive_in_batches_with_the_headers_and_the_log_is_written_first(
    tmp_path: Path, collector: otlpfake.Collector
) -> None:
    path, fd = open_log(tmp_path)
    log = otlpexport.ExportingLog(fd, config(collector, batch=4), "t")
    for r in decisions(10):
        log.write(r)
    assert len(audit.read_records(path)) == 10  # in the run's log at once, whatever the collector does
    finish(log)
    assert [len(otlpfake.decode(r)) for r in collector.requests][:2] == [4, 4]
    assert sorted(row.attributes["server.address"] for row in collector.rows()) == sorted(
        f"h{i}.test" for i in range(10)
    )
    assert all(r.path == "/v1/logs" and r.headers["api-key"] == SECRET for r in collector.requests)
    assert collector.requests[0].headers["Content-Type"] == "application/x-protobuf"
    assert log.exporter.sent == 10 and log.exporter.lost == {} and losses(path) == []


@pytest.mark.parametrize("collector", ["fail:2:503"], indirect=True)
def test_503_is_tried_again(tmp_path: Path, collector: otlpfake.Collector) -> None:
    path, fd = open_log(tmp_path)
    log = otlpexport.ExportingLog(fd, config(collector), "t")
    for r in decisions(3):
        log.write(r)
    finish(log)
    assert len(collector.requests) == 3 and len(collector.rows()) == 9  # the same batch, sent three times
    assert log.exporter.sent == 3 and losses(path) == []


@pytest.mark.parametrize("collector", ["fail:9:400"], indirect=True)
def test_a_400_is_final_and_its_records_are_counted_in_the_log(tmp_path: Path, collector: otlpfake.Collector) -> None:
    path, fd = open_log(tmp_path)
    log = otlpexport.ExportingLog(fd, config(collector), "t")
    for r in [*decisions(2), *decisions(1, "deny")]:
        log.write(r)
    finish(log)
    assert len(collector.requests) == 1  # not tried again
    (lost,) = losses(path)
    assert lost["count"] == 3 and lost["kind"] == "connect" and "HTTP 400" in lost["reason"]
    assert SECRET not in path.read_text()


@pytest.mark.parametrize("collector", ["partial:2"], indirect=True)
def test_records_the_collector_rejects_are_counted(tmp_path: Path, collector: otlpfake.Collector) -> None:
    path, fd = open_log(tmp_path)
    log = otlpexport.ExportingLog(fd, config(collector, protocol="http/json"), "t")
    for r in decisions(5):
        log.write(r)
    finish(log)
    assert log.exporter.sent == 3 and [x["count"] for x in losses(path)] == [2]


@pytest.mark.parametrize("collector", ["hang"], indirect=True)
def test_a_hanging_collector_never_slows_the_writer_and_what_it_never_took_is_counted(
    tmp_path: Path, collector: otlpfake.Collector
) -> None:
    path, fd = open_log(tmp_path)
    log = otlpexport.ExportingLog(fd, config(collector, queue=50, batch=10, timeout=0.3, deadline=1.0), "t")
    t0 = time.monotonic()
    for r in decisions(500):
        log.write(r)  # a slow collector must cost the event loop nothing but an append
    wrote = time.monotonic() - t0
    assert wrote < 2.0, wrote
    t0 = time.monotonic()
    finish(log, timeout=20)
    assert time.monotonic() - t0 < 10  # bounded by the deadlines, not by the collector
    assert collector.requests and collector.answered == 0
    assert log.exporter.sent == 0 and sum(log.exporter.lost.values()) == 500
    counted = losses(path)
    assert sum(x["count"] for x in counted) == 500
    reasons = [x["reason"] for x in counted]
    assert any("queue (50 records) was full" in x for x in reasons), reasons
    assert any("no answer within" in x for x in reasons), reasons
    assert all(x["task"] == "t" for x in counted) and SECRET not in path.read_text()


def test_an_unreachable_collector_is_counted_too(tmp_path: Path) -> None:
    sock = otlpfake.listen_in_netns(None, "127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # nobody listens there now: connection refused
    path, fd = open_log(tmp_path)
    log = otlpexport.ExportingLog(fd, OtlpConfig(f"http://127.0.0.1:{port}/v1/logs", delay=0.05, deadline=1.5), "t")
    log.write(decisions(1)[0])
    finish(log)
    (lost,) = losses(path)
    assert lost["count"] == 1 and "cannot reach the collector" in lost["reason"]


def test_tls_to_the_collector_verifies_with_the_configured_roots(tmp_path: Path) -> None:
    from selftest import certs

    ca, other = certs.CA(), certs.CA("another CA")
    chain, key = ca.issue("127.0.0.1").write(tmp_path / "c.pem", tmp_path / "k.pem")
    c = otlpfake.Collector(otlpfake.listen_in_netns(None, "127.0.0.1", 0), tls=(chain, key))
    try:
        port = c.server.socket.getsockname()[1]
        for roots, arrives in ((ca.cert_pem.decode(), True), (other.cert_pem.decode(), False)):
            (tmp_path / str(arrives)).mkdir()
            path, fd = open_log(tmp_path / str(arrives))
            cfg = OtlpConfig(f"https://127.0.0.1:{port}/v1/logs", certificate=roots, delay=0.05, deadline=1.5)
            log = otlpexport.ExportingLog(fd, cfg, "t")
            log.write(decisions(1)[0])
            finish(log)
            assert (log.exporter.sent == 1) is arrives
            assert arrives or "TLS verification of the collector failed" in losses(path)[0]["reason"]
    finally:
        c.close()
