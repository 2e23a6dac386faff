"""`sandgate explain [run options]` and `run --dry-run`: the boundary a run would get, nothing started.

Never a second reading of the options: the policy and the options come from options.build, the
call `run` makes, and the filesystem plan from the planning
steps of launcher/run/confinement.py, so what this prints and what run enforces cannot disagree.
Left out, because they are made only when a run starts: the home's writable layer (described in
words) and the per-run CA. Secrets are never read: a credential is named by header, variable and file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.config import load as lpolicy
from netguard.policy import DEFAULT_ALLOW_PORTS, NetworkPolicy, Rule

if TYPE_CHECKING:
    from launcher.run.options import RunArgs, RunOptions
    from sgbase.origin import Origin


@dataclass(frozen=True)
class Files:
    """The filesystem and process part of the boundary, as -v prints it at a run's start."""

    writable: tuple[str, ...]
    private_tmp: bool
    read_only: tuple[str, ...]
    hidden: tuple[str, ...]
    exposed: tuple[str, ...]
    env_passed: tuple[str, ...]  # names only: values never leave the launcher
    env_dropped: tuple[str, ...]
    home: str
    landlock_abi: int
    nested_userns: bool
    warnings: tuple[str, ...]


# ---- pure: the network part as lines and as JSON ------------------------------------------------


def _ports(rule: Rule) -> str:
    return "any port" if rule.ports is None else "ports " + ",".join(map(str, sorted(rule.ports)))


def _pattern(rule: Rule) -> str:
    return f"*.{rule.value}" if rule.kind == "wildcard" else str(rule.value)


def _dns_types(rule: Rule) -> list[str]:
    if not rule.dns:
        return []
    import dns.rdatatype  # only for a policy that lists extra types (dnspython is slow to import)

    return sorted(dns.rdatatype.to_text(t) for t in rule.dns)  # type: ignore[arg-type]


def rule_json(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cidr" if rule.kind == "cidr" else "host": _pattern(rule),
        "ports": None if rule.ports is None else sorted(rule.ports),
        "origin": str(rule.origin),
    }
    if rule.inspect:
        out["inspect"] = True
        out["http"] = (
            None if rule.http is None else [{"rule": h.describe(), "origin": str(h.origin)} for h in rule.http]
        )
        out["log_query"] = rule.log_query
    if rule.dns:
        out["dns"] = _dns_types(rule)
    return out


def _rule_line(rule: Rule) -> str:
    extra = f"; DNS also {', '.join(_dns_types(rule))}" if rule.dns else ""
    tls = "; TLS inspected" if rule.inspect else ""
    return f"  {_pattern(rule)}  ({_ports(rule)}{tls}{extra})  {rule.origin}"


def _inspected(net: NetworkPolicy) -> list[str]:
    """Each inspected name and its request rules (none listed: every request allowed, each audited)."""
    out = []
    for r in (r for r in net.allow if r.inspect):
        rules = "every request allowed and audited" if r.http is None else "; ".join(h.describe() for h in r.http)
        query = ", query strings logged" if r.log_query else ""
        out.append(f"  {_pattern(r)}: {rules}{query}  {r.origin}")
    return out


def dns_line(net: NetworkPolicy) -> str:
    where = f"{net.resolver[0]}:{net.resolver[1]} ({net.resolver_origin})" if net.resolver else "the host's resolvers"
    return (
        "sandgate answers the command's DNS: allowed names only (exact names: every type; wildcard names: "
        f"A/AAAA unless the entry lists more), others refused and never sent upstream; upstream: {where}"
    )


def mode_line(learn: bool, ask: bool, approvals: str | None, ask_rules: int) -> str:
    if learn:
        return "learn: destinations the policy would deny are let through and recorded (files, IPs, UDP enforced)"
    who = f"a tool on {approvals}" if approvals else "you, on the terminal"
    if ask:
        return f"ask: every destination the policy does not allow is a question for {who}"
    if ask_rules:
        return f"ask rules: destinations they match are a question for {who}"
    return "enforce: anything not allowed is denied (default deny)"


