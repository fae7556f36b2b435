#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks, from Debian's
# packages (installed here when missing). Runs as the `postgres` OS user
# because initdb refuses root.
#
#   scripts/postgres.sh start DIR PORT [postgres -c options...]
#       initdb in DIR (password auth over TCP), start on 127.0.0.1:PORT,
#       wait until it accepts connections; prints the DATABASE_URL
#   scripts/postgres.sh stop DIR         fast shutdown
#   scripts/postgres.sh restart DIR      fast restart (fault tests)
#   scripts/postgres.sh url DIR          print the DATABASE_URL again
#   scripts/postgres.sh standby PRIMARY_DIR DIR PORT [options...]
#       a streaming standby of the running cluster in PRIMARY_DIR
#       (pg_basebackup -R), started on 127.0.0.1:PORT; waits until it
#       streams; prints its DATABASE_URL (same password)
#   scripts/postgres.sh sync PRIMARY_DIR  make the primary's commits wait
#       for the standby (synchronous_standby_names = '*'); waits until the
#       standby is `sync`
#   scripts/postgres.sh promote DIR      promote the standby in DIR
#   scripts/postgres.sh kill DIR         SIGKILL the postmaster (a crash)
#
# Environment: PG_PASSWORD (default: random, stored in DIR/password).
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

find_bindir() {
  local dir
  if command -v pg_config >/dev/null 2>&1; then
    dir="$(pg_config --bindir 2>/dev/null || true)"
    if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then echo "$dir"; return 0; fi
  fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then echo "$dir"; return 0; fi
  done
  return 1
}

ensure_installed() {
  if BINDIR="$(find_bindir)"; then return 0; fi
  log "PostgreSQL server not found; installing Debian's postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  BINDIR="$(find_bindir)" || die "postgresql installed but initdb/pg_ctl not found"
}

as_owner() {
  if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

url_of() {
  local dir="$1"
  echo "postgres://postgres:$(cat "$dir/password")@127.0.0.1:$(cat "$dir/port")/postgres"
}

cmd_start() {
  local dir="$1" port="$2"; shift 2
  ensure_installed
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  if [[ ! -f "$dir/data/PG_VERSION" ]]; then
    local password="${PG_PASSWORD:-$(head -c 18 /dev/urandom | base64 | tr -d '/+=')}"
    printf '%s' "$password" >"$dir/password"
    printf '%s' "$password" >"$dir/pwfile"
    chmod 600 "$dir/password"
    [[ "$(id -u)" == 0 ]] && chown -R postgres "$dir"
    as_owner "$BINDIR/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" \
      --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    rm -f "$dir/pwfile"
  fi
  echo "$port" >"$dir/port"
  [[ "$(id -u)" == 0 ]] && chown -R postgres "$dir"
  local opts="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c max_connections=200"
  local extra
  for extra in "$@"; do opts+=" $extra"; done
  as_owner "$BINDIR/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -o "$opts" -w -t 60 start >&2 \
    || { tail -n 30 "$dir/postgres.log" >&2; die "PostgreSQL did not start"; }
  echo "$opts" >"$dir/options"
  url_of "$dir"
}

cmd_stop() {
  local dir="$1"
  ensure_installed
  [[ -f "$dir/data/postmaster.pid" ]] || return 0
  as_owner "$BINDIR/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2 || true
}

cmd_restart() {
  local dir="$1"
  ensure_installed
  as_owner "$BINDIR/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -o "$(cat "$dir/options")" \
    -m fast -w -t 60 restart >&2
}

psql_local() {
  local dir="$1"; shift
  as_owner psql -X -q -At -h "$dir" -p "$(cat "$dir/port")" -U postgres -d postgres "$@"
}

cmd_standby() {
  local primary="$1" dir="$2" port="$3"; shift 3
  ensure_installed
  primary="$(cd "$primary" && pwd)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  cp "$primary/password" "$dir/password"
  [[ "$(id -u)" == 0 ]] && chown -R postgres "$dir"
  as_owner env PGPASSWORD="$(cat "$primary/password")" "$BINDIR/pg_basebackup" \
    -h 127.0.0.1 -p "$(cat "$primary/port")" -U postgres -D "$dir/data" -R -X stream \
    -c fast >"$dir/basebackup.log" 2>&1 \
    || { cat "$dir/basebackup.log" >&2; die "pg_basebackup failed"; }
  cmd_start "$dir" "$port" -c hot_standby=on "$@" >/dev/null
  local i
  for i in $(seq 1 200); do
    [[ "$(psql_local "$primary" -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" -ge 1 ]] \
      && { url_of "$dir"; return 0; }
    sleep 0.1
  done
  die "the standby in $dir does not stream"
}

cmd_sync() {
  local primary="$1" i
  psql_local "$primary" -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null
  for i in $(seq 1 200); do
    [[ "$(psql_local "$primary" -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" -ge 1 ]] && return 0
    sleep 0.1
  done
  die "no synchronous standby"
}

cmd_promote() {
  local dir="$1"
  ensure_installed
  as_owner "$BINDIR/pg_ctl" -D "$dir/data" -w -t 60 promote >&2
}

cmd_kill() {
  local dir="$1"
  [[ -f "$dir/data/postmaster.pid" ]] || die "no postmaster.pid in $dir/data"
  kill -KILL "$(head -n 1 "$dir/data/postmaster.pid")"
}

case "${1:-}" in
  start) [[ $# -ge 3 ]] || die "usage: start DIR PORT [options]"; shift; cmd_start "$@" ;;
  stop) [[ $# -eq 2 ]] || die "usage: stop DIR"; cmd_stop "$2" ;;
  restart) [[ $# -eq 2 ]] || die "usage: restart DIR"; cmd_restart "$2" ;;
  url) [[ $# -eq 2 ]] || die "usage: url DIR"; url_of "$2" ;;
  standby) [[ $# -ge 4 ]] || die "usage: standby PRIMARY_DIR DIR PORT [options]"; shift; cmd_standby "$@" ;;
  sync) [[ $# -eq 2 ]] || die "usage: sync PRIMARY_DIR"; cmd_sync "$2" ;;
  promote) [[ $# -eq 2 ]] || die "usage: promote DIR"; cmd_promote "$2" ;;
  kill) [[ $# -eq 2 ]] || die "usage: kill DIR"; cmd_kill "$2" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
