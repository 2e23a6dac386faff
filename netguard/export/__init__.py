"""Policies for other egress engines (Cilium, Smokescreen): pure translations of a compiled `network:` section.

plan.py builds one typed intermediate (names, patterns, ports, networks, and what cannot be expressed);
each target (cilium.py, smokescreen.py) turns it into its own document. No I/O here: the launcher's
`sandgate export` loads the policy exactly as `sandgate run` does and prints what these return.
"""
