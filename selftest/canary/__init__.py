"""Canary hosts for sandgate's fake internet: one server process per (kind, address).

Started by selftest/servers.py (the isolated fake internet used by `sandgate verify` and the e2e
tests) INSIDE its network namespace:

    ip netns exec NS python -m selftest.canary KIND --ip IP --port PORT --log LOGFILE [...]
    ip netns exec NS python -m selftest.canary unix|abstract --path PATH|NAME --log LOGFILE [...]

Every thing the server sees is appended to LOGFILE as one JSON line, written with a single
O_APPEND write() so readers never see interleaved records. That log is the canary evidence
used to prove a blocked action never reached its target (and a permitted one did), so we log
*before* answering: once a client has an answer, its record is on disk.

Kinds and records (every record also has "server" (--name) and "t" (unix time)):
  http/https  {"kind":"connect","peer","tls"}                    each accepted TCP connection
              {"kind":"tls","peer","sni","ok","error"}           https: each TLS handshake
              {"kind":"http"|"https","method","path","host","peer","body_len"(,"sni")}
  dns         {"kind":"dns","proto":"udp"|"tcp","qname","qtype","peer"} every query, even malformed;
              qname is the first question's, lower-cased. Parsed queries add "opcode", "qdcount",
              "questions" (every name as received, case kept), "records" (answer/authority/
              additional RRsets as text: UPDATE RRs, an additional TXT) and "edns_options"
              ([{"code","data"}], data latin-1); unparsable ones "error" and "data" (the bytes, latin-1)
  udp         {"kind":"udp","peer","data"}                        every datagram (echoed back)
  tcp         {"kind":"tcp","peer","data"}                        every connection ("tcp-canary\n" reply)
  unix        {"kind":"unix","address","data","pid","uid","gid"}  every connection ("unix-canary\n" reply)
  abstract    the same records ("kind":"unix"); address is "@NAME"
  upstream    https with {"kind":"request",...,"headers","body"} per request (upstream_canary.py)
  git         the same records; answers through `git http-backend` over --git-root

unix listens on the filesystem socket --path (mode 0666, so that a dropped-privilege client is
kept out only by the sandbox, never by file permissions; removed again on SIGTERM); abstract on
the abstract address NUL+NAME, which exists only in the network namespace the server runs in.
pid/uid/gid are the connecting process's SO_PEERCRED, as seen from the server's namespaces.

Prints "ready\n" on stdout once listening. Only stdlib + dnspython: certificates (--cert/--key)
are PEM files made by the caller (selftest/certs.py).
"""
