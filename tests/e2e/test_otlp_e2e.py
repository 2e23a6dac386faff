"""Decisions to an OpenTelemetry collector (issue 27): each run's OTEL_* settings, each run's records only.

Fake collectors (tests/support/otlpfake.py) listen inside the world on TEST-NET-2 addresses; what they
received is decoded with the official opentelemetry-proto classes. Every denied request is checked at
the fake upstream (it saw nothing) beside the allowed one in the same run (it saw the request).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import Record, read_records

from ..support import otlpfake
from ..support.rootless import UnprivilegedUser
from ..support.runner import Sandgate, env, write_policy
from ..support.world import Server, World, new_world

ALLOWED, BLOCKED = "198.51.100.81", "198.51.100.82"
COLLECTOR_A, COLLECTOR_B, COLLECTOR_HANG = "198.51.100.85", "198.51.100.86", "198.51.100.87"
SECRET_A, SECRET_B = "otlp-key-a-5b1f0c", "otlp-key-b-93d2e7"
POLICY = "version: 1\nnetwork:\n  allow:\n    - allowed.test\n"
CURL = "curl -sS -m 10 -o /dev/null -w '%{http_code} %{time_total}\\n'"


@dataclass
class Env:
    world: World
    policy: Path
    allowed: Server
    blocked: Server
    a: otlpfake.Collector
    b: otlpfake.Collector
    hang: otlpfake.Collector

    def sg(self, **otel: str) -> Sandgate:
        return Sandgate(self.world, policy=self.policy, cwd=self.world.tmp, env={**env(), **otel})

    def audit(self, name: str) -> Path:
        return self.world.tmp / f"audit-{name}-{time.monotonic_ns()}.jsonl"


@pytest.fixture(scope="module")
def e() -> Iterator[Env]:
    with new_world() as w:
        w.add_host("allowed.test", ALLOWED)
        w.add_host("blocked.test", BLOCKED)
        w.add_host("collector-b.test", COLLECTOR_B)
        for ip in (COLLECTOR_A, COLLECTOR_HANG):
            w.add_host(f"c{ip.rsplit('.', 1)[1]}.test", ip)  # holds the address on the world's sgw0
        netns = w.netns_file(w.tmp / "netns")
        tls = w.cert_for("collector-b.test")
        collectors = [
            otlpfake.Collector(otlpfake.listen_in_netns(netns, COLLECTOR_A, 4318)),
            otlpfake.Collector(otlpfake.listen_in_netns(netns, COLLECTOR_B, 4318), tls=tls),
            otlpfake.Collector(otlpfake.listen_in_netns(netns, COLLECTOR_HANG, 4318), "hang"),
        ]
        try:
            allowed, blocked = (
                w.serve("http", ALLOWED, 80, "allowed.test"),
                w.serve("http", BLOCKED, 80, "blocked.test"),
            )
            yield Env(w, write_policy(w, POLICY), allowed, blocked, *collectors)
        finally:
            for c in collectors:
                c.close()


def task_of(audit: Path) -> str:
    return next(r["task"] for r in read_records(audit) if r["event"] == "decision")


def wait_rows(c: otlpfake.Collector, task: str, pred: Any, timeout: float = 15) -> list[otlpfake.Row]:
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in c.rows() if r.attributes.get("sandgate.task") == task]
        if pred(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def decision(rows: list[otlpfake.Row], action: str, host: str) -> otlpfake.Row:
    found = [
        r for r in rows
        if r.event_name == "sandgate.decision" and r.attributes.get("sandgate.action") == action
        and r.attributes.get("server.address") == host
    ]  # fmt: skip
    assert found, [r.body for r in rows]
    return found[0]


def test_two_concurrent_runs_export_each_to_its_own_collector_in_protobuf_and_json(e: Env) -> None:
    go = e.world.tmp / f"go-{time.monotonic_ns()}"
    runs = {
        "a": (  # the generic endpoint (+ /v1/logs), default protocol http/protobuf, plain HTTP to an address
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{COLLECTOR_A}:4318",
                "OTEL_EXPORTER_OTLP_HEADERS": f"api-key={SECRET_A}",
                "OTEL_RESOURCE_ATTRIBUTES": "team=a,deployment.environment=ci%20runner",
                "OTEL_BLRP_SCHEDULE_DELAY": "100",
            },
            e.audit("a"),
        ),
        "b": (  # the logs endpoint as is, http/json, TLS to a name, verified with the world's CA only
            {
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "https://collector-b.test:4318/v1/logs",
                "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/json",
                "OTEL_EXPORTER_OTLP_LOGS_HEADERS": f"authorization=Bearer%20{SECRET_B}",
                "OTEL_EXPORTER_OTLP_CERTIFICATE": str(e.world.ca_pem),
                "OTEL_SERVICE_NAME": "run-b",
                "OTEL_BLRP_SCHEDULE_DELAY": "100",
            },
            e.audit("b"),
        ),
    }
    before = (len(e.allowed.log_records("http")), len(e.blocked.log_records()))
    procs = {}
    for name, (otel, audit) in runs.items():
        ready = e.world.tmp / f"ready-{name}-{go.name}"
        script = (
            f"{CURL} http://allowed.test/; {CURL} http://blocked.test/; env; touch {ready}; "
            f"while [ ! -e {go} ]; do sleep 0.1; done"
        )
        procs[name] = e.sg(**otel).popen(audit=audit, cmd=["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 40
        while not all((e.world.tmp / f"ready-{n}-{go.name}").exists() for n in runs) and time.monotonic() < deadline:
            time.sleep(0.1)
        tasks = {n: task_of(audit) for n, (_, audit) in runs.items()}
        # Both bindings live at once: the records arrive while both runs wait for `go`.
        rows = {
            n: wait_rows(c, tasks[n], lambda rs: any(r.attributes.get("server.address") == "blocked.test" for r in rs))
            for n, c in (("a", e.a), ("b", e.b))
        }
        assert all(p.poll() is None for p in procs.values())
    finally:
        go.touch()
        outs = {n: p.communicate(timeout=60)[0] for n, p in procs.items()}
    for n in runs:
        assert outs[n].splitlines()[:2] and outs[n].split()[0] == "200" and outs[n].split()[2] == "403", outs[n]
    # The denied request never left; the allowed ones reached their host, once per run.
    assert (len(e.allowed.log_records("http")) - before[0], len(e.blocked.log_records()) - before[1]) == (2, 0)
    for n, c, other, secret in (("a", e.a, e.b, SECRET_A), ("b", e.b, e.a, SECRET_B)):
        allowed, denied = decision(rows[n], "allow", "allowed.test"), decision(rows[n], "deny", "blocked.test")
        assert allowed.attributes["network.peer.address"] == ALLOWED and allowed.attributes["server.port"] == 80
        assert allowed.attributes["http.request.method"] == "GET" and allowed.attributes["url.path"] == "/"
        assert (
            denied.severity_text == "WARN" and allowed.severity_text == "INFO" and denied.attributes["sandgate.reason"]
        )
        assert not [r for r in other.rows() if r.attributes.get("sandgate.task") == tasks[n]]  # its own collector only
        got = [
            r.headers
            for r in c.requests
            if r.headers.get("api-key") == secret or secret in r.headers.get("authorization", "")
        ]
        assert got, "the collector never saw the run's header"
        # The collector's key never enters the sandbox or the run's audit log.
        assert secret not in outs[n] and "OTEL_EXPORTER_OTLP" in outs[n]  # the endpoint passes, the headers do not
        audit = runs[n][1]
        assert secret not in audit.read_text()
        policy = next(r for r in read_records(audit) if r["event"] == "policy")
        assert any(v.startswith("OTEL_EXPORTER_OTLP_") and v.endswith("HEADERS") for v in policy["env_dropped"])
    assert rows["a"][0].resource == {"team": "a", "deployment.environment": "ci runner", "service.name": "sandgate"}
    assert rows["b"][0].resource["service.name"] == "run-b"
    assert {r.headers["Content-Type"] for r in e.a.requests} == {"application/x-protobuf"}
    assert {r.headers["Content-Type"] for r in e.b.requests} == {"application/json"}
    assert {r.path for r in [*e.a.requests, *e.b.requests]} == {"/v1/logs"}


def exported_losses(audit: Path, task: str) -> int:
    return sum(r["count"] for r in read_records(audit) if r["event"] == "limit" and r["limit"] == "export")


def daemon_records(audit: Path) -> list[Record]:
    """What the daemon wrote for the run (the launcher's own policy and packet records are not exported)."""
    return [
        r for r in read_records(audit)
        if (r["event"] in ("decision", "close", "request") and r["kind"] != "packet")
        or (r["event"] == "limit" and r["limit"] != "export")
    ]  # fmt: skip


def test_a_hanging_collector_delays_no_connection_and_every_record_it_never_took_is_counted(e: Env) -> None:
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{COLLECTOR_HANG}:4318",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1000",
        "OTEL_BLRP_EXPORT_TIMEOUT": "2000",
        "OTEL_BLRP_SCHEDULE_DELAY": "100",
        "OTEL_BLRP_MAX_QUEUE_SIZE": "4",  # smaller than what the run writes: the queue overflows too
    }
    audit = e.audit("hang")
    before = len(e.allowed.log_records("http"))
    t0 = time.monotonic()
    r = e.sg(**otel).run(audit=audit, cmd=["sh", "-c", f"for i in 1 2 3 4 5 6; do {CURL} http://allowed.test/; done"])
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")[:6]
    assert [x.split()[0] for x in lines] == ["200"] * 6, r.stdout
    assert max(float(x.split()[1]) for x in lines) < 3.0, r.stdout  # each request as fast as ever, in seconds
    assert took < 25, took  # the run's end does not wait for the collector either
    assert len(e.allowed.log_records("http")) - before == 6
    assert e.hang.requests and e.hang.answered == 0
    task = task_of(audit)
    wrote = len(daemon_records(audit))
    deadline = time.monotonic() + 20  # the exporter gives up within its deadlines, then says so
    while exported_losses(audit, task) < wrote and time.monotonic() < deadline:
        time.sleep(0.2)
    assert exported_losses(audit, task) == wrote >= 12  # every record the collector never took, counted
    reasons = {r["reason"] for r in read_records(audit) if r["event"] == "limit" and r["limit"] == "export"}
    assert any("queue (4 records) was full" in x for x in reasons) and any("no answer within" in x for x in reasons)


