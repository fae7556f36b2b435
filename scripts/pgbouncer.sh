#!/usr/bin/env bash
# A throwaway PgBouncer in transaction pooling mode in front of a local
# PostgreSQL, for tests. Debian's `pgbouncer` package (1.18 on Debian 12)
# is installed when missing. Runs as the `postgres` OS user (PgBouncer
# refuses root).
#
#   scripts/pgbouncer.sh start DIR PORT UPSTREAM_PORT [POOL_SIZE]
#       PgBouncer on 127.0.0.1:PORT, every database of the PostgreSQL on
#       127.0.0.1:UPSTREAM_PORT, pool_mode = transaction, POOL_SIZE server
#       connections per database and user (default 2: few, so clients share
#       server connections as they do in production); waits until it
#       accepts connections
#   scripts/pgbouncer.sh stop DIR
#   scripts/pgbouncer.sh install         install Debian's pgbouncer if missing
#
# Environment: PG_USER (default postgres) and PG_PASSWORD (required): the
# role the clients log in as; PgBouncer logs in to PostgreSQL with it too.
set -euo pipefail

log() { echo "pgbouncer.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

installed() { command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]; }

ensure_installed() {
  installed && return 0
  # Tests start several PgBouncers at once: one installs, the others wait.
  # The lock lives in the cache folder of the other test peers, not in the
  # run's temporary folder, which a run must leave as it found it.
  local cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/booking-expiration"
  mkdir -p "$cache"
  exec 9>"$cache/pgbouncer-install.lock"
  flock 9
  installed && return 0
  log "pgbouncer not found; installing Debian's pgbouncer"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq -o DPkg::Lock::Timeout=300 pgbouncer >&2
}

pgbouncer_bin() { command -v pgbouncer 2>/dev/null || echo /usr/sbin/pgbouncer; }

as_owner() {
  if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

cmd_start() {
  local dir="$1" port="$2" upstream="$3" pool_size="${4:-2}"
  local user="${PG_USER:-postgres}"
  [[ -n "${PG_PASSWORD:-}" ]] || die "PG_PASSWORD is required"
  ensure_installed
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  printf '"%s" "%s"\n' "$user" "$PG_PASSWORD" >"$dir/userlist.txt"
  chmod 600 "$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$upstream

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $pool_size
; Idle server connections in turn (FIFO), not the last one used: a client's
; exchanges outside a transaction reach different server connections, so a
; statement prepared in one exchange and run in the next fails at once
; ("prepared statement ... does not exist") instead of now and then.
server_round_robin = 1
max_client_conn = 500
server_lifetime = 3600
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
admin_users = $user
EOF
  [[ "$(id -u)" == 0 ]] && chown -R postgres "$dir"
  as_owner "$(pgbouncer_bin)" -d "$dir/pgbouncer.ini" >&2 \
    || { tail -n 20 "$dir/pgbouncer.log" >&2 || true; die "PgBouncer did not start"; }
  local i
  for i in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "postgres://$user:$PG_PASSWORD@127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  tail -n 20 "$dir/pgbouncer.log" >&2 || true
  die "PgBouncer does not accept connections on 127.0.0.1:$port"
}

cmd_stop() {
  local dir="$1" pid
  [[ -f "$dir/pgbouncer.pid" ]] || return 0
  pid="$(cat "$dir/pgbouncer.pid")"
  kill -TERM "$pid" 2>/dev/null || return 0
  local i
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
  start) [[ $# -ge 4 ]] || die "usage: start DIR PORT UPSTREAM_PORT [POOL_SIZE]"; shift; cmd_start "$@" ;;
  stop) [[ $# -eq 2 ]] || die "usage: stop DIR"; cmd_stop "$2" ;;
  install) ensure_installed ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
