"""The Windows backend (issue 14): a dedicated sandbox user behind WFP filters, a job object,
ACL-scoped writes, and an optional WinDivert reflect redirect into the same proxy daemon.

Everything here but `win32.py` + `win32wfp.py` (the only modules that call Windows) and
`redirect.py` (the packet loop, run against any divert handle) is pure planning: values in,
typed plans out, no I/O, so all of it is unit-tested on Linux. docs/windows.md says which threat
each plan answers and what has and has not been run on real Windows.
"""