def test_a_setting_sandgate_cannot_honour_stops_the_run_before_its_command(e: Env) -> None:
    marker = e.world.tmp / f"ran-{time.monotonic_ns()}"
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{COLLECTOR_A}:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    r = e.sg(**otel).run(audit=e.audit("grpc"), cmd=["touch", str(marker)])
    assert r.returncode == 125 and not marker.exists()
    assert r.stderr.startswith("sandgate: error: OTEL_EXPORTER_OTLP_PROTOCOL=grpc") and r.stderr.count("\n") == 1, (
        r.stderr
    )
    assert "Traceback" not in r.stderr
    ok = e.sg(OTEL_SDK_DISABLED="true", **otel).run(audit=e.audit("off"), cmd=["touch", str(marker)])
    assert ok.returncode == 0 and marker.exists(), ok.stderr  # the same settings, export turned off: it runs


def test_json_records_decode_to_the_same_rows_as_what_the_log_says(e: Env) -> None:
    """The record a run's log holds and the collector's row agree field for field (a run's only decision)."""
    audit = e.audit("agree")
    otel = {
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": f"http://{COLLECTOR_A}:4318/v1/logs",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    }
    r = e.sg(**otel).run(audit=audit, cmd=["sh", "-c", f"{CURL} http://blocked.test/"])
    assert r.returncode == 0 and r.stdout.startswith("403"), r.stderr
    task = task_of(audit)
    rows = wait_rows(e.a, task, lambda rs: any(x.event_name == "sandgate.decision" for x in rs))
    logged = [x for x in read_records(audit) if x["event"] == "decision" and x["host"] == "blocked.test"]
    row = decision(rows, "deny", "blocked.test")
    assert len(logged) == 1 and json.dumps(row.attributes["sandgate.id"]) == json.dumps(logged[0]["id"])
    assert row.attributes["sandgate.rule"] if logged[0]["rule"] else "sandgate.rule" not in row.attributes
    assert (
        row.attributes["sandgate.reason"] == logged[0]["reason"]
        and row.attributes["sandgate.kind"] == logged[0]["kind"]
    )


def test_an_unprivileged_users_run_exports_its_decisions_too(e: Env, unprivileged: UnprivilegedUser) -> None:
    """Rootless: the user's own daemon exports, over TLS verified with a certificate file the user's launcher read."""
    e.world.tmp.chmod(0o755)  # the user reads the policy and the CA file there
    work = unprivileged.home / "work"
    work.mkdir()
    os.chown(work, unprivileged.uid, unprivileged.gid)
    audit = work / "audit.jsonl"
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector-b.test:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(e.world.ca_pem),
        "OTEL_BLRP_SCHEDULE_DELAY": "100",
    }
    before = (len(e.allowed.log_records("http")), len(e.blocked.log_records()))
    sg = Sandgate(unprivileged.runner(e.world), policy=e.policy, cwd=work, env={**env(), **otel}, timeout=60)
    r = sg.run(audit=audit, cmd=["sh", "-c", f"{CURL} http://allowed.test/; {CURL} http://blocked.test/"])
    assert r.returncode == 0 and r.stdout.split()[0] == "200" and r.stdout.split()[2] == "403", (r.stdout, r.stderr)
    assert (len(e.allowed.log_records("http")) - before[0], len(e.blocked.log_records()) - before[1]) == (1, 0)
    task = task_of(audit)
    rows = wait_rows(e.b, task, lambda rs: any(x.attributes.get("server.address") == "blocked.test" for x in rs))
    assert decision(rows, "allow", "allowed.test").attributes["network.peer.address"] == ALLOWED
    assert decision(rows, "deny", "blocked.test").severity_text == "WARN"
