"""The daemon: one mitmproxy master plus sandgate's DNS server, deciding every sandbox's traffic.

    python -m netguard.proxy --socket PATH     the per-user daemon (serve.py, __main__.py)

binding.py  one sandbox as the proxy sees it        gate.py   the mitmproxy addon hooks
layers.py   protocol detection and the byte relay   dns.py    the sandbox's only resolver
master.py   mitmproxy with only our addons          serve.py  the daemon: bindings, listeners, idle exit
standalone.py  `sandgate proxy` on TCP ports        spec.py, control.py  the launcher <-> daemon contract
handoff.py, splice.py, relay.py, relaypool.py, relayworker.py  decided uninspected flows leave mitmproxy for
            splice(2), in the daemon, then in its relay worker processes once big (bodyrelay.py: one large plain-HTTP body)
frontdoor.py  every TCP listener's accept: plain CONNECT / TLS decided (decide.py), dialled (dial.py), spliced without mitmproxy
Every decision goes through netguard.verdict. Importing this package imports nothing: the launcher
loads spec and control on its fast path, without mitmproxy or dnspython.
"""
