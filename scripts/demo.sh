#!/usr/bin/env bash
# The whole pipeline on one machine, without Docker: a throwaway PostgreSQL and
# Apache Kafka (as the tests start them), the topic, migrations, 10 000 synthetic
# bookings (20 % already due, the rest due over the next 3 minutes), the worker with
# a 5 s cycle, and a consumer that decodes the events. Every few seconds one
# progress line: backlog per phase, expired so far, outbox lag, events consumed, and
# a few decoded events. After DEMO_DURATION (200 s by default: every seeded deadline
# has passed by then) it stops the worker, lets publishing drain and prints one line
# holding the expired count (database) and the consumed count taken at the same
# moment, and whether they are equal (exit 1 if not); then it stops everything it
# started. Its folder (logs, connect.env) is named on the first line and the last.
# Before the worker starts it prints how to connect while the demo runs: DATABASE_URL,
# the Kafka bootstrap address, the metrics address and a `status` command line that works
# as it is (the same variables in $WORK/connect.env, to source from another terminal).
#
#   bash scripts/demo.sh                    stops by itself after 200 s
#   DEMO_DURATION=90 bash scripts/demo.sh   after 90 s
#   DEMO_DURATION=0 bash scripts/demo.sh    until Ctrl-C
#
# Environment:
#   DEMO_DURATION     seconds to run after the worker started (default 200; 0 = until
#                     Ctrl-C). With a longer DEMO_SPREAD, raise it to see every expiry.
#   DEMO_TICK         seconds between progress lines (default 5)
#   DEMO_ACTIVE       active bookings to seed (default 10000)
#   DEMO_DUE_FRACTION share already due (default 0.2)
#   DEMO_SPREAD       the other deadlines fall over this span from now (default 3m)
#   DEMO_INTERVAL     EXPIRATION_INTERVAL of the worker (default 5s)
#   DEMO_SHOW_EVENTS  decoded events printed per progress line (default 2; 0 = none)
#   DEMO_BIN          use this booking-expiration binary instead of building one (e.g. the
#                     static one of scripts/static-build.sh); the consumer is still built
#   DEMO_KEEP=1       keep the PostgreSQL and Kafka data (logs are always kept)
#   CARGO_TARGET_DIR  honoured
#
# Needs: cargo, python3, java >= 17 and (once, to fetch the Kafka jars) mvn;
# PostgreSQL comes from Debian's packages (scripts/postgres.sh installs it as root).
# Ctrl-C, TERM or the end of DEMO_DURATION stop everything the demo started.
set -euo pipefail
cd "$(dirname "$0")/.."

TOPIC="${KAFKA_TOPIC:-pin.crm.booking-expired.v1}"
TICK="${DEMO_TICK:-5}"
ACTIVE="${DEMO_ACTIVE:-10000}"
DUE_FRACTION="${DEMO_DUE_FRACTION:-0.2}"
SPREAD="${DEMO_SPREAD:-3m}"
INTERVAL="${DEMO_INTERVAL:-5s}"
SHOW_EVENTS="${DEMO_SHOW_EVENTS:-2}"
DURATION="${DEMO_DURATION:-200}"
[[ "$DURATION" =~ ^[0-9]+$ ]] || { echo "demo: DEMO_DURATION must be whole seconds (0: until Ctrl-C)" >&2; exit 2; }

say() { echo "$*"; }
log() { echo "demo: $*" >&2; }
clock() { date +%H:%M:%S; }

# --- its folder ------------------------------------------------------------------------
# Logs, connect.env, and the PostgreSQL and Kafka data (removed at the end unless
# DEMO_KEEP=1). Named first, so it can be followed from another terminal.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/booking-expiration-demo.XXXXXX")"
chmod 755 "$WORK" # the postgres OS user owns the cluster inside
say "== demo folder: $WORK (logs: worker.log, events.log, consumer.log; kept at the end)"
started_pg="" started_kafka="" worker_pid="" consumer_pid=""

