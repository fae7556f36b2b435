#!/usr/bin/env bash
# The test command. Starts a throwaway PostgreSQL (Debian's package,
# installed when missing) and a single-node Apache Kafka 4.4.0 (jars from
# Maven Central, run on the machine's Java 17) unless DATABASE_URL /
# KAFKA_BOOTSTRAP_SERVERS already point at running ones, runs the whole
# suite, and stops what it started.
#
#   bash scripts/test.sh [cargo test arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."

work="$(mktemp -d "${TMPDIR:-/tmp}/booking-expiration-test.XXXXXX")"
chmod 755 "$work" # the postgres OS user owns the cluster inside
started_pg=""
started_kafka=""
cleanup() {
  local status=$?
  [[ -n "$started_kafka" ]] && bash scripts/kafka.sh stop "$work/kafka" || true
  [[ -n "$started_pg" ]] && bash scripts/postgres.sh stop "$work/pg" || true
  if [[ $status -ne 0 ]]; then
    echo "test.sh: logs kept in $work" >&2
  else
    rm -rf "$work"
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

cargo test --workspace --locked "$@"
# Tests marked #[ignore] load the server heavily (a 1,000,000-row table):
# they run after the suite, one at a time, so they cannot make the suite's
# timing tests late. With arguments, add `-- --include-ignored` to get them.
if [[ $# -eq 0 ]]; then
  cargo test --locked --test it -- --ignored --test-threads=1
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
