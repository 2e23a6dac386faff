"""netguard.otlp and netguard.otlplogs: the OTEL_* variables as the spec reads them, audit records as OTLP
log records, and both encodings checked by decoding them with the official opentelemetry-proto classes."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from netguard import audit, otelenv, otlp, otlplogs
from netguard import spec as specmod
from netguard.daemon.otlpsend import backoff
from netguard.otlp import OtlpConfig, OtlpError

from ..support import otlpfake

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def read_pem(path: str) -> str:
    if path == "/ca.pem":
        return PEM
    raise FileNotFoundError(2, "No such file or directory")


def config(**env: str) -> tuple[OtlpConfig | None, list[str]]:
    return otelenv.from_env(env, read_pem)


# ---- the environment ------------------------------------------------------------------------


def test_no_endpoint_means_no_export_and_no_guessed_localhost() -> None:
    assert config() == (None, [])
    assert config(OTEL_SERVICE_NAME="x", OTEL_EXPORTER_OTLP_HEADERS="a=b") == (None, [])


def test_the_generic_endpoint_gets_v1_logs_appended_the_logs_endpoint_is_used_as_is() -> None:
    for base in ("http://c.test:4318", "http://c.test:4318/"):
        cfg, _ = config(OTEL_EXPORTER_OTLP_ENDPOINT=base)
        assert cfg is not None and cfg.endpoint == "http://c.test:4318/v1/logs"
    cfg, _ = config(OTEL_EXPORTER_OTLP_ENDPOINT="https://c.test/otlp/")
    assert cfg is not None and cfg.endpoint == "https://c.test/otlp/v1/logs"
    cfg, _ = config(
        OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="http://c.test:4318/custom", OTEL_EXPORTER_OTLP_ENDPOINT="http://x"
    )
    assert cfg is not None and cfg.endpoint == "http://c.test:4318/custom"


def test_logs_variables_win_over_the_generic_ones_whole() -> None:
    cfg, warnings = config(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test:4318",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",  # the generic one says grpc: the logs one decides
        OTEL_EXPORTER_OTLP_LOGS_PROTOCOL="http/json",
        OTEL_EXPORTER_OTLP_HEADERS="a=1,b=2",
        OTEL_EXPORTER_OTLP_LOGS_HEADERS="c=3",
        OTEL_EXPORTER_OTLP_TIMEOUT="5000",
        OTEL_EXPORTER_OTLP_LOGS_TIMEOUT="2500",
        OTEL_EXPORTER_OTLP_CERTIFICATE="/nowhere.pem",
        OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE="/ca.pem",
    )
    assert cfg is not None and warnings == []
    assert (cfg.protocol, cfg.headers, cfg.timeout, cfg.certificate) == ("http/json", (("c", "3"),), 2.5, PEM)


def test_defaults_follow_the_spec() -> None:
    cfg, _ = config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test:4318")
    assert cfg == OtlpConfig("http://c.test:4318/v1/logs")
    assert (cfg.protocol, cfg.timeout, cfg.queue, cfg.batch, cfg.delay, cfg.deadline) == (
        "http/protobuf", 10.0, 2048, 512, 1.0, 30.0
    )  # fmt: skip
    assert cfg.resource == (("service.name", "sandgate"),)


def test_headers_are_trimmed_and_percent_decoded_and_bad_members_are_skipped_without_their_value() -> None:
    cfg, warnings = config(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test",
        OTEL_EXPORTER_OTLP_HEADERS=" api-key = s3cr%3Dt%2C1 , Authorization=Basic%20abc==,novalue-secretish,,x-t=caf%C3%A9,"
        "bad%0D%0Ainjected=v,x-crlf=a%0D%0AX-Evil: 1",
    )
    assert cfg is not None
    assert cfg.headers == (("api-key", "s3cr=t,1"), ("Authorization", "Basic abc=="), ("x-t", "café"))
    assert len(warnings) == 3 and not any("secretish" in w or "Evil" in w for w in warnings), warnings
    assert "s3cr" not in repr(cfg) and "api-key" not in repr(cfg)  # a repr never shows the headers


def test_resource_attributes_and_service_name() -> None:
    cfg, _ = config(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test",
        OTEL_RESOURCE_ATTRIBUTES="service.name=fromattrs,deployment.environment=ci%20runner,team=a",
    )
    assert cfg is not None and dict(cfg.resource) == {
        "service.name": "fromattrs", "deployment.environment": "ci runner", "team": "a"
    }  # fmt: skip
    cfg, _ = config(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_RESOURCE_ATTRIBUTES="service.name=x", OTEL_SERVICE_NAME="svc"
    )
    assert cfg is not None and dict(cfg.resource)["service.name"] == "svc"


@pytest.mark.parametrize("value", ["true", "TRUE", " True "])
def test_sdk_disabled_turns_export_off(value: str) -> None:
    assert config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_SDK_DISABLED=value)[0] is None


def test_sdk_disabled_other_values_and_logs_exporter() -> None:
    assert config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_SDK_DISABLED="false")[0] is not None
    assert config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_SDK_DISABLED="1")[0] is not None  # only "true"
    assert config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_LOGS_EXPORTER="none")[0] is None
    assert config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_LOGS_EXPORTER="console,otlp")[0] is not None


def test_unparsable_values_are_warned_about_and_treated_as_unset() -> None:
    cfg, warnings = config(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/xml",
        OTEL_EXPORTER_OTLP_TIMEOUT="soon",
        OTEL_EXPORTER_OTLP_COMPRESSION="brotli",
        OTEL_BLRP_MAX_QUEUE_SIZE="-3",
    )
    assert cfg is not None and (cfg.protocol, cfg.timeout, cfg.compression, cfg.queue) == (
        "http/protobuf", 10.0, "none", 2048
    )  # fmt: skip
    assert len(warnings) == 4


def test_batching_variables_are_bounded() -> None:
    cfg, _ = config(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test",
        OTEL_BLRP_MAX_QUEUE_SIZE="10000000",
        OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="100000",
        OTEL_BLRP_SCHEDULE_DELAY="200",
        OTEL_BLRP_EXPORT_TIMEOUT="999999999",
    )
    assert cfg is not None and (cfg.queue, cfg.batch, cfg.delay, cfg.deadline) == (
        otlp.MAX_QUEUE,
        otlp.MAX_QUEUE,
        0.2,
        120,
    )
    cfg, _ = config(OTEL_EXPORTER_OTLP_ENDPOINT="http://c.test", OTEL_BLRP_MAX_QUEUE_SIZE="8")
    assert cfg is not None and cfg.batch == 8  # never more than the queue


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTLP/HTTP only"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c.test:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT must be an http"),
        ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "ftp://c.test"}, "must be an http"),
        ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "https://u:hunter2@c.test"}, "put credentials in"),
        ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c.test:99999"}, "is not a URL"),
        ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/missing.pem"}, "cannot read OTEL_EXPORTER_OTLP_CERTIFICATE"),
    ],
)
def test_what_sandgate_cannot_honour_is_one_clear_error(env: dict[str, str], message: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c.test:4318", **env}
    with pytest.raises(OtlpError, match=message) as e:
        otelenv.from_env(env, read_pem)
    assert "hunter2" not in str(e.value) and "\n" not in str(e.value)


# ---- the spec carries it to the daemon --------------------------------------------------------


def full_config() -> OtlpConfig:
    cfg, _ = config(
        OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="https://c.test:4318/v1/logs",
        OTEL_EXPORTER_OTLP_HEADERS="api-key=topsecret",
        OTEL_EXPORTER_OTLP_CERTIFICATE="/ca.pem",
        OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
    )
    assert cfg is not None
    return cfg


def test_the_config_round_trips_through_the_bind_spec() -> None:
    from netguard.policy import parse_network

    cfg = full_config()
    s = specmod.BindingSpec("t", parse_network({"allow": ["a.test"]}, "p.yaml"), otlp=cfg)
    wire = json.loads(json.dumps(specmod.encode(s)))
    assert specmod.decode(wire).otlp == cfg
    assert specmod.decode(specmod.encode(specmod.BindingSpec("t", s.policy))).otlp is None


@pytest.mark.parametrize(
    "change",
    [
        {"headers": [["bad name", "topsecret"]]},
        {"headers": [["k", "topsecret\r\nX: y"]]},
        {"endpoint": "file:///etc/passwd"},
        {"protocol": "grpc"},
        {"queue": 0},
        {"batch": 999999},
        {"timeout": float("nan")},
        {"extra": 1},
    ],
)
def test_the_daemon_refuses_a_malformed_otlp_spec_without_quoting_the_headers(change: dict[str, Any]) -> None:
    wire = otlp.encode(full_config())
    assert wire is not None
    with pytest.raises(specmod.SpecError) as e:
        otlp.decode({**wire, **change}, specmod.SpecError)
    assert "topsecret" not in str(e.value)


# ---- records as log records -----------------------------------------------------------------


def records() -> list[audit.Record]:
    return [
        audit.decision_record(
            "t1",
            "i1",
            "http",
            "allow",
            "a.test",
            80,
            ip="198.51.100.10",
            method="GET",
            url="http://a.test/v1/x?token=q",
            rule="p.yaml:3: a.test",
        ),
        audit.decision_record("t1", "i2", "connect", "deny", "b.test", 443, reason="not in the policy"),
        audit.decision_record("t1", "i3", "dns", "deny", "c.test", None, qtype="TXT", reason="no"),
        audit.decision_record("t1", "i4", "tls", "allow", "d.test", 443, ip="198.51.100.4", would="deny"),
        audit.close_record("t1", "i1", "http", "a.test", 80, "198.51.100.10", 10, 20, 30),
        audit.request_record("t1", "i1", "http", "deny", "a.test", 80, "POST", "/up", status=403, leak="GH_TOKEN"),
        audit.limit_record("t1", "tcp", "connections", 7, "per-sandbox connection limit"),
        audit.policy_record(
            "t1",
            write=["."],
            private_tmp=True,
            protect=[],
            hidden=["~/.ssh"],
            env_dropped=["OTEL_EXPORTER_OTLP_HEADERS"],
            landlock_abi=4,
            warnings=[],
        ),
    ]


def test_each_record_maps_to_semantic_convention_attributes() -> None:
    e = [otlplogs.entry(r) for r in records()]
    http, connect, dns, learn, close, leak, limit, policy = (dict(x.attributes) for x in e)
    assert http["server.address"] == "a.test" and http["server.port"] == 80
    assert http["network.peer.address"] == "198.51.100.10" and http["http.request.method"] == "GET"
    assert http["url.path"] == "/v1/x"  # never the query
    assert http["sandgate.action"] == "allow" and http["sandgate.rule"] == "p.yaml:3: a.test"
    assert http["sandgate.task"] == "t1" and http["sandgate.event"] == "decision" and http["sandgate.kind"] == "http"
    assert connect["sandgate.reason"] == "not in the policy" and "network.peer.address" not in connect
    assert dns["dns.question.name"] == "c.test" and "server.address" not in dns and dns["sandgate.qtype"] == "TXT"
    assert learn["sandgate.would"] == "deny"
    assert close["sandgate.bytes_up"] == 10 and close["sandgate.duration_ms"] == 30
    assert (
        leak["http.response.status_code"] == 403 and leak["url.path"] == "/up" and leak["sandgate.leak"] == "GH_TOKEN"
    )
    assert limit["sandgate.limit"] == "connections" and limit["sandgate.count"] == 7
    assert policy["sandgate.env_dropped"] == ("OTEL_EXPORTER_OTLP_HEADERS",) and policy["sandgate.private_tmp"] is True
    assert [x.severity for x in e] == [9, 13, 13, 13, 9, 17, 13, 9]  # deny, would-deny, limit: WARN; leak: ERROR
    assert [x.event_name for x in e][:5] == ["sandgate.decision"] * 4 + ["sandgate.close"]
    assert e[1].body == "deny connect b.test:443 (not in the policy)"


def test_the_record_time_becomes_nanoseconds() -> None:
    r = {**records()[0], "ts": "2026-12-05T03:44:51.123Z"}
    assert otlplogs.entry(r).time_ns == 1796442291_123_000_000  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_both_encodings_decode_with_opentelemetry_proto(protocol: str) -> None:
    cfg = OtlpConfig("http://c.test/v1/logs", protocol, resource=(("service.name", "sandgate"), ("team", "x")))  # type: ignore[arg-type]
    body = otlplogs.request_body(cfg, [otlplogs.entry(r) for r in records()], 1_800_000_000_000_000_000)
    rows = otlpfake.decode(otlpfake.Received("/v1/logs", {"Content-Type": otlplogs.content_type(cfg)}, body))
    assert len(rows) == len(records())
    assert rows[0].resource == {"service.name": "sandgate", "team": "x"}
    assert rows[0].scope == ("sandgate.audit", str(audit.SCHEMA))
    assert rows[0].attributes["server.port"] == 80 and rows[0].attributes["url.path"] == "/v1/x"
    assert rows[0].observed_ns == 1_800_000_000_000_000_000 and rows[0].time_ns > 0
    assert rows[1].severity == logs_pb2.SEVERITY_NUMBER_WARN and rows[1].severity_text == "WARN"
    assert rows[-1].attributes["sandgate.env_dropped"] == ["OTEL_EXPORTER_OTLP_HEADERS"]
    assert rows[-1].attributes["sandgate.private_tmp"] is True and rows[-1].attributes["sandgate.landlock_abi"] == 4
    assert [r.event_name for r in rows] == [otlplogs.entry(r).event_name for r in records()]


def test_gzip_when_asked() -> None:
    cfg = OtlpConfig("http://c.test/v1/logs", compression="gzip")
    body = otlplogs.request_body(cfg, [otlplogs.entry(records()[0])], 1)
    req = logs_service_pb2.ExportLogsServiceRequest.FromString(gzip.decompress(body))
    assert req.resource_logs[0].scope_logs[0].log_records[0].body.string_value.startswith("allow http GET")


@given(
    st.text(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.lists(st.text(max_size=8), max_size=4),
    st.booleans(),
)
def test_the_protobuf_encoder_round_trips_any_value(text: str, n: int, items: list[str], flag: bool) -> None:
    e = otlplogs.LogEntry(2**64 - 1, 9, text, "sandgate.x", (("s", text), ("i", n), ("a", tuple(items)), ("b", flag)))
    req = logs_service_pb2.ExportLogsServiceRequest.FromString(otlplogs.encode_protobuf([("k", text)], [e], 5))
    got = otlpfake.decode(otlpfake.Received("/", {}, req.SerializeToString()))[0]
    safe = text.encode("utf-8", "replace").decode()  # lone surrogates are replaced, never a crash
    assert (got.body, got.time_ns, got.resource) == (safe, 2**64 - 1, {"k": safe})
    assert got.attributes == {"s": safe, "i": n, "a": [s.encode("utf-8", "replace").decode() for s in items], "b": flag}


def test_partial_success_is_read_in_both_protocols() -> None:
    resp = logs_service_pb2.ExportLogsServiceResponse()
    resp.partial_success.rejected_log_records = 3
    resp.partial_success.error_message = "too old"
    assert otlplogs.rejected(OtlpConfig("http://c"), resp.SerializeToString()) == 3
    assert otlplogs.rejected(OtlpConfig("http://c", "http/json"), json_format.MessageToJson(resp).encode()) == 3
    for junk in (b"", b"\xff\xff\xff", b"<html>", b"\x0a\x05\x08"):
        assert otlplogs.rejected(OtlpConfig("http://c"), junk) == 0
        assert otlplogs.rejected(OtlpConfig("http://c", "http/json"), junk) == 0


def test_backoff_doubles_with_jitter_and_honours_retry_after() -> None:
    assert [backoff(a, None, 0.5, 8.0, 0.5) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert 0.4 <= backoff(0, None, 0.5, 8.0, 0.0) < backoff(0, None, 0.5, 8.0, 1.0) <= 0.6 + 1e-9
    assert backoff(3, "7", 0.5, 8.0, 0.5) == 7.0
    assert backoff(0, "Wed, 21 Oct 2015 07:28:00 GMT", 0.5, 8.0, 0.5) == 0.0  # a date in the past: now
    assert backoff(1, "whenever", 0.5, 8.0, 0.5) == 1.0


def test_a_run_without_otel_variables_imports_nothing_of_the_export() -> None:
    """Issue 25's warm start: only the small config record comes with the spec; the rest only when used."""
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; from launcher.run import launch, otlpenv; assert otlpenv.settings() is None; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert "netguard.otlp" in loaded  # the spec's field type
    assert not loaded & {
        "netguard.otelenv",
        "netguard.otlplogs",
        "netguard.daemon.otlpexport",
        "netguard.daemon.otlpsend",
    }