# TERM (graceful), up to 15 s, then KILL.
stop_worker() {
  kill -TERM "$worker_pid" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$worker_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$worker_pid" 2>/dev/null || true
  wait "$worker_pid" 2>/dev/null || true
  worker_pid=""
  log "worker stopped ($(tail -n 1 "$WORK/worker.log" 2>/dev/null | cut -c1-160))"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  echo
  say "== stopping"
  if [[ -n "$consumer_pid" ]] && kill -0 "$consumer_pid" 2>/dev/null; then
    kill -TERM "$consumer_pid" 2>/dev/null || true
    wait "$consumer_pid" 2>/dev/null || true
  fi
  if [[ -n "$worker_pid" ]] && kill -0 "$worker_pid" 2>/dev/null; then
    stop_worker
  fi
  [[ -n "$started_kafka" ]] && { bash scripts/kafka.sh stop "$WORK/kafka" >/dev/null 2>&1 || true; log "kafka stopped"; }
  [[ -n "$started_pg" ]] && { bash scripts/postgres.sh stop "$WORK/pg" >/dev/null 2>&1 || true; log "postgres stopped"; }
  if [[ "${DEMO_KEEP:-0}" != 1 ]]; then rm -rf "$WORK/pg" "$WORK/kafka"; fi
  say "== demo ended (exit $rc); its logs are in $WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- build ---------------------------------------------------------------------------
say "== building (cargo build --release)"
t_build=$(date +%s)
TARGET_DIR="${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps --locked \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}"
if [[ -n "${DEMO_BIN:-}" ]]; then
  BIN="$(cd "$(dirname "$DEMO_BIN")" && pwd)/$(basename "$DEMO_BIN")"
  [[ -x "$BIN" ]] || { log "DEMO_BIN=$DEMO_BIN is not an executable"; exit 2; }
else
  cargo build --release --locked -p booking-expiration --bin booking-expiration
  BIN="$TARGET_DIR/release/booking-expiration"
fi
CONSUMER=""
if [[ -f crates/booking-expired-proto/examples/consume.rs ]]; then
  cargo build --release --locked -p booking-expired-proto --example consume
  CONSUMER="$TARGET_DIR/release/examples/consume"
fi
log "built in $(( $(date +%s) - t_build )) s: $BIN${CONSUMER:+ and $CONSUMER}"

# --- services ------------------------------------------------------------------------
read -r PG_PORT KAFKA_PORT METRICS_PORT < <(python3 scripts/free-port.py 3)

say "== PostgreSQL on 127.0.0.1:$PG_PORT, Kafka on 127.0.0.1:$KAFKA_PORT"
started_pg=1
DATABASE_URL="$(bash scripts/postgres.sh start "$WORK/pg" "$PG_PORT" 2>"$WORK/postgres-start.log")" \
  || { cat "$WORK/postgres-start.log" >&2; exit 1; }
started_kafka=1
bash scripts/kafka.sh start "$WORK/kafka" "$KAFKA_PORT" 2>"$WORK/kafka-start.log" \
  || { cat "$WORK/kafka-start.log" >&2; exit 1; }
bash scripts/kafka.sh create-topic "$KAFKA_PORT" "$TOPIC" 3 >"$WORK/create-topic.log" 2>&1 \
  || { cat "$WORK/create-topic.log" >&2; exit 1; }
log "topic $TOPIC created with 3 partitions"

export DATABASE_URL KAFKA_TOPIC="$TOPIC"
export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$KAFKA_PORT"
export METRICS_ADDR="127.0.0.1:$METRICS_PORT"
export EXPIRATION_INTERVAL="$INTERVAL"
export RUST_LOG="${RUST_LOG:-info}"

say "== booking-expiration migrate"
RUST_LOG=warn "$BIN" migrate
say "== booking-expiration seed --active $ACTIVE --due-fraction $DUE_FRACTION --spread $SPREAD"
RUST_LOG=warn "$BIN" seed --active "$ACTIVE" --due-fraction "$DUE_FRACTION" --spread "$SPREAD"
RUST_LOG=warn "$BIN" status

# --- how to connect while it runs -------------------------------------------------------
# The same lines in a file to source from another terminal.
{
  echo "export DATABASE_URL='$DATABASE_URL'"
  echo "export KAFKA_BOOTSTRAP_SERVERS='$KAFKA_BOOTSTRAP_SERVERS'"
  echo "export KAFKA_TOPIC='$TOPIC'"
  echo "export METRICS_ADDR='$METRICS_ADDR'"
} >"$WORK/connect.env"
say "== connect while it runs (from another terminal; the servers go away when the demo ends):"
say "   DATABASE_URL=$DATABASE_URL"
say "   Kafka bootstrap $KAFKA_BOOTSTRAP_SERVERS, topic $TOPIC"
say "   metrics http://$METRICS_ADDR/metrics, probes http://$METRICS_ADDR/healthz and /readyz"
say "   source $WORK/connect.env   # sets DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS, KAFKA_TOPIC, METRICS_ADDR"
say "   DATABASE_URL='$DATABASE_URL' $BIN status"
say "   curl -s http://$METRICS_ADDR/readyz"
say "   psql '$DATABASE_URL' -c 'SELECT status, count(*) FROM bookings GROUP BY 1'"

# --- worker and consumer -------------------------------------------------------------
say "== booking-expiration run (EXPIRATION_INTERVAL=$INTERVAL, metrics http://$METRICS_ADDR/metrics, log $WORK/worker.log)"
"$BIN" run >"$WORK/worker.log" 2>&1 &
worker_pid=$!
t_start=$(date +%s)

if [[ -n "$CONSUMER" ]]; then
  "$CONSUMER" --bootstrap-servers "$KAFKA_BOOTSTRAP_SERVERS" --topic "$TOPIC" --follow \
    >"$WORK/events.log" 2>"$WORK/consumer.log" &
  consumer_pid=$!
  log "consumer: crates/booking-expired-proto/examples/consume (decoded events in $WORK/events.log)"
else
  : >"$WORK/events.log"
  log "no consumer example: events are counted from the outbox (published rows)"
fi

# One progress line from `status --json` and /metrics; prints a few new events.
progress() {
  local consumed status_json metrics
  # Consumed first, expired after: an event is never counted before its expiry.
  consumed="$(wc -l <"$WORK/events.log")"
  status_json="$(RUST_LOG=warn "$BIN" status --json 2>>"$WORK/status.log" || echo '{}')"
  metrics="$(python3 - "$METRICS_ADDR" <<'PY' 2>/dev/null || true
import sys, urllib.request
try:
    print(urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=2).read().decode())
except Exception:
    pass
PY
)"
  STATUS_JSON="$status_json" METRICS_TEXT="$metrics" python3 - "$1" "$WORK" "$SHOW_EVENTS" "${CONSUMER:+1}" "$consumed" <<'PY'