def network_lines(pol: lpolicy.Policy, learn: bool, ask: bool, approvals: str | None) -> list[str]:
    """The network part, one fact a line; the same lines for `explain` and for `run -v`."""
    net = pol.network
    out = [f"policy from: {', '.join(pol.sources) or 'nothing (no policy: no destination is allowed)'}"]
    out.append(f"mode: {mode_line(learn, ask, approvals, len(net.ask))}")
    out.append(f"allowed ({len(net.allow)}; no ports given means {','.join(map(str, sorted(DEFAULT_ALLOW_PORTS)))}):")
    out += [_rule_line(r) for r in net.allow] or ["  -"]
    out.append(f"denied ({len(net.deny)}; deny beats allow):")
    out += [_rule_line(r) for r in net.deny] or ["  -"]
    if net.ask:
        out.append(f"asked ({len(net.ask)}):")
        out += [_rule_line(r) for r in net.ask]
    inspected = _inspected(net)
    out.append(f"TLS inspected ({len(inspected)}; the run's own CA is trusted inside):")
    out += inspected or ["  -"]
    out.append(f"credentials bound ({len(net.credentials)}; the command sees a stand-in, the proxy adds the secret):")
    out += [
        f"  {c.host}: header {c.header} from {('file ' + c.file) if c.file else '$' + c.variable}"
        f" (inside ${c.variable} holds a stand-in)  {c.origin}"
        for c in net.credentials
    ] or ["  -"]
    out.append(f"dns: {dns_line(net)}")
    return out


def network_json(pol: lpolicy.Policy, learn: bool, ask: bool, approvals: str | None) -> dict[str, Any]:
    net = pol.network
    creds = [
        {"host": c.host, "header": c.header, "variable": c.variable, "file": c.file, "origin": str(c.origin)}
        for c in net.credentials
    ]
    return {
        "sources": list(pol.sources),
        "narrowed": None
        if pol.narrowed is None
        else {"file": pol.narrowed.name, "ignored": list(pol.narrowed.ignored)},
        "mode": mode_line(learn, ask, approvals, len(net.ask)),
        "allow": [rule_json(r) for r in net.allow],
        "deny": [rule_json(r) for r in net.deny],
        "ask": [rule_json(r) for r in net.ask],
        "inspected": sorted({_pattern(r) for r in net.allow if r.inspect}),
        "credentials": creds,
        "resolver": None
        if net.resolver is None
        else {"address": list(net.resolver), "origin": _text(net.resolver_origin)},
        "dns": dns_line(net),
    }


def file_lines(f: Files) -> list[str]:
    tmp = " (private)" if f.private_tmp else ""
    return [
        f"writable: {', '.join(r + (tmp if r == '/tmp' else '') for r in f.writable)}",
        f"read-only: {', '.join(f.read_only) or '-'}",
        f"hidden: {', '.join(f.hidden) or '-'}",
        f"exposed sockets: {', '.join(f.exposed) or '-'}",
        f"home: {f.home} writable inside through a layer of its own; the real home never changes",
        f"environment passed: {', '.join(f.env_passed) or '-'}",
        f"environment dropped: {', '.join(f.env_dropped) or '-'}",
        f"landlock ABI {f.landlock_abi}" + (" (none: writes are NOT restricted)" if f.landlock_abi == 0 else ""),
        f"nested user namespaces: {'allowed (--allow-nested-userns)' if f.nested_userns else 'refused'}",
        *(f"warning: {w}" for w in f.warnings),
    ]


# ---- effects: the options, the filesystem plan ---------------------------------------------------