def test_the_launcher_reads_the_environment_once_and_says_what_it_ignores(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.errors import RunError
    from launcher.run import otlpenv

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c.test:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=topsecret,broken")
    otlpenv.settings.cache_clear()
    try:
        cfg = otlpenv.settings()
        assert cfg is not None and cfg.headers == (("api-key", "topsecret"),) and otlpenv.settings() is cfg
        err = capsys.readouterr().err
        assert err.startswith("sandgate: warning: OTEL_EXPORTER_OTLP_HEADERS: entry 2") and "topsecret" not in err
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        otlpenv.settings.cache_clear()
        with pytest.raises(RunError, match="OTLP/HTTP only"):
            otlpenv.settings()
    finally:
        otlpenv.settings.cache_clear()


def test_the_launcher_checks_the_certificate_file_before_the_run(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.errors import RunError
    from launcher.run import otlpenv
    from selftest import certs

    good, bad = tmp_path / "ca.pem", tmp_path / "bad.pem"
    certs.CA().write_cert(good)
    bad.write_text("-----BEGIN CERTIFICATE-----\nMIIBnot\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c.test:4318")
    try:
        for path, ok in ((good, True), (bad, False), (tmp_path / "missing.pem", False)):
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(path))
            otlpenv.settings.cache_clear()
            if ok:
                cfg = otlpenv.settings()
                assert cfg is not None and cfg.certificate == good.read_text()
            else:
                with pytest.raises(RunError, match=f"cannot read OTEL_EXPORTER_OTLP_CERTIFICATE {path}"):
                    otlpenv.settings()
    finally:
        otlpenv.settings.cache_clear()
