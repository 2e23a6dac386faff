"""The daemon: the process that serves every sandbox of a user; it asks netguard.decision, netguard.relay moves the bytes.

    python -m netguard.daemon --socket PATH     the per-user daemon (serve.py, __main__.py)

serve.py     the daemon: bindings, listeners, idle exit       __main__.py  claims the socket, then serves
control.py, ctlasync.py, status.py, peercheck.py, daemonpath.py   the launcher <-> daemon control socket
specfd.py, specbytes.py, policycache.py   a bind's spec (netguard.spec) in a sealed memfd, each policy compiled once
frontdoor.py  every TCP listener's accept: a plain CONNECT / TLS decided (netguard.decision.decide) and spliced
             without mitmproxy; its parsers and dial: connecthead, firstbytes, tlshello, peek, dial, viaproxy
fdlimit.py   the connection budget        mitmload.py, master.py  mitmproxy, loaded beside a serving daemon
standalone.py  `sandgate proxy` on TCP ports            otlpexport.py, otlpsend.py  audit records to a collector
Importing this package imports nothing: the launcher loads control on its fast path, without mitmproxy
or dnspython.
"""
