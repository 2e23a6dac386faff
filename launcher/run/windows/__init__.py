"""The Windows launch: the plan of one run (plan), `sandgate setup` (setup), the transparent path's
lifetime (transparent), the real WinApi (realapi) and the entry points (runner). The backend the seam
drives is launcher/run/windowsbackend.py; the mechanisms are in netguard/windows and fsguard/windows.
"""
