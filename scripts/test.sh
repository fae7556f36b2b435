#!/usr/bin/env bash
# The test command. Starts a throwaway PostgreSQL (Debian's package,
# installed when missing) and a single-node Apache Kafka 4.4.0 (jars from
# Maven Central, run on the machine's Java 17) unless DATABASE_URL /
# KAFKA_BOOTSTRAP_SERVERS already point at running ones, runs the whole
# suite, and stops what it started.
#
#   bash scripts/test.sh [cargo test arguments...]
#
# Everything the run makes lives in one work folder: the tests' scratch
# folders too (TMPDIR points inside it). At exit, pass or fail, it stops
# every process whose command line or environment names that folder and
# removes it; on failure it first prints the tail of each log. Then it
# checks that nothing is left: no folder, no new booking-expiration-* entry
# in the temporary directory, no process (exit 1 otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

tmp_root="${TMPDIR:-/tmp}"
ours_before="$(ls -A "$tmp_root" | grep '^booking-expiration-' || true)"
work="$(mktemp -d "$tmp_root/booking-expiration-test.XXXXXX")"
mkdir "$work/tmp"
chmod 755 "$work" "$work/tmp" # the postgres OS user owns clusters inside
started_pg=""
started_kafka=""

# Pids of the processes whose command line or environment names $work
# (servers the tests started, in statics too, and their children).
# One grep over all of /proc; the grep itself (whose arguments name $work)
# has exited by the time the loop asks who is alive.
ours() {
  local p
  for p in $(grep -laF -- "$work" /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null |
    cut -d/ -f3 | sort -u); do
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    kill -0 "$p" 2>/dev/null && echo "$p"
  done
  return 0
}

stop_ours() {
  local pids i
  pids="$(ours)"
  [[ -z "$pids" ]] && return 0
  echo "test.sh: stopping what the tests left running:" >&2
  ps -o pid=,args= -p "$(tr '\n' ',' <<<"$pids" | sed 's/,$//')" 2>/dev/null | cut -c1-160 >&2 || true
  kill -TERM $pids 2>/dev/null || true
  for i in $(seq 1 300); do
    pids="$(ours)"
    [[ -z "$pids" ]] && return 0
    sleep 0.1
  done
  kill -KILL $pids 2>/dev/null || true
  sleep 1
}

# The last 40 lines of each text log under $work (the newest 20).
print_logs() {
  local f n=0
  while IFS= read -r f; do
    grep -Iq . "$f" 2>/dev/null || continue # Kafka's segments are *.log too
    echo "---- $f (last 40 lines)" >&2
    tail -n 40 "$f" >&2 || true
    n=$((n + 1))
    [[ $n -ge 20 ]] && break
  done < <(find "$work" -name '*.log' -type f -printf '%T@ %p\n' 2>/dev/null | sort -rn | cut -d' ' -f2-)
  echo "test.sh: the run failed; the tails of $n log(s) under $work are printed above" >&2
}

cleanup() {
  local status=$?
  [[ -n "$started_kafka" ]] && bash scripts/kafka.sh stop "$work/kafka" || true
  [[ -n "$started_pg" ]] && bash scripts/postgres.sh stop "$work/pg" || true
  stop_ours
  [[ $status -ne 0 ]] && print_logs
  rm -rf "$work" || true

  # Nothing the run made may be left. (Another test run at the same time
  # would show here too.)
  local left="" new
  [[ -e "$work" ]] && left+="folder $work"$'\n'
  new="$(comm -13 <(sort <<<"$ours_before") \
    <(ls -A "$tmp_root" | grep '^booking-expiration-' | sort) | grep -v '^$' || true)"
  [[ -n "$new" ]] && left+="$(sed "s|^|in $tmp_root: |" <<<"$new")"$'\n'
  local pid
  for pid in $(ours); do
    left+="process $(ps -o pid=,user=,args= -p "$pid" 2>/dev/null | cut -c1-300 || true)"$'\n'
  done
  if [[ -n "$left" ]]; then
    echo "test.sh: the run left behind:" >&2
    printf '%s' "$left" >&2
    exit 1
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r pg_port kafka_port < <(python3 scripts/free-port.py 2)

if [[ -z "${DATABASE_URL:-}" ]]; then
  # Durability off: a throwaway cluster for tests only (benchmarks use defaults).
  DATABASE_URL="$(bash scripts/postgres.sh start "$work/pg" "$pg_port" \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off)"
  export DATABASE_URL
  started_pg=1
  echo "test.sh: PostgreSQL on 127.0.0.1:$pg_port" >&2
fi
if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
  bash scripts/kafka.sh start "$work/kafka" "$kafka_port"
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$kafka_port"
  started_kafka=1
  echo "test.sh: Kafka on $KAFKA_BOOTSTRAP_SERVERS" >&2
fi

# The tracing tests export spans to a real OpenTelemetry Collector.
if [[ -z "${OTELCOL_BIN:-}" ]]; then
  OTELCOL_BIN="$(bash scripts/otelcol.sh)"
  export OTELCOL_BIN
fi

# tests/it/pgbouncer.rs starts PgBouncers of its own (Debian's package).
bash scripts/pgbouncer.sh install

TMPDIR="$work/tmp" cargo test --workspace --locked "$@"
# Tests marked #[ignore] load the server heavily (a 1,000,000-row table) or
# assert timings of a second that the suite's load would blur (kafka_cluster,
# broker_freeze): they run after the suite, one at a time, so they neither
# make the suite's timing tests late nor are made late by them. With
# arguments, add `-- --include-ignored` to get them.
if [[ $# -eq 0 ]]; then
  TMPDIR="$work/tmp" cargo test --locked --test it -- --ignored --test-threads=1
fi

# Each test drops its own database when it ends (tests/it/support/db.rs);
# on the server started here, one left over is a bug.
if [[ -n "$started_pg" ]] && command -v psql >/dev/null 2>&1; then
  leftover="$(psql "$DATABASE_URL" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'be\_test\_%'")"
  if [[ -n "$leftover" ]]; then
    echo "test.sh: test databases left over after the run:" >&2
    echo "$leftover" >&2
    exit 1
  fi
  echo "test.sh: no test database left over" >&2
fi