def _files(opts: RunOptions) -> Files:
    """The filesystem plan of `opts` by confinement's own steps (mounts, runtime dirs, sockets, env)."""

    from fsguard import landlock
    from launcher.run import confinement, pathwarn, runstate

    rt = runstate.runtime_dir()
    secret_files = tuple(os.path.abspath(os.path.expanduser(c.file)) for c in opts.policy.network.credentials if c.file)
    lay = confinement.layout(opts, rt, secret_files, overlay=False)  # run's own steps; no home layer prepared
    mplan, shown, env, dropped, home = lay.mounts, lay.shown, lay.env, lay.env_dropped, lay.home
    env.update({c.variable: "(stand-in)" for c in opts.policy.network.credentials})  # as brokered.apply_env
    return Files(
        writable=mplan.write_roots,
        private_tmp=mplan.private_tmp,
        read_only=(*mplan.protect, *(p for p, _ in mplan.placeholders)),
        hidden=(*mplan.hide_dirs, *mplan.hide_files),
        exposed=tuple(e.path for e in shown),
        env_passed=tuple(sorted(env)),
        env_dropped=tuple(dropped),
        home=home,
        landlock_abi=landlock.abi_version(),
        nested_userns=opts.nested_userns,
        warnings=(*lay.warnings, *pathwarn.warnings(env.get("PATH"), mplan)),
    )


def _options(args: RunArgs) -> RunOptions:
    """The run's options by run's own code, without the side effects of a start (no audit log is made)."""
    from launcher.audit import logs as auditlogs
    from launcher.run import options

    audit = args.audit_log or str(auditlogs.log_dir() / "audit-(dry-run).jsonl")  # named, never created
    return options.build(dataclasses.replace(args, audit_log=audit))


def main(args: RunArgs) -> int:
    """Print the boundary of these options; start nothing (no daemon, no sandbox, no audit log)."""
    if sys.platform == "win32":  # the filesystem plan below is the Linux backend's
        from launcher.errors import UsageError

        raise UsageError("explain and run --dry-run are not available on Windows yet; see docs/windows.md")
    opts = _options(args)
    files = _files(opts)
    if args.json:
        doc = {
            "command": opts.cmd,
            "network": network_json(opts.policy, opts.learn, opts.ask, opts.approvals),
            "egress": egress_lines(opts),
            "filesystem": dataclasses.asdict(files),
        }
        print(json.dumps(doc, indent=1))
        return 0
    _print(
        opts.cmd,
        [*network_lines(opts.policy, opts.learn, opts.ask, opts.approvals), *egress_lines(opts)],
        file_lines(files),
    )
    return 0


def _print(cmd: Sequence[str], net: list[str], files: list[str]) -> None:
    head = f"sandgate run would start: {' '.join(cmd)}" if cmd else "sandgate run with these options would enforce:"
    out = [head, "", "network", *(f"  {line}" for line in net), "", "filesystem and process"]
    out += [f"  {line}" for line in files]
    out += ["", "nothing was started (dry run)"]
    sys.stdout.write("\n".join(out) + "\n")


def verbose(opts: RunOptions) -> None:
    """`run -v`: the network part on stderr, before the run (the filesystem part is confinement's)."""
    for line in (*network_lines(opts.policy, opts.learn, opts.ask, opts.approvals), *egress_lines(opts)):
        print(f"sandgate: {line}", file=sys.stderr)


def egress_lines(opts: RunOptions) -> list[str]:
    """Where allowed connections and the run's decisions leave this machine: the corporate proxy and
    the OTLP collector, by address only (their credentials and headers are secrets: never shown)."""
    from launcher.run import otlpenv

    up = opts.upstream_proxy
    if up is None or (up.https is None and up.http is None):
        out = ["corporate proxy: none (allowed connections go direct)"]
    else:
        how = "by name (the proxy resolves)" if up.by_name else "to the address sandgate checked"
        out = [
            f"corporate proxy: tunnels via {up.https.shown if up.https else 'direct'}, plain HTTP via "
            f"{up.http.shown if up.http else 'direct'}, {how}; NO_PROXY: {up.no_proxy or '-'}"
        ]
    otlp = otlpenv.settings()
    out.append(
        f"decisions exported to: {otlp.endpoint} ({otlp.protocol}; headers: {', '.join(n for n, _ in otlp.headers) or '-'})"
        if otlp is not None
        else "decisions exported to: the audit log only (no OTEL_EXPORTER_OTLP_* endpoint)"
    )
    return out


def _text(origin: Origin | None) -> str | None:
    return None if origin is None else str(origin)
