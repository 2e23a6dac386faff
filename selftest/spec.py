"""The verify spec: everything the probe runner inside the sandbox is told, as one typed record.

verify (outside) builds one VerifySpec per pass and writes it as JSON into the workspace; the
probe runner (inside, probes/runner.py) reads it back with load_spec. A field named wrong on
either side is a type error here, not a KeyError that a probe would report as "unsupported".

Stdlib only, Python >= 3.10: the runner imports this with whatever interpreter the sandboxed
command can execute.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class FileHandleSpec:
    """A file handle (name_to_handle_at) made outside: its type and its bytes in hex."""

    type: int
    hex: str


@dataclass(frozen=True, kw_only=True)
class VerifySpec:
    """What the probes reach for: the fake internet, the host's planted state, the pass's files."""

    # the fake internet (fakenet.py): names, addresses and ports of the canaries
    allowed_host: str
    allowed_ip: str
    blocked_host: str
    blocked_ip: str
    tcp_port: int
    udp_port: int
    quic_port: int
    other_port: int
    host_loopback_port: int
    rogue_resolver: str
    exfil_domain: str
    rebind_loopback_host: str
    rebind_metadata_host: str
    rebind_own_host: str
    wild_domain: str
    wild_ip: str
    abstract_socket: str
    path_socket: str
    world_netns: str
    # the inspected upstreams (inspectnet.py): never the real secret, only its shape and digest
    git_url: str
    git_head: str
    api_host: str
    other_host: str
    cred_env: str
    cred_prefix: str
    cred_sha256: str
    passthrough_sha256: str
    # the host's state (planted.py)
    root_dev: tuple[int, int]
    root_dev_path: str
    shm_id: int
    host_key: int
    host_key_description: str
    ssh_key_handle: FileHandleSpec
    # the pass: its files, secrets and runner
    ca: str
    home: str
    outside_file: str
    outside_dir: str
    results_dir: str
    secret_marker: str
    secret_env: str
    visible_env: str
    daemon_token: str
    python: str
    marker_tag: str = ""
    only: tuple[str, ...] = ()  # probe or group names; empty: all
    # what staged.py put in the home, the environment and the workspace
    cred_marker: str
    home_control: str
    env_marker: str
    plain_env: str
    audit_log: str
    # the shared daemon (issue 22): another daemon of the command's uid, and the limits to try
    other_daemon_socket: str = ""  # "": verify started none (the probe is then unsupported)
    hog_connections: int = 0  # silent connections the starvation probe opens: past its share
    connection_share: int = 0  # netguard.decision.limits.PER_SANDBOX: at most this many may stay open
    head_limit: int = 0  # netguard.decision.limits.HEAD_MAX


def dump_spec(spec: VerifySpec) -> str:
    """The spec as the JSON object load_spec reads back."""
    return json.dumps(dataclasses.asdict(spec))


def load_spec(text: str) -> VerifySpec:
    """Read a spec written by dump_spec; ValueError for anything else (not an object, keys, types)."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("the spec must be a JSON object")
    names = {f.name for f in dataclasses.fields(VerifySpec)}
    if unknown := sorted(raw.keys() - names):
        raise ValueError(f"unknown spec key(s): {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(VerifySpec):
        if f.name in raw:
            values[f.name] = _field(f.name, str(f.type), raw[f.name])
    try:
        return VerifySpec(**values)
    except TypeError as e:  # a missing key
        raise ValueError(f"incomplete spec: {e}") from None


def _field(name: str, declared: str, value: Any) -> Any:
    """One JSON value as the field's type (lists back to tuples, the handle to its record)."""
    if declared == "FileHandleSpec" and isinstance(value, dict) and value.keys() == {"type", "hex"}:
        return FileHandleSpec(type=_field(name, "int", value["type"]), hex=_field(name, "str", value["hex"]))
    if declared.startswith("tuple[int") and isinstance(value, list) and len(value) == 2:
        return (_field(name, "int", value[0]), _field(name, "int", value[1]))
    if declared.startswith("tuple[str") and isinstance(value, list):
        return tuple(_field(name, "str", v) for v in value)
    if declared == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if declared == "str" and isinstance(value, str):
        return value
    raise ValueError(f"spec key {name!r}: {value!r} is not a {declared}")
