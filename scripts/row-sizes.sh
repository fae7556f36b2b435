#!/usr/bin/env bash
# Bytes per row of the outbox and the audit trail, measured on real tables
# (docs/scaling.md, "How large the outbox and the audit trail grow"):
# a throwaway PostgreSQL at its default settings and a single-node Kafka
# (as the tests start them), `migrate`, N due bookings (`seed`), `run` at
# its defaults until every booking expired and every event is published,
# then pg_total_relation_size (heap, TOAST and indexes) of
# booking_expiration_outbox and booking_expiration_audit over N:
#
#   - outbox, published: right after publishing, each row's unpublished
#     version still takes its place until VACUUM makes it reusable (the
#     size a table in steady state stays near: new rows fill the freed
#     space, retention's deletes free more);
#   - outbox, compacted: after VACUUM FULL, one version per row (the floor);
#   - audit: written once, never updated.
#
#   bash scripts/row-sizes.sh [N]        N due bookings (default 100000)
#
# Needs what scripts/demo.sh needs; BIN=path uses that binary instead of
# building the release one. Everything lives in one folder under TMPDIR,
# removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

N="${1:-100000}"
[[ "$N" =~ ^[0-9]+$ && "$N" -gt 0 ]] || { echo "row-sizes: N must be a positive number" >&2; exit 2; }
TOPIC="booking-expired-row-sizes"

if [[ -z "${BIN:-}" ]]; then
  cargo build --release --locked -p booking-expiration --bin booking-expiration >&2
  TARGET_DIR="${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}"
  BIN="$TARGET_DIR/release/booking-expiration"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/booking-expiration-row-sizes.XXXXXX")"
chmod 755 "$WORK" # the postgres OS user owns the cluster inside
worker_pid=""
cleanup() {
  local rc=$?
  [[ -n "$worker_pid" ]] && { kill -TERM "$worker_pid" 2>/dev/null; wait "$worker_pid" 2>/dev/null || true; }
  bash scripts/kafka.sh stop "$WORK/kafka" >/dev/null 2>&1 || true
  bash scripts/postgres.sh stop "$WORK/pg" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r PG_PORT KAFKA_PORT METRICS_PORT < <(python3 scripts/free-port.py 3)
DATABASE_URL="$(bash scripts/postgres.sh start "$WORK/pg" "$PG_PORT" 2>"$WORK/pg-start.log")" ||
  { cat "$WORK/pg-start.log" >&2; exit 1; }
bash scripts/kafka.sh start "$WORK/kafka" "$KAFKA_PORT" 2>"$WORK/kafka-start.log" ||
  { cat "$WORK/kafka-start.log" >&2; exit 1; }
bash scripts/kafka.sh create-topic "$KAFKA_PORT" "$TOPIC" 3 >"$WORK/topic.log" 2>&1 ||
  { cat "$WORK/topic.log" >&2; exit 1; }
export DATABASE_URL KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$KAFKA_PORT" KAFKA_TOPIC="$TOPIC"
export METRICS_ADDR="127.0.0.1:$METRICS_PORT" RUST_LOG=warn

q() { psql -X -q -At "$DATABASE_URL" -c "$1"; }

"$BIN" migrate
"$BIN" seed --active "$N" --due-fraction 1 --spread 10m >/dev/null
"$BIN" run 2>"$WORK/worker.log" &
worker_pid=$!
start=$SECONDS
until [[ "$(q "SELECT (SELECT count(*) FROM booking_expiration_audit) = $N AND NOT EXISTS
            (SELECT 1 FROM booking_expiration_outbox WHERE published_at IS NULL)")" == t ]]; do
  kill -0 "$worker_pid" 2>/dev/null || { tail -n 20 "$WORK/worker.log" >&2; exit 1; }
  ((SECONDS - start < 600)) || { echo "row-sizes: not done after 600 s" >&2; exit 1; }
  sleep 1
done
kill -TERM "$worker_pid"
wait "$worker_pid" || true
worker_pid=""

size() { q "SELECT pg_total_relation_size('$1')"; }
outbox_published="$(size booking_expiration_outbox)"
audit="$(size booking_expiration_audit)"
q "VACUUM FULL booking_expiration_outbox" >/dev/null
outbox_compact="$(size booking_expiration_outbox)"
rows="$(q "SELECT count(*) FROM booking_expiration_outbox")"
payload="$(q "SELECT round(avg(octet_length(payload))), round(avg(octet_length(headers::text))) FROM booking_expiration_outbox")"

per() { python3 -c "print(round($1 / $N))"; }
echo "rows: $N bookings expired, $rows outbox rows, $(q "SELECT count(*) FROM booking_expiration_audit") audit rows; $(q 'SHOW server_version') at its defaults"
echo "average payload | headers (as text) bytes of an outbox row: $payload"
echo "outbox, published (before VACUUM): $outbox_published bytes, $(per "$outbox_published") bytes per row"
echo "outbox, compacted (VACUUM FULL):   $outbox_compact bytes, $(per "$outbox_compact") bytes per row"
echo "audit trail:                       $audit bytes, $(per "$audit") bytes per row"
q "SELECT relname || ': heap ' || pg_relation_size(oid) || ', indexes ' || pg_indexes_size(oid)
   || ', toast ' || coalesce(pg_total_relation_size(reltoastrelid), 0)
   FROM pg_class WHERE relname IN ('booking_expiration_outbox', 'booking_expiration_audit') ORDER BY 1"
