"""The one platform seam: what "make a sandbox, start CMD in it, wait, tear down" means on each OS.

The policy, proxy, audit and verify code never import from here; only the launcher's run room
picks a backend (seam.py). `windows/` holds the Windows backend's pure plans, its redirect loop and
its one thin Win32 module; the Linux backend is launcher/run/linuxbackend.py (the run room's steps).
"""
