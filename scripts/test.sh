#!/usr/bin/env bash
# The test command. Starts a throwaway PostgreSQL (Debian's package,
# installed when missing) and a single-node Apache Kafka 4.4.0 (jars from
# Maven Central, run on the machine's Java 17) unless DATABASE_URL /
# KAFKA_BOOTSTRAP_SERVERS already point at running ones, runs the whole
# suite, then the long tests (#[ignore]d in the suite) alone, one at a
# time, and stops what it started.
#
#   bash scripts/test.sh [cargo test arguments...]
#
# Everything the run makes lives in one work folder: the tests' scratch
# folders too (TMPDIR points inside it). At exit, pass or fail, it stops
# every process whose command line or environment names that folder and
# removes it. A failed run first keeps the logs (the servers', the tests'
# output) in a folder of their own, says where, prints the failing tests'
# own output. Then it checks that nothing is left: no folder, no new
# booking-expiration-* entry in the temporary directory, no process, no
# PostgreSQL shared-memory segment in /dev/shm (exit 1 otherwise); the
# segments of clusters the fault tests kill on purpose are removed first.
#
# The last line is one summary, counted from libtest's "test result:" lines
# (the suite's and the long tests'):
#   ALL PASSED: N tests in XmYs
#   FAILED: K of N tests in XmYs: NAME, NAME, ...
#   FAILED: no test failed (N passed) in XmYs; the run stopped while STEP
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0

tmp_root="${TMPDIR:-/tmp}"
ours_before="$(ls -A "$tmp_root" | grep '^booking-expiration-' || true)"
# PostgreSQL's dynamic shared memory (dynamic_shared_memory_type = posix):
# a cluster killed with SIGKILL (the fault tests do) leaves its segments in
# /dev/shm. Those there before the run are not ours (other runs, other
# clusters on the machine).
shm_dir="${TEST_SHM_DIR:-/dev/shm}"
shm_before="$(ls -A "$shm_dir" 2>/dev/null | grep '^PostgreSQL\.' || true)"
work="$(mktemp -d "$tmp_root/booking-expiration-test.XXXXXX")"
mkdir "$work/tmp"
chmod 755 "$work" "$work/tmp" # the postgres OS user owns clusters inside
started_pg=""
started_kafka=""
# What the run is doing (named by the last line when it fails outside a test).
step="starting"
# The suite's output (cargo and the tests), read for the failures' report.
output="$work/test-output.txt"
tee_pid=""
kept=""

# Pids of the processes whose command line or environment names $work
# (servers the tests started, in statics too, and their children).
# One grep over all of /proc; the grep itself (whose arguments name $work)
# has exited by the time the loop asks who is alive. The tee that copies
# the suite's output is left to end by itself once its writers are gone.
ours() {
  local p
  for p in $(grep -laF -- "$work" /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null |
    cut -d/ -f3 | sort -u); do
    [[ "$p" == "$$" || "$p" == "$BASHPID" || "$p" == "$tee_pid" ]] && continue
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

# Waits (at most 5 s) for the tee of the suite's output to drain and end.
wait_tee() {
  local i
  [[ -z "$tee_pid" ]] && return 0
  for i in $(seq 1 50); do
    kill -0 "$tee_pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -TERM "$tee_pid" 2>/dev/null || true
}

# The PostgreSQL segments in /dev/shm that appeared during the run and that
# no live process maps or holds open: what a killed cluster left. A live
# server's segments (another run's, or one of this machine's) are mapped by
# its processes; a segment younger than 10 s may be one a server is about
# to map (parallel queries make them all the time), so it is not touched.
shm_orphans() {
  local name used
  used="$(cat /proc/[0-9]*/maps 2>/dev/null | grep -o 'PostgreSQL\.[0-9]*' | sort -u || true)"
  used+=$'\n'"$(find /proc/[0-9]*/fd -lname "$shm_dir/PostgreSQL.*" -printf '%l\n' 2>/dev/null |
    sed 's|.*/||' | sort -u || true)"
  while IFS= read -r name; do
    [[ -z "$name" ]] && continue
    grep -qxF -- "$name" <<<"$shm_before" && continue
    grep -qxF -- "$name" <<<"$used" && continue
    [[ -n "$(find "$shm_dir/$name" -maxdepth 0 -mmin -0.17 2>/dev/null)" ]] && continue
    echo "$name"
  done < <(ls -A "$shm_dir" 2>/dev/null | grep '^PostgreSQL\.' || true)
}

