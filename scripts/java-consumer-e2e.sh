#!/usr/bin/env bash
# End-to-end check of the Java consumer against a real Kafka 4.4.0 broker, without the Rust
# worker: starts a broker (scripts/kafka.sh) on a free port, creates a 3-partition topic, writes
# sample BookingExpiredEvent records with the test-scope SampleProducer (6 distinct events,
# 2 republished duplicates, 4 invalid records, 1 on the wrong partition), runs the consumer jar
# in its modes and checks its output with jq. Stops the broker at the end, also on failure.
#
#   scripts/java-consumer-e2e.sh            ends with "N passed, N failed"; exit 1 on a failure
#
# Environment: KEEP_E2E_DIR=1 keeps the temporary folder (broker data, outputs).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA="$HERE/kafka.sh"
CONSUMER="$HERE/java-consumer.sh"
TOPIC=pin.crm.booking-expired.v1
command -v jq >/dev/null 2>&1 || { echo "java-consumer-e2e.sh: jq is needed" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/java-consumer-e2e.XXXXXX")"
BROKER="$WORK/broker"
cleanup() {
  bash "$KAFKA" stop "$BROKER" || true
  if [[ "${KEEP_E2E_DIR:-}" == 1 ]]; then
    echo "java-consumer-e2e.sh: kept $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

passed=0
failed=0
check() { # NAME COMMAND...
  local name="$1"
  shift
  if "$@"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    failed=$((failed + 1))
  fi
}

PORT="$(python3 "$HERE/free-port.py")"
BOOT="127.0.0.1:$PORT"
bash "$CONSUMER" --jar >/dev/null
bash "$KAFKA" start "$BROKER" "$PORT"
bash "$KAFKA" create-topic "$PORT" "$TOPIC" 3 >/dev/null

bash "$CONSUMER" --sample-producer --bootstrap-servers "$BOOT" --topic "$TOPIC" --count 6 --duplicates 2 \
  --invalid 4 --misrouted 1 --seed e2e --expected-out "$WORK/expected.jsonl"

run() { # NAME ARGS... -> $WORK/NAME.out, $WORK/NAME.err, $WORK/NAME.rc
  local name="$1" rc=0
  shift
  bash "$CONSUMER" --bootstrap-servers "$BOOT" --topic "$TOPIC" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  echo "$rc" >"$WORK/$name.rc"
  sed "s/^/  [$name] /" "$WORK/$name.err" | grep -v 'invalid record\|belongs on partition' >&2 || true
}
rc_is() { [[ "$(cat "$WORK/$1.rc")" == "$2" ]]; }
summary_is() { grep -qx "booking-expired-consumer: $2" "$WORK/$1.err"; }
lines_are() { [[ "$(wc -l <"$WORK/$1.out")" -eq "$2" ]]; }
jqe() { jq -e "$@" >/dev/null; }
ids() { jq -r .event_id "$1" | sort; }
same_ids() { diff <(ids "$WORK/expected.jsonl") <(ids "$WORK/$1.out") >/dev/null; }

# 1. --json --expect 6: stops at the 6th distinct event
run expect --json --expect 6 --max-idle-ms 30000
check "expect: exit 0" rc_is expect 0
check "expect: 6 JSON lines" lines_are expect 6
check "expect: the event ids produced" same_ids expect
check "expect: key = booking_id, the fields set" jqe -s '
  all(.[]; .key == .booking_id and (.phase == "RESERVE" or .phase == "BOOKING")
      and (.expired_at | test("^2027-01-15T[0-9:.]+Z$")) and .contract_version == 1
      and .aggregate_type == "Booking" and (.tenant_id | length) == 36 and (.deal_id | length) == 36
      and (.property_object_id | length) == 36 and .topic == "pin.crm.booking-expired.v1")' "$WORK/expect.out"
check "expect: headers as in the contract" jqe -s '
  all(.[]; .headers.ce_specversion == "1.0" and .headers.ce_id == .event_id
      and .headers.ce_type == "pin.crm.booking-expired.v1" and .headers["content-type"] == "application/protobuf"
      and .headers.ce_source == "/pin/crm/booking-expiration" and .headers.correlation_id == .correlation_id
      and .headers.tenant_id == .tenant_id and (.headers.ce_time | test("Z$")))' "$WORK/expect.out"
check "expect: partition = murmur2 partition, but for the 1 misrouted" jqe -s '
  (map(select(.partition != .expected_partition)) | length) == 1' "$WORK/expect.out"
check "expect: phases and times match what was produced" diff \
  <(jq -c '{event_id, booking_id, phase, expired_at, partition}' "$WORK/expected.jsonl" | sort) \
  <(jq -c '{event_id, booking_id, phase, expired_at, partition}' "$WORK/expect.out" | sort)
check "expect: the producer's partitioner agrees with murmur2" jqe -s '
  (map(select(.partition != .expected_partition)) | length) == 1' "$WORK/expected.jsonl"

# 2. read everything until idle: every count in the summary
run all --json --max-idle-ms 3000
check "all: exit 0" rc_is all 0
check "all: 6 distinct lines" lines_are all 6
check "all: summary" summary_is all "records=12 distinct=6 duplicates=2 invalid=4 misrouted=1 conflicting=0"
check "all: the invalid records are named" bash -c "
  grep -q 'header ce_type is \"pin.crm.something-else.v1\"' '$WORK/all.err' &&
  grep -q 'header content-type is \"application/json\"' '$WORK/all.err' &&
  grep -q 'header ce_id is missing' '$WORK/all.err' &&
  grep -q 'booking_id is not a canonical lowercase UUID' '$WORK/all.err'"

# 3. --strict fails on the invalid and misrouted records
run strict --json --max-idle-ms 3000 --strict
check "strict: exit 3" rc_is strict 3

# 4. human lines
run human --expect 6 --max-idle-ms 30000
check "human: 6 lines" lines_are human 6
check "human: one line per booking" bash -c "
  [[ \$(grep -cE '^booking [0-9a-f-]{36} (RESERVE|BOOKING) expired at 2027-' '$WORK/human.out') -eq 6 ]]"

# 5. --expect more than there is: stops idle, exit 1
run short --json --expect 7 --max-idle-ms 3000
check "short: exit 1" rc_is short 1
check "short: says so" grep -q 'expected 7 distinct events, got 6' "$WORK/short.err"

# 6. consumer group: commits after processing; a restart of the group reads nothing again
run group1 --json --group-id e2e-group --max-idle-ms 5000
check "group: first run sees the 6 events" lines_are group1 6
check "group: first run summary" summary_is group1 "records=12 distinct=6 duplicates=2 invalid=4 misrouted=1 conflicting=0"
run group2 --json --group-id e2e-group --max-idle-ms 5000
check "group: second run resumes after the commit" summary_is group2 "records=0 distinct=0 duplicates=0 invalid=0 misrouted=0 conflicting=0"

# 7. a missing topic within --max-idle-ms: exit 1
rc=0
bash "$CONSUMER" --bootstrap-servers "$BOOT" --topic no.such.topic --max-idle-ms 2000 >/dev/null 2>"$WORK/missing.err" || rc=$?
echo "$rc" >"$WORK/missing.rc"
check "missing topic: exit 1" rc_is missing 1
check "missing topic: says so" grep -q 'topic no.such.topic not found' "$WORK/missing.err"

echo "java consumer e2e: $passed passed, $failed failed"
[[ "$failed" -eq 0 ]]
