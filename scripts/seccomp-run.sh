#!/usr/bin/env bash
# Runs a command under a seccomp filter shaped like a container runtime's
# default profile for a process without CAP_SYS_PTRACE (Docker's default,
# Kubernetes' RuntimeDefault): pidfd_getfd, ptrace, process_vm_readv,
# process_vm_writev and kcmp are denied. Debian's python3-seccomp
# (libseccomp's own bindings) loads the filter and then execs the command,
# so the command and everything it starts run under it. Installed when
# missing (root for apt-get, as the other test peers).
#
#   scripts/seccomp-run.sh [--errno] -- COMMAND [ARGS...]
#       --errno: a denied call fails with EPERM, as the runtimes do;
#       default: the process is killed (SIGSYS), so a command that needs one
#       of them cannot go unnoticed
#   scripts/seccomp-run.sh install      install python3-seccomp if missing
#   scripts/seccomp-run.sh check        prove the filter denies pidfd_getfd
set -euo pipefail

log() { echo "seccomp-run.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Debian's python3 (the bindings are a Debian package, not a wheel).
PY=/usr/bin/python3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

installed() { "$PY" -c 'import seccomp' >/dev/null 2>&1; }

ensure_installed() {
  installed && return 0
  local cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/booking-expiration"
  mkdir -p "$cache"
  exec 9>"$cache/seccomp-install.lock"
  flock 9
  installed && return 0
  log "python3-seccomp not found; installing Debian's python3-seccomp"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq -o DPkg::Lock::Timeout=300 python3-seccomp >&2
  installed || die "python3-seccomp did not install for $PY"
}

case "${1:-}" in
  install) ensure_installed ;;
  check)
    ensure_installed
    exec "$PY" "$here/seccomp/run.py" --check
    ;;
  --errno | --)
    ensure_installed
    exec "$PY" "$here/seccomp/run.py" "$@"
    ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
