"""The fork server: a warm `sandgate run` without the interpreter's imports (issue 25).

A run spends ~55 ms importing sandgate and the standard library before it does anything, and an agent
starts hundreds of runs. So the first warm run of a caller's context spawns one pre-imported process
(server.py) that forks a worker (worker.py) per later run; the run's console script (client.py) only
checks that it may be served this way, passes its standard streams, directory, environment and
arguments over a socket, forwards signals and takes the worker's exit code as its own.

What keeps it honest:
* the same process, not a similar one: a server serves only callers whose context.key() matches its own
  (credentials, namespaces, cgroup, capabilities, seccomp, limits, interpreter and its settings), and
  exits as soon as any file of its code changes (it watches them), so a worker is what a fresh run
  would have been, forked a little earlier;
* the threat of a sandbox starting runs: the socket lives in the runtime directory, which every sandbox
  sees as an empty read-only tmpfs, and the server serves only its own uid (SO_PEERCRED);
* nothing lost: a caller SIGKILLed makes the server SIGKILL its worker, exactly what a SIGKILLed
  launcher meets (PDEATHSIG takes the sandbox down); a worker killed before it reports is reported
  by the server, and the caller dies of the same signal;
* terminals stay on the full path: a run with a terminal on a standard stream, or that its terminal
  could signal (foreground, ISIG on), is the launcher's own, as before (pty relay, job control).

SANDGATE_FORKSERVER=0 turns it off for a caller.
"""
