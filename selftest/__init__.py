"""`sandgate verify`: the self-test, apart from the run path.

verify.py is the command; fakenet.py, planted.py and staged.py build what the probes reach for
(the fake internet and the host's state); probes/ runs inside a real `sandgate run`; judge.py
weighs what the probes saw against what the canaries (canary/) and the host saw. The world
(world.py, with netnsetc.py, nsexec.py, userns.py, servers.py, clients.py, registry.py; its namespaces'
names and their sweep in launcher/run/staleworlds.py, which `sandgate cleanup` uses) is the isolated fake
internet, shared with the end-to-end tests; certs.py its throwaway CA. Nothing of the product imports this
package but launcher/cli.py's `verify` (tests/unit/test_import_graph.py).
markers.py and spec.py are what both sides of the sandbox wall read: stdlib only.
"""
