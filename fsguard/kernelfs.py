"""The kernel's own filesystems, fresh for the sandbox's new namespaces: /proc, /sys and a minimal /dev.

Step 2 of the mount sequence in fsguard/mounts.py, run as the sandbox's first process right after
/ became a slave tree. The threats: the host's /proc shows every host process (and
/proc/<outside pid>/root reaches its files), the host's /dev holds its disks and the user's other
terminals. Inside, the sandbox sees only its own processes and links, and a /dev of six nodes with
a private devpts instance and /dev/shm; its own terminal stays reachable through its fds and /dev/tty.
"""

from __future__ import annotations

import os

from fsguard.mountcalls import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REMOUNT,
    MountError,
    bind_readonly,
    detach,
    mount,
)


def fresh_proc_sys(dev_files: tuple[str, ...] = ()) -> None:
    """Step 2 of fsguard/mounts.py: the new pid namespace's /proc, the new network namespace's /sys, a
    minimal /dev (with empty files at `dev_files`, mount points for binds step 6 makes there)."""
    # Detach the host's first where we may (in our own user namespace the inherited mounts are
    # locked and stay underneath, unreachable: the new ones cover the whole path).
    detach("/proc")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    detach("/sys")
    try:
        mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    except MountError:
        # A kernel that refuses sysfs in a user namespace (parts of the host's are covered):
        # bind the host's read-only instead; /sys/class/net then shows the host's links'
        # names but no way to reach them from this network namespace.
        bind_readonly("/sys", "/sys")
    minimal_dev(dev_files)


#: The only host device nodes the sandbox sees (bubblewrap's --dev set). The threat: a root
#: command in its user namespace still owns the host's root-owned nodes, and opening a device
#: needs no capability, only DAC: /dev/vda (read the raw disk past every hidden path),
#: /dev/kmsg, /dev/userfaultfd, /dev/loop*, /dev/kvm would all be open to it.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


def minimal_dev(dev_files: tuple[str, ...] = ()) -> None:
    """A fresh /dev: a few nodes bound from the host's, a private devpts and /dev/shm, the usual links,
    and empty read-only files at `dev_files` (`/dev/NAME` only) for files bound there later (notices)."""
    host = os.open("/dev", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
        for name in DEV_NODES:
            if not os.path.exists(f"/proc/self/fd/{host}/{name}"):
                continue
            os.close(os.open(f"/dev/{name}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
            mount(f"/proc/self/fd/{host}/{name}", f"/dev/{name}", None, MS_BIND)
    finally:
        os.close(host)
    os.mkdir("/dev/pts", 0o755)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    os.symlink("pts/ptmx", "/dev/ptmx")
    os.mkdir("/dev/shm", 0o1777)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"/dev/{name}")
    for path in dev_files:  # made before the remount below: /dev takes no new names after it
        if os.path.dirname(path) != "/dev" or not os.path.basename(path):
            raise MountError(22, f"not a file directly in /dev: {path}")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444))
    mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)  # nothing new appears in /dev