import json, os, re, sys, time
elapsed, work, show = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
has_consumer = sys.argv[4] == "1"
consumed = int(sys.argv[5])
state_file = os.path.join(work, ".progress")
try:
    state = json.load(open(state_file))
except Exception:
    state = {"expired": 0, "events": 0}
try:
    st = json.loads(os.environ.get("STATUS_JSON") or "{}")
except ValueError:
    st = {}
text = os.environ.get("METRICS_TEXT", "")
def metric(name, labels=None):
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r'^([a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)', line)
        if not m or m.group(1) != name:
            continue
        if labels and labels not in (m.group(2) or ""):
            continue
        total += float(m.group(3)); seen = True
    return int(total) if seen else None
items_r = metric("crm_booking_expiration_items_total", 'phase="reserve"') or 0
items_b = metric("crm_booking_expiration_items_total", 'phase="booking"') or 0
published = metric("crm_booking_expiration_outbox_published_total")
expired = items_r + items_b
backlog = {p.get("phase"): p.get("backlog") for p in st.get("phases", [])}
events_path = os.path.join(work, "events.log")
lines = open(events_path, errors="replace").read().splitlines()[:consumed] if os.path.exists(events_path) else []
events = len(lines)
wave = expired - state["expired"]
parts = [
    f"[{elapsed:>4}s]",
    "backlog " + " ".join(f"{k}={v}" for k, v in backlog.items()) if backlog else "backlog ?",
    f"| expired {expired} (reserve {items_r}, booking {items_b})" + (f" +{wave}" if wave > 0 else ""),
    f"| outbox unpublished {st.get('outbox_unpublished', '?')} lag {st.get('outbox_oldest_unpublished_age_seconds', '?')}s"
    + (f" published {published}" if published is not None else ""),
]
if has_consumer:
    parts.append(f"| consumed {events} events")
if st.get("poison"):
    parts.append(f"| poison {len(st['poison'])}")
print(" ".join(parts), flush=True)
# The consumer's line: EVENT_ID PHASE booking ID tenant ID deal ID object ID
# expired_at Ns (pP @OFFSET). Shown with whole ids only: the event, its phase, the
# booking, when it expired, where it is on the topic (all of it in events.log).
event_line = re.compile(r"^(\S+) +(\S+) +booking (\S+) tenant \S+ deal \S+ object \S+ "
                        r"expired_at (\d+)s \(p(\d+) @(\d+)\)$")