# A failed run keeps its text logs (PostgreSQL's, Kafka's, the servers the
# tests started, the suite's output) in a folder outside $work.
keep_logs() {
  local f rel n=0
  kept="$(mktemp -d "$tmp_root/booking-expiration-failed-run.XXXXXX")"
  while IFS= read -r f; do
    grep -Iq . "$f" 2>/dev/null || continue # Kafka's segments are *.log too
    rel="${f#"$work"/}"
    mkdir -p "$kept/$(dirname "$rel")"
    cp -p "$f" "$kept/$rel" 2>/dev/null && n=$((n + 1))
  done < <(find "$work" -type f \( -name '*.log' -o -name '*.out' -o -name 'test-output.txt' \) 2>/dev/null)
  echo "$n"
}

# The failed tests of the suite's output: "BINARY<TAB>TEST<TAB>SHOWN" per
# line, BINARY as cargo names it (`tests/it/main.rs`, `unittests
# src/lib.rs`), SHOWN the test's name after its target's (`it::cli::…`,
# `booking_expiration::config::…`). Read from libtest's list of names (the
# last "failures:" before "test result: FAILED"), not from "test NAME ...
# FAILED" lines, which a test's own output splits under --nocapture.
failed_tests() {
  [[ -f "$output" ]] || return 0
  awk '
    /^ *Running / {
      bin = $0; sub(/^ *Running /, "", bin); sub(/ \(.*$/, "", bin)
      target = $0; sub(/^.*\/deps\//, "", target); sub(/-[0-9a-f]+\)$/, "", target)
    }
    /^ *Doc-tests / { bin = $0; sub(/^ */, "", bin); target = bin; sub(/^Doc-tests /, "", target); target = target " doc" }
    /^failures:$/ { n = 0; listing = 1; next }
    listing && /^    [^ ]/ { names[++n] = substr($0, 5); next }
    /^test result: FAILED/ { for (i = 1; i <= n; i++) print bin "\t" names[i] "\t" target "::" names[i] }
    /^test result: / { n = 0; listing = 0 }
  ' "$output"
}

# Tests run, from libtest's "test result: ok. N passed; M failed; …" lines
# of the suite's output (both passes): "PASSED FAILED".
test_counts() {
  [[ -f "$output" ]] || { echo "0 0"; return 0; }
  awk '
    /^test result: / {
      for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed;?$/) passed += $(i - 1)
        if ($(i) ~ /^failed;?$/) failed += $(i - 1)
      }
    }
    END { printf "%d %d\n", passed, failed }
  ' "$output"
}

# The run's wall time as XmYs.
took() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }

# Each failed test's own output (libtest's "---- NAME stdout ----" blocks),
# at most 150 lines each (all of it is in the kept test-output.txt).
failures_output() {
  [[ -f "$output" ]] || return 0
  awk '
    /^failures:$/ { if (inblock) { inblock = 0 } ; section = !section; next }
    section && /^---- .* stdout ----$/ { inblock = 1; lines = 0; print; next }
    inblock { if (++lines <= 150) print; else if (lines == 151) print "    [... cut: the whole output is in test-output.txt]" }
  ' "$output"
}

