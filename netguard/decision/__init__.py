"""The decision: what a sandbox may reach, judged per connection, per DNS query and per readable request.

binding.py   one sandbox as the daemon sees it       decide.py  the one connection decision: verdict, record, pin
gate.py      the mitmproxy addon hooks (+ flowview, layers, viamitm, tlsinspect, leafcerts, headlimit, trim)
inspected.py per-request rules, leaks, credentials   dns.py     the sandbox's only resolver (+ resolver, sysdns)
limits.py    each sandbox's share of the daemon      answers.py the 403 and 431 as bytes
Never imports netguard.daemon; moves bytes only through netguard.relay. Every decision goes through
netguard.verdict. Importing this package imports nothing (the front door's cold path needs no mitmproxy).
"""
