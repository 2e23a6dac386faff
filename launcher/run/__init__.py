"""`sandgate run` and what surrounds it, one module per step (launch.py, then linuxbackend.py, read top to bottom).

options.py      the command line as a typed record     policyargs.py  --policy/--allow -> Policy
workspace.py    what may become writable               confinement.py filesystem, Landlock, env plan
daemonctl.py    the daemon: connect or spawn, handover  runstate.py   a run's state on disk, cleanup
sandbox.py      holder, init and CMD (the forks)       supervise.py   signals, exit codes, drops
summary.py      the exit line                          launch.py      parse, check, seam.run_in
seam.py         the platform seam: make, start, wait, tear down (run_in)
linuxbackend.py the Linux sandbox behind the seam      windowsbackend.py the Windows one
windows/        the Windows launch: plan, setup, transparent path, real WinApi, runner
proxy.py        `sandgate proxy`                       housekeeping.py cleanup, cache, daemon
"""
