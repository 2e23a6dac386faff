"""Human approval of `ask` destinations, the launcher's side.

broker.py routes each question from the daemon to one answerer and records it; prompt.py asks on
sandgate's terminal; channel.py holds the two unix socket servers (the daemon's questions, an
embedding tool's answers); whoasked.py names the process that asked. The messages on both sockets
are netguard.approval's.
"""
