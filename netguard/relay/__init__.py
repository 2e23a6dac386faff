"""The relay: moves a decided flow's bytes (splice(2), relay workers, body copies); never decides, imports no decision.

handoff.py, streams.py  a decided uninspected flow's sockets out of mitmproxy   splice.py  the kernel relay
relay.py     where a flow's bytes move: in the daemon first, in a relay worker once big
relaypool.py, relayworker.py, relaywire.py, seqchannel.py   the relay worker processes and their wire
bodycopy.py, bodyrelay.py, tlsbody.py   one large response body, plain or inspected, outside mitmproxy's layers
nofile.py    the open-file limit, raised at start (the daemon and each worker)
Imports nothing of netguard.decision or netguard.daemon. Importing this package imports nothing.
"""
