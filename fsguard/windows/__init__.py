"""The filesystem and process guard on Windows: ACL plans and their journal (acl, aclapply, acljournal,
sddl, winpath), the job and private desktop, the sandbox user (logon rights, profile, environment, WMI/DCOM
denies) and CMD's start (launch, win32proc, win32stdio).

Pure plans apart from the win32* bindings; docs/windows.md says which threat each answers.
"""
