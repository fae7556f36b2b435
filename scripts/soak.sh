#!/usr/bin/env bash
# Soak benchmark shaped like production (docs/soak.md): a throwaway PostgreSQL
# with default durability and a single-node Kafka, 1,000,000 bookings across
# 1,000 tenants, four `booking-expiration run` instances at their default
# settings, steady arrivals and a manager that extends, cancels, books and
# confirms, a sampler every 15 s; then checks that nothing was lost and the
# goals held. The work itself is scripts/soak.py; this wrapper builds the
# release binary (or takes SOAK_BINARY: CI gives it the static musl binary
# it built), starts the servers and cleans up.
#
#   bash scripts/soak.sh [--minutes N] [--out DIR] [--check] [soak.py options...]
#
#   --minutes N   length of the steady phase (default 30)
#   --out DIR     where samples.csv, summary.json and soak.svg go
#                 (default: a new folder under $TMPDIR, kept and printed)
#   --check       exit 1 when a goal fails (one line per failed goal)
#   other options go to scripts/soak.py (python3 scripts/soak.py --help)
#
# Everything else it creates (servers' data, the instances' logs, the topic
# dump) lives in one mktemp folder under $TMPDIR, removed on success and kept
# (path printed) on failure. Every process it starts is stopped on exit, INT
# and TERM. CARGO_TARGET_DIR is honoured (default: target/).
set -euo pipefail

# --out relative to the caller's folder, not the repository's.
args=()
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out|--out=*)
      if [[ "$1" == --out ]]; then [[ $# -ge 2 ]] || { echo "soak.sh: --out needs a folder" >&2; exit 2; }; out="$2"; shift
      else out="${1#--out=}"; fi
      mkdir -p "$out"
      out="$(cd "$out" && pwd)"
      args+=(--out "$out") ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1") ;;
  esac
  shift
done
cd "$(dirname "$0")/.."

work="$(mktemp -d "${TMPDIR:-/tmp}/booking-expiration-soak.XXXXXX")"
chmod 755 "$work" # the postgres OS user owns the cluster inside
if [[ -z "$out" ]]; then
  out="$(mktemp -d "${TMPDIR:-/tmp}/booking-expiration-soak-out.XXXXXX")"
  args+=(--out "$out")
fi
started_pg=""
started_kafka=""
py=""

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n "$py" ]] && kill -0 "$py" 2>/dev/null; then
    kill -TERM "$py" 2>/dev/null || true
    wait "$py" 2>/dev/null || true
  fi
  # Instances soak.py started and did not stop (it records their pids).
  if [[ -f "$work/pids" ]]; then
    local pid
    while read -r pid; do
      [[ "$pid" =~ ^[0-9]+$ ]] && kill -TERM "$pid" 2>/dev/null || true
    done <"$work/pids"
  fi
  [[ -n "$started_kafka" ]] && { bash scripts/kafka.sh stop "$work/kafka" || true; }
  [[ -n "$started_pg" ]] && { bash scripts/postgres.sh stop "$work/pg" || true; }
  if [[ $status -eq 0 ]]; then
    rm -rf "$work"
  else
    echo "soak.sh: exit $status; logs kept in $work" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$(date +%s)
if [[ -n "${SOAK_BINARY:-}" ]]; then
  [[ -x "$SOAK_BINARY" ]] || { echo "soak.sh: SOAK_BINARY=$SOAK_BINARY is not an executable file" >&2; exit 2; }
  bin="$(cd "$(dirname "$SOAK_BINARY")" && pwd)/$(basename "$SOAK_BINARY")"
  echo "soak.sh: running $bin (SOAK_BINARY)" >&2
else
  echo "soak.sh: building the release binary" >&2
  target="${CARGO_TARGET_DIR:-target}"
  cargo build --release --locked --bin booking-expiration >&2
  bin="$(cd "$target/release" && pwd)/booking-expiration"
fi

read -r pg_port kafka_port m1 m2 m3 m4 < <(python3 scripts/free-port.py 6)

# Default durability (no fsync=off): a soak measures what production pays.
pg_url="$(bash scripts/postgres.sh start "$work/pg" "$pg_port")"
started_pg=1
statements_opt=()
if [[ "$(psql "$pg_url" -XAtqc "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_stat_statements'")" == 1 ]]; then
  bash scripts/postgres.sh stop "$work/pg"
  pg_url="$(bash scripts/postgres.sh start "$work/pg" "$pg_port" -c shared_preload_libraries=pg_stat_statements)"
  statements_opt=(--pg-stat-statements)
fi
echo "soak.sh: PostgreSQL on 127.0.0.1:$pg_port" >&2

bash scripts/kafka.sh start "$work/kafka" "$kafka_port"
started_kafka=1
bash scripts/kafka.sh create-topic "$kafka_port" pin.crm.booking-expired.v1 3 >&2
echo "soak.sh: Kafka on 127.0.0.1:$kafka_port (servers up $(( $(date +%s) - t0 )) s after start)" >&2

python3 scripts/soak.py --work "$work" --bin "$bin" --pg-url "$pg_url" \
  --kafka-port "$kafka_port" --metrics-ports "$m1,$m2,$m3,$m4" "${statements_opt[@]}" \
  "${args[@]}" &
py=$!
status=0
wait "$py" || status=$?
py=""
echo "soak.sh: results in $out ($(( $(date +%s) - t0 )) s in all)" >&2
exit "$status"