# The cargo target options that run a binary cargo named `BINARY`.
target_of() {
  case "$1" in
    "unittests src/lib.rs") echo "--lib" ;;
    unittests*) echo "--bins" ;;
    tests/*/main.rs) local t="${1#tests/}"; echo "--test ${t%/main.rs}" ;;
    tests/*.rs) local t="${1#tests/}"; echo "--test ${t%.rs}" ;;
    *) echo "" ;;
  esac
}

# The failures' report; its last line is the run's summary.
report_failure() {
  local status="$1" passed="$2" failed_count="$3" failed bin name n=0
  failed="$(failed_tests)"
  echo >&2
  echo "== test.sh: the run failed (exit $status)" >&2
  if [[ -n "$failed" ]]; then
    failures_output >&2
  fi
  if [[ -n "$kept" ]]; then
    echo "test.sh: logs kept in $kept ($(find "$kept" -type f | wc -l) files: test-output.txt is the suite's whole output, pg/postgres.log PostgreSQL's, kafka/ Kafka's, tmp/ the servers the tests started)" >&2
  fi
  if [[ -z "$failed" ]]; then
    echo "FAILED: no test failed ($passed passed) in $(took); the run stopped while $step" >&2
    return 0
  fi
  while IFS=$'\t' read -r bin name _; do
    n=$((n + 1))
    [[ $n -le 5 ]] && echo "test.sh: rerun: bash scripts/test.sh $(target_of "$bin") '$name' -- --exact --include-ignored" >&2
  done <<<"$failed"
  # libtest's count and the listed names agree; if not, the names decide.
  [[ $failed_count -ge $n ]] || failed_count=$n
  echo "FAILED: $failed_count of $((passed + failed_count)) tests in $(took): $(awk -F'\t' '{printf "%s%s", (NR > 1 ? ", " : ""), $3}' <<<"$failed")" >&2
}

# Whether a live process names `path` (another test run's work folder).
in_use() {
  local p
  for p in $(grep -laF -- "$1" /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | sort -u); do
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    kill -0 "$p" 2>/dev/null && return 0
  done
  return 1
}

cleanup() {
  local status=$?
  # Back to the terminal: the tee ends once nothing writes to it.
  if [[ -n "$tee_pid" ]] && { true >&3; } 2>/dev/null; then
    exec 1>&3 2>&4 3>&- 4>&-
  fi
  [[ -n "$started_kafka" ]] && bash scripts/kafka.sh stop "$work/kafka" || true
  [[ -n "$started_pg" ]] && bash scripts/postgres.sh stop "$work/pg" || true
  stop_ours
  wait_tee
  local passed failed_count
  read -r passed failed_count < <(test_counts)
  if [[ $status -ne 0 ]]; then
    keep_logs >/dev/null
    [[ -f "$kept/test-output.txt" ]] && output="$kept/test-output.txt"
  fi
  rm -rf "$work" || true

  # Nothing the run made may be left.
  local left="" new orphans
  [[ -e "$work" ]] && left+="folder $work"$'\n'
  new="$(comm -13 <(sort <<<"$ours_before") \
    <(ls -A "$tmp_root" | grep '^booking-expiration-' | sort) | grep -v '^$' || true)"
  [[ -n "$kept" ]] && new="$(grep -vxF -- "$(basename "$kept")" <<<"$new" || true)"
  # Another test run, demo or soak that started meanwhile is still using its own.
  local entry
  for entry in $new; do
    in_use "$tmp_root/$entry" || left+="in $tmp_root: $entry"$'\n'
  done
  local pid
  for pid in $(ours); do
    left+="process $(ps -o pid=,user=,args= -p "$pid" 2>/dev/null | cut -c1-300 || true)"$'\n'
  done
  # The fault tests kill clusters with SIGKILL on purpose, and a killed
  # cluster cannot remove its shared memory: removing it is the normal
  # clean-up. Only a segment that cannot be removed counts as left behind.
  orphans="$(shm_orphans)"
  if [[ -n "$orphans" ]]; then
    (cd "$shm_dir" && xargs rm -f -- <<<"$orphans") || true
    echo "test.sh: cleaned up the shared memory of the PostgreSQL clusters the tests killed on purpose ($(wc -l <<<"$orphans") segment(s) in $shm_dir)" >&2
    orphans="$(shm_orphans)"
    [[ -n "$orphans" ]] && left+="$(sed "s|^|in $shm_dir: |" <<<"$orphans")"$'\n'
  fi
  if [[ -n "$left" ]]; then
    echo "test.sh: the run left behind:" >&2
    printf '%s' "$left" >&2
  fi
  # The summary comes last: one line.
  if [[ $status -ne 0 ]]; then
    report_failure "$status" "$passed" "$failed_count"
  elif [[ -n "$left" ]]; then
    echo "FAILED: all $passed tests passed in $(took), but the run left behind what is listed above" >&2
    status=1
  else
    echo "ALL PASSED: $passed tests in $(took)" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r pg_port kafka_port < <(python3 scripts/free-port.py 2)

if [[ -z "${DATABASE_URL:-}" ]]; then
  step="starting PostgreSQL"
  # Durability off: a throwaway cluster for tests only (benchmarks use defaults).
  DATABASE_URL="$(bash scripts/postgres.sh start "$work/pg" "$pg_port" \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off)"
  export DATABASE_URL
  started_pg=1
  echo "test.sh: PostgreSQL on 127.0.0.1:$pg_port (log $work/pg/postgres.log)" >&2
fi
if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
  step="starting Kafka"
  bash scripts/kafka.sh start "$work/kafka" "$kafka_port"
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$kafka_port"
  started_kafka=1
  echo "test.sh: Kafka on $KAFKA_BOOTSTRAP_SERVERS (logs under $work/kafka)" >&2
fi

# The tracing tests export spans to a real OpenTelemetry Collector.
if [[ -z "${OTELCOL_BIN:-}" ]]; then
  step="building the OpenTelemetry Collector (scripts/otelcol.sh)"
  OTELCOL_BIN="$(bash scripts/otelcol.sh)"
  export OTELCOL_BIN
fi

# tests/it/pgbouncer.rs starts PgBouncers of its own (Debian's package).
step="installing PgBouncer (scripts/pgbouncer.sh)"
bash scripts/pgbouncer.sh install

# The suite's output goes to the terminal and to $output (read when the
# run fails). Not through a pipe: a server a test left running would hold
# a pipe open, and a pipeline would wait for it.
exec 3>&1 4>&2
exec > >(tee -a "$output") 2>&1
tee_pid=$!
step="running the suite (cargo test --workspace)"
TMPDIR="$work/tmp" cargo test --workspace --locked "$@"
# Tests marked #[ignore] load the server heavily (a 1,000,000-row table) or
# assert timings of a second that the suite's load would blur (kafka_cluster,
# broker_freeze): they run after the suite, one at a time, so they neither
# make the suite's timing tests late nor are made late by them. With
# arguments, add `-- --include-ignored` to get them.
if [[ $# -eq 0 ]]; then
  step="running the long tests alone (cargo test --test it -- --ignored --test-threads=1)"
  TMPDIR="$work/tmp" cargo test --locked --test it -- --ignored --test-threads=1
fi
exec 1>&3 2>&4 3>&- 4>&-

# Each test drops its own database when it ends (tests/it/support/db.rs);
# on the server started here, one left over is a bug.
if [[ -n "$started_pg" ]] && command -v psql >/dev/null 2>&1; then
  step="checking for test databases left over"
  leftover="$(psql "$DATABASE_URL" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'be\_test\_%'")"
  if [[ -n "$leftover" ]]; then
    echo "test.sh: test databases left over after the run:" >&2
    echo "$leftover" >&2
    exit 1
  fi
  echo "test.sh: no test database left over" >&2
fi
step="stopping"
