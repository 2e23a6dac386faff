"""`sandgate verify`: the self-test, apart from the run path.

verify.py is the command; fakenet.py, planted.py and staged.py build what the probes reach for
(the fake internet and the host's state); probes/ runs inside a real `sandgate run`; judge.py
weighs what the probes saw against what the canaries (canary/) and the host saw. The world
(world.py, with netns.py, nsexec.py, userns.py, servers.py, clients.py, registry.py) is the
isolated fake internet, shared with the end-to-end tests; certs.py its throwaway CA.
markers.py and spec.py are what both sides of the sandbox wall read: stdlib only.
"""
