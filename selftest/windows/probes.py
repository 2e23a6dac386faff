"""`sandgate verify`'s probe list on Windows: what each shared probe means there (pure data).

The list is the one in selftest/probes/core.py ORDER; a unit test checks that every
probe has an entry here, so a probe added for Linux forces a Windows decision instead of being
silently absent. "same": the probe runs as it is and must give the same verdict; "variant": the
threat exists and a Windows-specific probe body is needed; "n/a": the mechanism does not exist on
Windows (with why); "gap": the threat exists and this design does not close it (docs/windows.md).
"""

from __future__ import annotations

from typing import Literal

Coverage = Literal["same", "variant", "n/a", "gap"]

PROBES: dict[str, tuple[Coverage, str]] = {
    # network
    "https_proxy_vars": ("same", "explicit proxy variables -> the daemon on 127.0.0.1"),
    "http_proxy_vars": ("same", "explicit proxy variables -> the daemon on 127.0.0.1"),
    "https_transparent": ("variant", "only with transparent capture (pydivert reflect); else expected blocked"),
    "blocked_via_proxy": ("same", "the same daemon decides"),
    "blocked_transparent": ("variant", "WFP block (explicit mode) or the daemon (transparent mode)"),
    "direct_tcp_ip": ("same", "WFP catch-all block at ALE_AUTH_CONNECT"),
    "allowed_ip_other_port": ("same", "WFP catch-all block"),
    "connect_ip_literal": ("same", "the same daemon decides"),
    "sni_spoof": ("same", "the same daemon decides by name"),
    "host_mismatch": ("same", "the same daemon decides by name"),
    "host_fronting": ("same", "the same daemon refuses a Host naming another site than the URL"),
    "keepalive_blocked_host": ("same", "the same daemon judges every request of a kept-alive connection"),
    "rebind_loopback": ("same", "the daemon's veto"),
    "rebind_metadata": ("same", "the daemon's veto"),
    "udp": ("same", "WFP catch-all block"),
    "quic": ("same", "WFP catch-all block"),
    "dns_udp_rogue": ("same", "WFP DNS 53 block, any address"),
    "dns_tcp_rogue": ("same", "WFP DNS 53 block, any address"),
    "dns_txt_exfil": ("gap", "names resolved through the Dnscache service leave outside the user's SID"),
    "ipv6": ("same", "WFP V6 layers"),
    "raw_icmp": ("same", "WFP ICMP block at ALE_RESOURCE_ASSIGNMENT"),
    "abstract_unix": ("n/a", "no abstract AF_UNIX namespace on Windows"),
    "path_unix": ("variant", "AF_UNIX socket files exist on Windows 10+: ACLs decide; named pipes likewise"),
    "setns_host_netns": ("n/a", "no network namespaces"),
    "netns_tamper": ("variant", "tampering with WFP/firewall needs admin: probe that the sandbox user cannot"),
    "host_loopback_service": ("same", "WFP permits loopback only to the proxy's ports"),
    "dns_smuggling": ("same", "the same daemon builds upstream queries (explicit/transparent DNS only)"),
    "wildcard_dns_types": ("same", "the same daemon"),
    "rebind_own_address": ("same", "the daemon's veto"),
    # network: request rules, inspection and brokered credentials (issue 13): all in the shared daemon
    "inspected_ca_trusted": ("variant", "the run's CA goes into the sandbox user's store and the env variables"),
    "passthrough_untouched": ("same", "the same daemon relays uninspected TLS untouched"),
    "git_fetch_inspected": ("same", "the same daemon judges each request"),
    "git_push_refused": ("same", "the same daemon judges each request"),
    "http_rule_refusals": ("same", "the same daemon judges each request"),
    "sentinel_leak": ("same", "the same daemon refuses a sentinel off its host"),
    "credential_fronting": ("same", "the same daemon compares the Host with the TLS name"),
    "secret_brokered": ("same", "the secret stays in sandgate's process (another user's) and the daemon"),
    "ca_key_hidden": ("same", "the key is only in sandgate's and the daemon's memory (another user's)"),
    "path_spellings": ("same", "the same daemon refuses non-canonical paths (IIS's own readings are modelled)"),
    "method_override": ("same", "the same daemon refuses method-override headers"),
    "websocket_upgrade": ("same", "the same daemon refuses upgrades no rule allows"),
    "sentinel_prefix": ("same", "the same launcher code makes the sentinel"),
    # filesystem
    "write_workspace": ("same", "Modify ACE on the workspace"),
    "write_outside": ("same", "no ACE grants it; the real user's profile is not the sandbox user's"),
    "git_hooks": ("same", "deny-write ACE"),
    "git_config": ("same", "deny-write ACE"),
    "create_protected": ("same", "placeholder directory with a deny-write ACE"),
    "symlink_escape": ("variant", "symlinks need a privilege; junctions do not: probe a junction out"),
    "hardlink_escape": ("variant", "CreateHardLink of an outside file into the workspace"),
    "rename_protected": ("same", "DELETE denied; Modify on the parent lacks FILE_DELETE_CHILD"),
    "remount_rw": ("n/a", "no mounts; ACL changes need WRITE_DAC, which the deny ACE withholds"),
    "read_ssh_key": ("same", "deny-read ACE (and the profile ACL)"),
    "secret_env": ("same", "fsguard's env filter, then envblock.build"),
    "open_by_handle": ("variant", "OpenFileById by file id of a denied file: the ACL is still checked"),
    "mknod_disk": ("variant", "opening \\\\.\\PhysicalDrive0 needs admin: probe that the sandbox user cannot"),
    "git_commit": ("same", "objects/, refs/, index stay writable"),
    "git_indirection": ("same", "fsguard's GIT_DIR_PROTECT list, denied by ACL"),
    "tool_configs": ("same", "fsguard's TOOL_PROTECT list, denied by ACL"),
    "credential_files": ("same", "fsguard's DEFAULT_READ_DENY list, denied by ACL"),
    "env_secret_names": ("same", "fsguard's env filter"),
    "audit_log_forge": ("same", "the log lies in the real user's profile, or is protected by extra_protect"),
    "config_files": ("same", "policy, includes and --upstream-ca in a writable root: extra_protect, as the log"),
    # process
    "tiocsti": (
        "variant",
        "no TIOCSTI; CMD's private window station and desktop keep SendInput, hooks and the clipboard from the "
        "user's windows (job UI limits cannot: they do not nest and never stopped SendInput): private_desktop",
    ),
    "ptrace_outside": ("variant", "OpenProcess(PROCESS_VM_WRITE) of the real user's process: another user, refused"),
    "process_vm_readv": ("variant", "ReadProcessMemory of the real user's process: another user, refused"),
    "signal_outside": ("variant", "TerminateProcess of the real user's process: another user, refused"),
    "proc_root": ("n/a", "no /proc"),
    "setuid_gain": ("variant", "no setuid; probe that runas/UAC elevation is not reachable from the job"),
    "proc_environ": ("variant", "PEB environment of sandgate's process: another user, refused"),
    "sysv_shm_host": ("gap", "named sections and pipes with permissive DACLs are reachable (no IPC namespace)"),
    "keyring_read": ("variant", "Credential Manager and DPAPI of the real user: another user's vault"),
    "sethostname": ("n/a", "renaming the machine needs admin"),
    "bpf_map": ("n/a", "no bpf(); loading a driver or opening WinDivert needs admin"),
    "setuid_plant": ("n/a", "no setuid/setgid bits; a file's ACL and owner grant no one else's rights"),
    "file_caps": ("n/a", "no file capabilities; privileges live in tokens, not in files"),
    "nested_userns": ("n/a", "no user namespaces; the sandbox user cannot make another account or token"),
    # the shared daemon
    "runtime_dirs": (
        "variant",
        "the daemon's pipe/socket directory in the real user's profile: the sandbox user is denied by ACL",
    ),
    "other_daemon_control": (
        "variant",
        "the control channel must check the peer's token (not the uid) like the netns check",
    ),
    "starvation": ("same", "the same daemon's per-sandbox shares"),
    "endless_head": ("same", "the same daemon's head limit"),
}

#: Windows-only probes (Codex's smoke suite found most): bodies in allbodies.bodies(); the rest to write.
WINDOWS_ONLY: tuple[str, ...] = (
    "private_desktop",  # SendInput / hooks / WinSta0 from the run (probedesktop.py)
    "logon_sid",  # the real user's logon SID in CMD's token: their processes, WinSta0\\Default (probelogon.py)
    "git_rename",  # .git renamed away, a new one planted (issue 28 H2; probeacl.py)
    "alternate_data_stream",  # write protected:stream, .git::$INDEX_ALLOCATION (probeacl.py)
    "case_variant",  # .GiT\\hooks (probeacl.py)
    "short_name",  # GIT~1 8.3 alias (probeacl.py)
    "shell_handoff",  # Start-Process https://... through the real user's Explorer
    "path_stub",  # a planted git.exe earlier in PATH for the real user
    "scheduled_task",  # schtasks /create as the sandbox user (probenet.py)
    "wmi_process",  # Win32_Process.Create: a process outside the job (probenet.py)
    "smb_webdav",  # \\host\share, \\host@port\DavWWWRoot: the redirector/WebClient connect (probenet.py)
    "self_code",  # a file planted where sandgate loads its own code; a folder under the drive root (probeself.py)
)
