"""`sandgate export cilium|smokescreen|cnp [policy options]`: the run's policy for another egress engine.

The policy comes from policyargs.policy_from_args, the call `sandgate run` makes, so an export cannot
disagree with what a run enforces; the translation is netguard.export's (pure). The document goes to
stdout as YAML; every gap goes to stderr, one line each, and a gap that would make the engine allow
more than sandgate (a hole in a wildcard, learn mode for Cilium) fails the export with nothing printed.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from netguard.export import cilium, plan, smokescreen

if TYPE_CHECKING:
    from launcher.run.policyargs import PolicyArgs

#: Why there is no `export cnp` yet (kubernetes-sigs/network-policy-api, read at commit 0eec1b0e, 2026-07-01).
CNP_UNSTABLE = (
    "export cnp is not available: ClusterNetworkPolicy is v1alpha2 and its domainNames are in the experimental "
    "channel only (network-policy-api v0.2.0); use 'sandgate export cilium' (see docs/fleet.md)"
)


@dataclass(frozen=True)
class ExportArgs:
    """`sandgate export`'s command line as given (typed by launcher/cli.py)."""

    engine: str
    policy: PolicyArgs
    learn: bool = False
    name: str | None = None
    namespace: str | None = None
    selector: tuple[str, ...] = ()
    cilium_version: str | None = None
    project: str | None = None


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_VERSION = re.compile(r"(\d+)\.(\d+)(\.\d+)?")


def _k8s_name(text: str, what: str, limit: int = 253) -> str:
    if len(text) > limit or not _DNS_SUBDOMAIN.fullmatch(text) or (limit == 63 and "." in text):
        raise UsageError(f"{what} '{text}' is not a Kubernetes name: lowercase letters, digits, '-' and '.'")
    return text


def _selector(items: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_NAME.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise UsageError(f"--selector '{item}': expected LABEL=VALUE, Kubernetes label syntax (e.g. app=agent)")
        out.append((key, value))
    return tuple(out)


def _version(text: str) -> tuple[int, int]:
    found = _VERSION.fullmatch(text.removeprefix("v"))
    if found is None:
        raise UsageError(f"--cilium-version '{text}': expected MAJOR.MINOR, e.g. 1.19")
    return int(found[1]), int(found[2])


def _check_options(args: ExportArgs) -> None:
    """Options of the other engine are a mistake, not something to ignore."""
    if args.engine == "smokescreen":
        for flag, value in (("--namespace", args.namespace), ("--selector", args.selector)):
            if value:
                raise UsageError(f"{flag} is for 'export cilium'; Smokescreen names a service (--name) and --project")
        if args.cilium_version is not None:
            raise UsageError("--cilium-version is for 'export cilium'")
    elif args.project is not None:
        raise UsageError("--project is for 'export smokescreen'")


def _document(args: ExportArgs, built: plan.Plan, sources: tuple[str, ...]) -> tuple[Any, list[plan.Gap]]:
    if args.engine == "cilium":
        target = cilium.Target(
            name=_k8s_name(args.name or "sandgate-egress", "--name"),
            namespace=_k8s_name(args.namespace, "--namespace", 63) if args.namespace else None,
            selector=_selector(args.selector),
            version=_version(args.cilium_version) if args.cilium_version else cilium.MULTI_LABEL_VERSION,
            description=f"sandgate export of {', '.join(sources) or 'no policy'}",
        )
        return cilium.document(built, target)
    return smokescreen.document(
        built, smokescreen.Target(name=args.name or "sandgate-task", project=args.project or "sandgate")
    )


def report(gaps: list[plan.Gap], engine: str) -> None:
    """One stderr line per gap: what the engine does differently, where it comes from."""
    word = {"refused": "refused", "narrowed": "narrowed", "sandgate-only": "only sandgate enforces"}
    for g in gaps:
        print(f"sandgate: {engine}: {word[g.severity]}: {g.text}  [{g.origin}]", file=sys.stderr)


def main(args: ExportArgs) -> int:
    """Print the engine's document for the policy these options give a run; refuse anything it would widen."""
    if args.engine == "cnp":
        raise UsageError(CNP_UNSTABLE)
    _check_options(args)
    from launcher.run import policyargs

    pol = policyargs.policy_from_args(args.policy)
    built = plan.build(pol.network, learn=args.learn)
    doc, extra = _document(args, built, pol.sources)
    gaps = [*built.gaps, *extra]
    report(gaps, args.engine)
    refused = sum(g.severity == "refused" for g in gaps)
    if refused:
        raise UsageError(
            f"{refused} rule(s) above cannot be exported to {args.engine} without allowing more than sandgate; "
            "change the policy and export again"
        )
    import yaml

    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return 0