def shown(line):
    m = event_line.match(line)
    if m:
        at = time.strftime("%H:%M:%S", time.gmtime(int(m.group(4))))
        return f"{m.group(1)} {m.group(2):<7} booking {m.group(3)} expired {at}Z p{m.group(5)} @{m.group(6)}"
    if len(line) <= 150:
        return line
    return line[:150].rsplit(" ", 1)[0] + " ..."  # whole words only
if show > 0 and events > state["events"]:
    for line in lines[state["events"]:][:show]:
        print(f"         event: {shown(line)}")
    if events - state["events"] > show:
        print(f"         ... {events - state['events'] - show} more this tick")
state.update(expired=expired, events=events)
json.dump(state, open(state_file, "w"))
PY
}

if [[ "$DURATION" -gt 0 ]]; then
  say "== running for ${DURATION}s, then stopping by itself (progress every ${TICK}s; DEMO_DURATION=0: until Ctrl-C)"
else
  say "== running until Ctrl-C (progress every ${TICK}s)"
fi
while :; do
  sleep "$TICK" &
  wait $! || true
  elapsed=$(( $(date +%s) - t_start ))
  if ! kill -0 "$worker_pid" 2>/dev/null; then
    wait "$worker_pid" 2>/dev/null && rc=0 || rc=$?
    worker_pid=""
    log "the worker exited (status $rc); last lines of $WORK/worker.log:"
    tail -n 20 "$WORK/worker.log" >&2
    exit 1
  fi
  progress "$elapsed"
  if [[ "$DURATION" -gt 0 && "$elapsed" -ge "$DURATION" ]]; then
    break
  fi
done

# --- final counts, both from one moment -----------------------------------------------
# Deadlines keep falling due, so the worker stops first (TERM: graceful) and the expired
# count (audit rows, one per expiry) stays put; a publisher alone (`run --no-worker`)
# sends what the outbox still holds. Then wait (at most 60 s) until no row is
# unpublished and the consumer's count has not grown for 1.5 s, and read both. The
# consumer drops duplicates by ce_id, so its lines are distinct events.
db_counts() { # -> "EXPIRED UNPUBLISHED PARKED"
  psql -X -q -At -F ' ' "$DATABASE_URL" -c "SELECT
    (SELECT count(*) FROM booking_expiration_audit),
    (SELECT count(*) FROM booking_expiration_outbox WHERE published_at IS NULL AND parked_at IS NULL),
    (SELECT count(*) FROM booking_expiration_outbox WHERE parked_at IS NOT NULL)"
}
say "== stopping the worker, then waiting for publishing to drain"
stop_worker
expired="" consumed="" unpublished="" parked="" drained="" quiet=0 prev=""
read -r expired unpublished parked < <(db_counts) || true
if [[ "$unpublished" != 0 ]]; then
  log "$unpublished outbox rows unpublished: starting a publisher alone (run --no-worker)"
  "$BIN" run --no-worker >>"$WORK/worker.log" 2>&1 &
  worker_pid=$!
fi
for _ in $(seq 1 120); do
  read -r expired unpublished parked < <(db_counts) || true
  consumed="$(wc -l <"$WORK/events.log")"
  if [[ "$unpublished" == 0 && "$consumed" == "$prev" ]]; then
    quiet=$((quiet + 1))
    [[ $quiet -ge 3 ]] && { drained=1; break; }
  else
    quiet=0
  fi
  prev="$consumed"
  sleep 0.5
done
at="$(clock)"
say "== final status after $(( $(date +%s) - t_start ))s"
RUST_LOG=warn "$BIN" status
if [[ -z "$CONSUMER" ]]; then
  say "final at $at: expired $expired, unpublished $unpublished (no consumer)"
  exit 0
fi
bookings="$(head -n "$consumed" "$WORK/events.log" | awk '{print $4}' | sort -u | wc -l)"
note=""
[[ -n "$drained" ]] || note=" (NOT drained after 60 s)"
line="final at $at$note: expired $expired (database) | consumed $consumed distinct events, $bookings distinct bookings"
(( parked > 0 )) && line+=" | parked $parked"
if [[ -n "$drained" && "$expired" == "$consumed" && "$consumed" == "$bookings" ]]; then
  say "$line | equal"
else
  say "$line | NOT equal"
  exit 1
fi
