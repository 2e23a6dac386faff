"""The network guard on Windows: WFP filters and their wire layout (wfp, wfpwire, win32wfp), the firewall
rules, and WinDivert's transparent capture (divertfilter, win32divert, redirect, reflect, owners).

Pure plans apart from win32wfp/win32divert (the bindings) and redirect (the packet loop, run against any
divert handle); docs/windows.md says which threat each answers and what has run where.
"""
