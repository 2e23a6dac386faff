"""Issue 27 items 1-2 at the command line: `sandgate export` reads the policy as `run` does, prints YAML,
says every gap on stderr, and fails in one line when the engine would allow more than sandgate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import EXIT_ERROR

from .test_export_cilium import errors as crd_errors
from .test_export_smokescreen import load_acl

REPO = Path(__file__).resolve().parent.parent.parent


def sandgate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, in an empty directory with an empty home (no workspace or user policy)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def bundled_hosts(name: str) -> list[str]:
    doc = yaml.safe_load((REPO / "allowlists" / f"{name}.yaml").read_text())
    return [e if isinstance(e, str) else e["host"] for e in doc["network"]["allow"]]


def fqdns(doc: dict[str, Any]) -> list[str]:
    found = [s.get("matchName") or s["matchPattern"] for r in doc["spec"]["egress"] for s in r.get("toFQDNs", [])]
    return list(dict.fromkeys(found))


def test_export_cilium_allow_pypi_names_exactly_the_bundled_hosts(tmp_path: Path) -> None:
    out = sandgate(tmp_path, "export", "cilium", "--allow", "pypi", "--namespace", "ci", "--selector", "app=agent")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert fqdns(doc) == bundled_hosts("pypi") == ["pypi.org", "files.pythonhosted.org"]
    assert crd_errors(doc) == []
    assert doc["metadata"]["namespace"] == "ci" and doc["spec"]["endpointSelector"] == {"matchLabels": {"app": "agent"}}
    assert out.stderr == ""  # nothing the engine cannot say


def test_export_smokescreen_allow_pypi_lists_the_hosts_and_says_ports_are_lost(tmp_path: Path) -> None:
    out = sandgate(tmp_path, "export", "smokescreen", "--allow", "pypi", "--name", "ci-runner", "--project", "infra")
    assert out.returncode == 0, out.stderr
    doc = load_acl(out.stdout)
    assert doc["services"] == [
        {"name": "ci-runner", "project": "infra", "action": "enforce", "allowed_domains": bundled_hosts("pypi")}
    ]
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandgate: smokescreen: only sandgate enforces: ports:")


def test_export_agrees_with_explain_on_the_same_options(tmp_path: Path) -> None:
    """The same options, the same policy: export cannot disagree with what run (and explain) enforce."""
    opts = ["--allow", "pypi", "--allow", "npm", "--allow", "*.example.test:8443", "--deny", "repo.yarnpkg.com"]
    explained = sandgate(tmp_path, "explain", "--json", *opts)
    assert explained.returncode == 0, explained.stderr
    allow = json.loads(explained.stdout)["network"]["allow"]
    expected = [a["host"] for a in allow if a["host"] != "repo.yarnpkg.com"]  # deny beats allow
    out = sandgate(tmp_path, "export", "cilium", *opts)
    assert out.returncode == 0, out.stderr
    assert [n.removeprefix("**").removeprefix("*") for n in fqdns(yaml.safe_load(out.stdout))] == [
        h.removeprefix("*") for h in expected
    ]


def test_a_hole_in_a_wildcard_fails_with_nothing_on_stdout(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text('version: 1\nnetwork:\n  allow:\n    - "*.pypi.test"\n  deny:\n    - upload.pypi.test\n')
    out = sandgate(tmp_path, "export", "cilium", "--policy", "p.yaml")
    assert out.returncode == EXIT_ERROR and out.stdout == ""
    lines = out.stderr.splitlines()
    assert lines[0].startswith("sandgate: cilium: refused: deny upload.pypi.test lies inside allowed *.pypi.test")
    assert lines[0].endswith("[p.yaml:6]")
    assert lines[-1].startswith("sandgate: error: 1 rule(s) above cannot be exported to cilium")


def test_request_rules_and_credentials_are_said_not_dropped(tmp_path: Path) -> None:
    out = sandgate(tmp_path, "export", "cilium", "--allow", "github-readonly")
    assert out.returncode == 0, out.stderr
    assert "only sandgate enforces: github.com: its requests are inspected and judged by http rules" in out.stderr
    assert "github.com" in fqdns(yaml.safe_load(out.stdout))


def test_learn_is_report_for_smokescreen_and_refused_for_cilium(tmp_path: Path) -> None:
    out = sandgate(tmp_path, "export", "smokescreen", "--learn", "--allow", "pypi")
    assert out.returncode == 0 and load_acl(out.stdout)["services"][0]["action"] == "report"
    out = sandgate(tmp_path, "export", "cilium", "--learn", "--allow", "pypi")
    assert out.returncode == EXIT_ERROR and out.stdout == "" and "no learn mode" in out.stderr


def test_an_old_cilium_gets_one_label_wildcards_and_is_told(tmp_path: Path) -> None:
    out = sandgate(tmp_path, "export", "cilium", "--allow", "*.example.test", "--cilium-version", "1.18")
    assert out.returncode == 0, out.stderr
    assert fqdns(yaml.safe_load(out.stdout)) == ["*.example.test"]
    assert "narrowed: *.example.test: written as '*.example.test', one label only (Cilium < 1.19)" in out.stderr


def one_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == EXIT_ERROR and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandgate: error: "), out.stderr
    return lines[0]


def test_user_mistakes_are_one_line(tmp_path: Path) -> None:
    assert "v1alpha2" in one_error(sandgate(tmp_path, "export", "cnp", "--allow", "pypi"))
    assert "--namespace is for 'export cilium'" in one_error(
        sandgate(tmp_path, "export", "smokescreen", "--allow", "pypi", "--namespace", "x")
    )
    assert "--project is for 'export smokescreen'" in one_error(
        sandgate(tmp_path, "export", "cilium", "--allow", "pypi", "--project", "x")
    )
    assert "LABEL=VALUE" in one_error(sandgate(tmp_path, "export", "cilium", "--allow", "pypi", "--selector", "app"))
    assert "not a Kubernetes name" in one_error(
        sandgate(tmp_path, "export", "cilium", "--allow", "pypi", "--name", "A_B")
    )
    assert "not a Kubernetes name" in one_error(
        sandgate(tmp_path, "export", "cilium", "--allow", "pypi", "--namespace", "a.b")  # a namespace is one label
    )
    assert "MAJOR.MINOR" in one_error(
        sandgate(tmp_path, "export", "cilium", "--allow", "pypi", "--cilium-version", "latest")
    )
    assert "no policy" in one_error(sandgate(tmp_path, "export", "cilium"))
