"""Loads a seccomp filter like a container runtime's default profile
(without CAP_SYS_PTRACE) and execs the command after `--` under it.
Run by scripts/seccomp-run.sh, which documents the flags."""

import ctypes
import errno
import os
import sys

import seccomp

# What Docker's default profile and Kubernetes' RuntimeDefault deny a
# process without CAP_SYS_PTRACE: reading another process's memory or
# file descriptors.
DENIED = ["pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp"]


def load(action):
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED:
        f.add_rule(action, name)
    f.load()


def pidfd_getfd_errno():
    """errno of pidfd_getfd(-1, 0, 0): EBADF when the call is allowed (a bad
    pidfd), EPERM when the filter denies it."""
    libc = ctypes.CDLL(None, use_errno=True)
    nr = 438  # pidfd_getfd on x86_64 and aarch64
    libc.syscall(nr, -1, 0, 0)
    return ctypes.get_errno()


def main(argv):
    if argv == ["--check"]:
        before = pidfd_getfd_errno()
        load(seccomp.ERRNO(errno.EPERM))
        after = pidfd_getfd_errno()
        print(f"pidfd_getfd: errno {errno.errorcode.get(before)} before the filter, "
              f"{errno.errorcode.get(after)} under it")
        return 0 if (before, after) == (errno.EBADF, errno.EPERM) else 1
    action = seccomp.KILL_PROCESS
    if argv and argv[0] == "--errno":
        action = seccomp.ERRNO(errno.EPERM)
        argv = argv[1:]
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: run.py [--errno] -- COMMAND [ARGS...] | --check", file=sys.stderr)
        return 2
    load(action)
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
