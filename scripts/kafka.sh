#!/usr/bin/env bash
# A real single-node Apache Kafka 4.4.0 broker (KRaft, broker+controller in one JVM) for
# tests, run straight from the Maven Central jars: no Docker, no Kafka tarball.
# Needs java >= 17 and mvn (only for the first `fetch`).
#
#   scripts/kafka.sh fetch                      jars -> $KAFKA_CACHE_DIR/libs (once)
#   scripts/kafka.sh start DIR PORT             broker on 127.0.0.1:PORT (controller PORT+1),
#                                               state in DIR; returns once it serves metadata
#   scripts/kafka.sh stop DIR                   TERM, up to 20 s, then KILL
#   scripts/kafka.sh status DIR                 exit 0 if the broker of DIR runs
#   scripts/kafka.sh create-topic PORT TOPIC PARTITIONS [TopicCommand args...]
#   scripts/kafka.sh create-topic PORT TOPIC --replica-assignment LIST [TopicCommand args...]
#                                               LIST as TopicCommand takes it, partitions by
#                                               commas, each partition's nodes by colons, its
#                                               preferred leader first (1:2,3:1,1:3: p0 on
#                                               nodes 1 and 2 led by 1, ...); the partition
#                                               count and replication factor come from LIST
#   scripts/kafka.sh alter-topic-config PORT TOPIC KEY=VALUE[,KEY=VALUE...]
#   scripts/kafka.sh alter-client-quota PORT CLIENT_ID KEY=VALUE[,KEY=VALUE...]
#       (e.g. producer_byte_rate=100000: a client quota, set through the Admin
#       API's alterClientQuotas as kafka-configs.sh does)
#                                               set topic configs (ConfigCommand --add-config)
#   scripts/kafka.sh list-topics PORT
#   scripts/kafka.sh partition [--murmur2] KEY... --partitions N
#                                               KEY<TAB>PARTITION by the Java client's own
#                                               code; keys from stdin when none given
#   scripts/kafka.sh produce PORT TOPIC [--headers]
#                                               stdin lines "KEY<TAB>VALUE" -> TOPIC (with
#                                               --headers: "H1:V1,H2:V2<TAB>KEY<TAB>VALUE")
#   scripts/kafka.sh consume PORT TOPIC OUTFILE [MAX_MESSAGES] [IDLE_MS]
#                                               JSON lines, see scripts/kafka/DumpTopic.java
#   scripts/kafka.sh classpath                  print the classpath ("$LIBS/*")
#   scripts/kafka.sh launch-broker DIR [FORMAT_ARG...]
#                                               a broker of DIR/server.properties (written by
#                                               the caller) in the background: DIR/data formatted
#                                               once (FORMAT_ARG: more StorageTool arguments,
#                                               --add-scram ...), pid in DIR/kafka.pid, printed
#   scripts/kafka.sh wait-started DIR PID PORT...
#                                               until its log says "Kafka Server started" and
#                                               every PORT accepts TCP; on its exit or after
#                                               KAFKA_START_TIMEOUT: its log's tail, stop, fail
#   scripts/kafka.sh topic-defaults DIR RF ISR  the server.properties lines all test brokers share
#   scripts/kafka.sh add-partitions PORT TOPIC N
#                                               grow TOPIC to N partitions
#   scripts/kafka.sh describe-topic HOST:PORT[,HOST:PORT...] TOPIC
#                                               PARTITION<TAB>LEADER<TAB>ISR (ISR comma-separated)
#
# Three-broker cluster (KRaft, each node broker+controller, static quorum voters):
#   scripts/kafka.sh start-cluster DIR P1 P2 P3 node N on 127.0.0.1:PN (controller PN+1),
#                                               state in DIR/nodeN; returns once all three
#                                               serve metadata. Profile from
#                                               KAFKA_CLUSTER_PROFILE=tuned|defaults (default
#                                               tuned), kept in DIR/cluster.profile for the
#                                               nodes started again later
#   scripts/kafka.sh stop-cluster DIR           stop every node still running (TERM, then KILL)
#   scripts/kafka.sh kill DIR N                 kill -9 node N (a crash: no controlled shutdown)
#   scripts/kafka.sh stop-node DIR N            TERM node N (controlled shutdown: its leaderships
#                                               move away before it stops); waits until it exits
#   scripts/kafka.sh start-node DIR N           start node N again (same ports, same data,
#                                               same profile); waits until it serves metadata
#   scripts/kafka.sh launch-node DIR N          the same, but returns at once (no readiness wait)
#   scripts/kafka.sh freeze DIR N               SIGSTOP node N (a GC pause, a stuck disk: its
#                                               connections stay open, it answers nothing)
#   scripts/kafka.sh thaw DIR N                 SIGCONT node N
#   scripts/kafka.sh node-pid DIR N             the pid of node N's JVM
#   scripts/kafka.sh plain-producer BOOTSTRAP TOPIC RATE ACKFILE WATCHFILE WATCH_TOPIC...
#                                               a plain Java producer (acks=all, otherwise the
#                                               client's defaults) and a leader/ISR watcher until
#                                               SIGTERM, see scripts/kafka/PlainProducer.java
# Cluster settings (write_node_config): replication factor 3, min.insync.replicas=2; the
# `tuned` profile adds broker.session.timeout.ms=6000, broker.heartbeat.interval.ms=1000,
# replica.lag.time.max.ms=5000, `defaults` leaves those three at Kafka's defaults (9000,
# 2000, 30000); per-node heap KAFKA_CLUSTER_HEAP_OPTS (default -Xms128m -Xmx384m), serial GC.
#
# Environment: KAFKA_CACHE_DIR (default ~/.cache/booking-expiration/kafka-4.4.0),
# KAFKA_START_TIMEOUT (s, default 90), KAFKA_HEAP_OPTS (default -Xms256m -Xmx512m),
# KAFKA_JAVA_OPTS (extra broker JVM options), JAVA_HOME or JAVA, MVN.
#
# `start` on a DIR that holds a formatted broker keeps its data (rm -rf DIR for a clean
# one); `start` on a DIR whose broker is already running only waits for it to be ready.
set -euo pipefail

# A closed stdin (not /dev/null) would let the JVM reuse fd 0 for a jar file, and
# `partition` would then read that jar as its keys.
if { exec 3<&0; } 2>/dev/null; then exec 3<&-; else exec </dev/null; fi

KAFKA_VERSION=4.4.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KDIR="$HERE/kafka"
CACHE="${KAFKA_CACHE_DIR:-${HOME:-/tmp}/.cache/booking-expiration/kafka-$KAFKA_VERSION}"
LIBS="$CACHE/libs"
MARKER="$LIBS/.complete"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"

if [[ -n "${JAVA:-}" ]]; then
  :
elif [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA=java
fi
read -r -a MVN <<<"${MVN:-mvn}"   # may carry options: MVN="mvn -s settings.xml"

log() { echo "kafka.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

now() { date +%s; }
now_ms() { date +%s%3N; }
since() { local d=$(( $(now_ms) - $1 )); printf '%d.%01d s' $(( d / 1000 )) $(( d % 1000 / 100 )); }

check_java() {
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (set JAVA_HOME or JAVA)"
  local v
  v="$("$JAVA" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
  [[ "${v%%.*}" =~ ^[0-9]+$ && "${v%%.*}" -ge 17 ]] || die "Kafka $KAFKA_VERSION needs java >= 17 (found '${v:-?}' at $JAVA)"
}

pom_sum() { sha256sum "$KDIR/pom.xml" | cut -d' ' -f1; }

libs_ok() { [[ -f "$MARKER" && "$(cat "$MARKER")" == "$(pom_sum)" ]]; }

# fetch: the jars of scripts/kafka/pom.xml into $LIBS, once (again only if pom.xml changed).
# Downloads into a temporary folder and renames it, so an interrupted fetch leaves nothing
# half-done; a lock keeps parallel callers from fetching twice.
cmd_fetch() {
  libs_ok && return 0
  command -v "${MVN[0]}" >/dev/null 2>&1 || die "mvn not found: it is needed once to fetch the Kafka jars into $LIBS"
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.fetch.lock"
  flock 9
  if libs_ok; then exec 9>&-; return 0; fi
  local tmp="$CACHE/libs.tmp.$$" t0
  t0=$(now_ms)
  rm -rf "$tmp"
  log "fetching Kafka $KAFKA_VERSION jars into $LIBS ..."
  if ! "${MVN[@]}" -q -B -f "$KDIR/pom.xml" dependency:copy-dependencies -DoutputDirectory="$tmp" \
      >"$CACHE/fetch.log" 2>&1 </dev/null; then
    cat "$CACHE/fetch.log" >&2
    rm -rf "$tmp"
    die "mvn dependency:copy-dependencies failed (log above, also in $CACHE/fetch.log)"
  fi
  ls "$tmp"/kafka_2.13-"$KAFKA_VERSION".jar "$tmp"/kafka-clients-"$KAFKA_VERSION".jar \
     "$tmp"/kafka-tools-"$KAFKA_VERSION".jar "$tmp"/kafka-server-"$KAFKA_VERSION".jar >/dev/null \
    || die "fetch incomplete: Kafka jars missing in $tmp"
  pom_sum >"$tmp/.complete"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  rm -rf "$CACHE"/libs.tmp.* 2>/dev/null || true
  exec 9>&-
  local jars=("$LIBS"/*.jar)
  log "fetched ${#jars[@]} jars ($(du -sh "$LIBS" | cut -f1)) in $(since "$t0")"
}

ensure_libs() { check_java; libs_ok || cmd_fetch; }

# A short-lived JVM with the Kafka jars: client tools and the two helper programs.
# (No log4j shutdown hook: the producer's network thread would otherwise log "Unable to
# register Log4j shutdown hook because JVM is shutting down" at every ConsoleProducer exit.)
KJAVA=("$JAVA" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  -Dlog4j2.configurationFile="$KDIR/tools-log4j2.properties" -Dlog4j2.shutdownHookEnabled=false
  -cp "$LIBS/*")
kjava() { "${KJAVA[@]}" "$@"; }

check_port() {
  [[ "$1" =~ ^[0-9]+$ && "$1" -ge 1 && "$1" -le 65534 ]] || die "bad port '$1'"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_of() { # DIR -> pid of its running broker, or nothing (exit 1)
  local pidfile="$1/kafka.pid" pid
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  # the pid must still be our broker, not a reused number
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $1/server.properties" || return 1
  echo "$pid"
}

abs_dir() { mkdir -p "$1" && (cd "$1" && pwd -P); }

# topic_defaults DIR RF ISR: the server.properties lines every test broker shares (one
# node or three, plaintext or TLS): data folder, replication of topics and of Kafka's
# internal topics, small thread pools for a 2-core machine.
topic_defaults() {
  local dir="$1" rf="$2" isr="$3"
  cat <<EOF
log.dirs=$dir/data
num.partitions=3
default.replication.factor=$rf
min.insync.replicas=$isr
auto.create.topics.enable=false
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.recovery.threads.per.data.dir=1
EOF
}

write_config() { # DIR PORT
  local dir="$1" port="$2" cport=$(( $2 + 1 ))
  cat >"$dir/server.properties" <<EOF
# written by scripts/kafka.sh start: single-node KRaft test broker
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
$(topic_defaults "$dir" 1 1)
num.io.threads=4
log.retention.hours=168
EOF
}

tail_log() {
  local f="$1/kafka.log"
  if [[ -f "$f" ]]; then
    log "last lines of $f:"
    tail -n 60 "$f" >&2
  fi
}

wait_ready() { # DIR PORT PID
  local dir="$1" port="$2" pid="$3" deadline=$(( $(now) + START_TIMEOUT ))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail_log "$dir"
      rm -f "$dir/kafka.pid"
      die "the broker (pid $pid) exited during start-up"
    fi
    if port_open "$port" && \
       timeout 30 "${KJAVA[@]}" org.apache.kafka.tools.TopicCommand \
         --bootstrap-server "127.0.0.1:$port" --list \
         --command-config "$KDIR/admin-client.properties" >/dev/null 2>&1 </dev/null; then
      return 0
    fi
    if (( $(now) >= deadline )); then
      tail_log "$dir"
      log "the broker on 127.0.0.1:$port did not answer a metadata request within ${START_TIMEOUT} s: stopping it"
      cmd_stop "$dir"
      die "broker start-up timed out"
    fi
    sleep 0.5
  done
}

# The single-node brokers of kafka-tls.sh and kafka-acl.sh: their own listeners and
# server.properties, the same launch and readiness.
cmd_launch_broker() {
  [[ $# -ge 1 && -f "$1/server.properties" ]] || die "usage: kafka.sh launch-broker DIR [FORMAT_ARG...] (DIR/server.properties first)"
  local dir pid
  dir="$(cd "$1" && pwd -P)"
  shift
  ensure_libs
  if [[ ! -f "$dir/data/meta.properties" ]]; then
    kjava kafka.tools.StorageTool format -t "$(head -c 16 /dev/urandom | base64 | tr '+/' 'AB' | tr -d '=\n')" \
      -c "$dir/server.properties" "$@" </dev/null >"$dir/format.log" 2>&1 \
      || { cat "$dir/format.log" >&2; die "kafka-storage format failed"; }
  fi
  # shellcheck disable=SC2086
  nohup "$JAVA" ${KAFKA_HEAP_OPTS:--Xms128m -Xmx384m} \
    -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -XX:TieredStopAtLevel=1 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$KDIR/log4j2.properties" \
    -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
    >"$dir/kafka.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/kafka.pid"
  echo "$pid"
}

cmd_wait_started() {
  [[ $# -ge 3 ]] || die "usage: kafka.sh wait-started DIR PID PORT..."
  local dir="$1" pid="$2" deadline=$(( $(now) + START_TIMEOUT )) ready p
  shift 2
  while :; do
    ready=1
    grep -q "Kafka Server started" "$dir/kafka.log" 2>/dev/null || ready=0
    for p in "$@"; do
      port_open "$p" || ready=0
    done
    [[ $ready == 1 ]] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 60 "$dir/kafka.log" >&2
      die "the broker exited during start-up"
    fi
    if (( $(now) >= deadline )); then
      tail -n 60 "$dir/kafka.log" >&2
      cmd_stop "$dir"
      die "broker start-up timed out"
    fi
    sleep 0.2
  done
}

cmd_start() {
  [[ $# -eq 2 ]] || usage
  local dir port cport pid t0 cid
  check_port "$2"
  port="$2"; cport=$(( port + 1 ))
  dir="$(abs_dir "$1")"
  t0=$(now_ms)
  ensure_libs

  if pid="$(pid_of "$dir")"; then
    grep -qxF "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport" "$dir/server.properties" \
      || die "the broker of $dir already runs (pid $pid), but not on port $port: stop it first"
    log "broker of $dir already running (pid $pid); waiting until it is ready"
    wait_ready "$dir" "$port" "$pid"
    log "ready on 127.0.0.1:$port"
    return 0
  fi
  rm -f "$dir/kafka.pid"
  for p in "$port" "$cport"; do
    port_open "$p" && die "127.0.0.1:$p is already in use"
  done

  write_config "$dir" "$port"
  if [[ ! -f "$dir/data/meta.properties" ]]; then
    cid="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$cid" == -* ]] && cid="A${cid:1}"   # Kafka's own Uuid.randomUuid avoids a leading '-'
    kjava kafka.tools.StorageTool format -t "$cid" -c "$dir/server.properties" </dev/null \
      >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; die "kafka-storage format failed"; }
  fi

  # shellcheck disable=SC2086
  nohup "$JAVA" ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KDIR/log4j2.properties" \
    ${KAFKA_JAVA_OPTS:-} \
    -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
    >"$dir/kafka.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/kafka.pid"
  wait_ready "$dir" "$port" "$pid"
  log "broker ready on 127.0.0.1:$port (controller 127.0.0.1:$cport, pid $pid, log $dir/kafka.log) in $(since "$t0")"
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  local dir pid i
  [[ -d "$1" ]] || { log "no $1: nothing to stop"; return 0; }
  dir="$(cd "$1" && pwd -P)"
  if ! pid="$(pid_of "$dir")"; then
    rm -f "$dir/kafka.pid"
    log "broker of $dir is not running"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  kill -CONT "$pid" 2>/dev/null || true   # a frozen node (freeze) acts on the TERM only once thawed
  for (( i = 0; i < 100; i++ )); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "broker (pid $pid) still running after 20 s: KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for (( i = 0; i < 50; i++ )); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$dir/kafka.pid"
  log "broker of $dir stopped"
}

cmd_status() {
  [[ $# -eq 1 ]] || usage
  local pid
  if [[ -d "$1" ]] && pid="$(pid_of "$(cd "$1" && pwd -P)")"; then
    echo "running (pid $pid)"
  else
    echo "not running"
    return 1
  fi
}

cmd_create_topic() {
  [[ $# -ge 3 ]] || usage
  check_port "$1"
  ensure_libs
  local port="$1" topic="$2" layout
  shift 2
  if [[ "$1" == --replica-assignment ]]; then
    # The count and the replication factor are the assignment's own.
    [[ $# -ge 2 && "$2" =~ ^[0-9]+(:[0-9]+)*(,[0-9]+(:[0-9]+)*)*$ ]] || die "bad replica assignment '${2:-}'"
    layout=(--replica-assignment "$2")
    shift 2
  else
    [[ "$1" =~ ^[0-9]+$ && "$1" -ge 1 ]] || die "bad partition count '$1'"
    layout=(--partitions "$1")
    shift
    [[ " $* " == *" --replication-factor "* ]] || layout+=(--replication-factor 1)   # unless the caller gave its own
  fi
  kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$port" \
    --command-config "$KDIR/admin-client.properties" \
    --create --if-not-exists --topic "$topic" "${layout[@]}" "$@" </dev/null
}

cmd_add_partitions() {
  [[ $# -eq 3 ]] || usage
  check_port "$1"
  [[ "$3" =~ ^[0-9]+$ && "$3" -ge 1 ]] || die "bad partition count '$3'"
  ensure_libs
  kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$1" \
    --command-config "$KDIR/admin-client.properties" \
    --alter --topic "$2" --partitions "$3" </dev/null
}

cmd_describe_topic() {
  [[ $# -eq 2 ]] || usage
  ensure_libs
  local out
  out="$(kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "$1" \
    --command-config "$KDIR/admin-client.properties" --describe --topic "$2" </dev/null)" || return 1
  # "Topic: T  TopicId: …  Partition: 0  Leader: 2  Replicas: 2,3,1  Isr: 2,3,1  …"
  sed -n 's/.*Partition: *\([0-9]*\).*Leader: *\(-\{0,1\}[0-9]*\).*Isr: *\([0-9,]*\).*/\1\t\2\t\3/p' <<<"$out"
}

# --- three-broker cluster ---------------------------------------------------------------

# write_node_config DIR N P1 P2 P3 PROFILE: node N of the cluster whose PLAINTEXT ports are
# P1..P3 (controller ports P1+1..P3+1). PROFILE `tuned` adds the three timing lines below,
# `defaults` leaves them out (Kafka's defaults; everything else identical). The timing
# values are what the fault tests' goals are measured against (docs/reliability.md,
# "A Kafka cluster under faults"):
# - broker.session.timeout.ms=6000 (default 9000), broker.heartbeat.interval.ms=1000
#   (default 2000): the controller fences a crashed broker, and moves its leaderships,
#   6 s after its last heartbeat.
# - replica.lag.time.max.ms=5000 (default 30000): a follower that stopped fetching leaves
#   the ISR after 5 s, so acks=all produces stop waiting for it.
# - Controlled shutdown is what KRaft does on SIGTERM: the broker asks the controller to
#   move its leaderships away and stops only then.
write_node_config() {
  local dir="$1" n="$2" ports=("$3" "$4" "$5") profile="$6" voters="" i tuned=""
  for i in 1 2 3; do
    voters+="${voters:+,}$i@127.0.0.1:$(( ports[i-1] + 1 ))"
  done
  local port="${ports[n-1]}" cport=$(( ports[n-1] + 1 ))
  check_profile "$profile"
  if [[ "$profile" == tuned ]]; then
    tuned=$'broker.session.timeout.ms=6000\nbroker.heartbeat.interval.ms=1000\nreplica.lag.time.max.ms=5000\n'
  fi
  cat >"$dir/server.properties" <<EOF
# written by scripts/kafka.sh start-cluster: node $n of a three-node KRaft test cluster
# (profile $profile)
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
$(topic_defaults "$dir" 3 2)
unclean.leader.election.enable=false
${tuned}num.io.threads=2
num.replica.fetchers=1
log.retention.hours=168
EOF
}

node_dir() { echo "$1/node$2"; }

check_node() { [[ "$1" =~ ^[123]$ ]] || die "bad node '$1' (1, 2 or 3)"; }

cluster_dir() { # DIR -> its absolute path, if it holds a cluster
  [[ -f "$1/cluster.ports" ]] || die "$1 holds no cluster (start-cluster first)"
  (cd "$1" && pwd -P)
}

cluster_profile() { # DIR -> the profile start-cluster recorded (tuned when none)
  if [[ -f "$1/cluster.profile" ]]; then cat "$1/cluster.profile"; else echo tuned; fi
}

check_profile() {
  [[ "$1" == tuned || "$1" == defaults ]] || die "bad cluster profile '$1' (tuned or defaults)"
}

launch_node() { # DIR N P1 P2 P3: starts the JVM, does not wait
  local dir="$1" n="$2" ndir profile
  ndir="$(node_dir "$dir" "$n")"
  profile="$(cluster_profile "$dir")"
  mkdir -p "$ndir"
  write_node_config "$ndir" "$n" "$3" "$4" "$5" "$profile"
  if [[ ! -f "$ndir/data/meta.properties" ]]; then
    kjava kafka.tools.StorageTool format -t "$(cat "$dir/cluster.id")" -c "$ndir/server.properties" \
      </dev/null >"$ndir/format.log" 2>&1 \
      || { cat "$ndir/format.log" >&2; die "kafka-storage format failed (node $n)"; }
  fi
  # shellcheck disable=SC2086
  nohup "$JAVA" ${KAFKA_CLUSTER_HEAP_OPTS:--Xms128m -Xmx384m} \
    -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KDIR/log4j2.properties" \
    ${KAFKA_JAVA_OPTS:-} \
    -cp "$LIBS/*" kafka.Kafka "$ndir/server.properties" \
    >>"$ndir/kafka.log" 2>&1 </dev/null &
  echo $! >"$ndir/kafka.pid"
}

cmd_start_cluster() {
  [[ $# -eq 4 ]] || usage
  local dir t0 p q n cid ports=("$2" "$3" "$4") profile="${KAFKA_CLUSTER_PROFILE:-tuned}"
  for p in "${ports[@]}"; do check_port "$p"; done
  check_profile "$profile"
  dir="$(abs_dir "$1")"
  t0=$(now_ms)
  ensure_libs
  for n in 1 2 3; do
    if pid_of "$(node_dir "$dir" "$n")" >/dev/null; then
      die "node $n of $dir already runs: stop-cluster first"
    fi
  done
  for p in "${ports[@]}"; do
    for q in "$p" $(( p + 1 )); do
      if port_open "$q"; then die "127.0.0.1:$q is already in use"; fi
    done
  done
  if [[ ! -f "$dir/cluster.id" ]]; then
    cid="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$cid" == -* ]] && cid="A${cid:1}"
    echo "$cid" >"$dir/cluster.id"
  fi
  echo "${ports[*]}" >"$dir/cluster.ports"
  echo "$profile" >"$dir/cluster.profile"
  for n in 1 2 3; do launch_node "$dir" "$n" "${ports[@]}"; done
  for n in 1 2 3; do
    wait_ready "$(node_dir "$dir" "$n")" "${ports[n-1]}" "$(cat "$(node_dir "$dir" "$n")/kafka.pid")"
  done
  log "cluster ($profile) ready on 127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]} (state in $dir) in $(since "$t0")"
}

cmd_stop_cluster() {
  [[ $# -eq 1 ]] || usage
  [[ -d "$1" ]] || { log "no $1: nothing to stop"; return 0; }
  local n pid pids=()
  # All at once: one by one, the last nodes would wait for a quorum that is gone.
  for n in 1 2 3; do
    if [[ -d "$1/node$n" ]]; then
      cmd_stop "$1/node$n" &
      pids+=($!)
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || true; done
}

cmd_kill_node() {
  [[ $# -eq 2 ]] || usage
  check_node "$2"
  local ndir pid
  ndir="$(cluster_dir "$1")/node$2"
  pid="$(pid_of "$ndir")" || die "node $2 of $1 is not running"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$ndir/kafka.pid"
  log "node $2 killed (pid $pid)"
}

cmd_stop_node() {
  [[ $# -eq 2 ]] || usage
  check_node "$2"
  cmd_stop "$(cluster_dir "$1")/node$2"
}

# freeze/thaw DIR N: SIGSTOP/SIGCONT of node N's JVM. A frozen node keeps its sockets
# open and answers nothing: its peers see it only by their own timeouts.
cmd_signal_node() { # SIGNAL DIR N
  [[ $# -eq 3 ]] || usage
  check_node "$3"
  local pid
  pid="$(pid_of "$(cluster_dir "$2")/node$3")" || die "node $3 of $2 is not running"
  kill "-$1" "$pid"
  log "node $3 (pid $pid) sent SIG$1"
}

cmd_node_pid() {
  [[ $# -eq 2 ]] || usage
  check_node "$2"
  pid_of "$(cluster_dir "$1")/node$2" || die "node $2 of $1 is not running"
}

cmd_start_node() {
  [[ $# -eq 2 ]] || usage
  relaunch_node "$1" "$2" wait
}

cmd_launch_node() {
  [[ $# -eq 2 ]] || usage
  relaunch_node "$1" "$2" no-wait
}

relaunch_node() { # DIR N wait|no-wait: node N of a cluster again (same ports, data, profile)
  check_node "$2"
  local dir ndir ports t0
  dir="$(cluster_dir "$1")"
  ndir="$(node_dir "$dir" "$2")"
  t0=$(now_ms)
  ensure_libs
  read -r -a ports <"$dir/cluster.ports"
  if pid_of "$ndir" >/dev/null; then die "node $2 of $dir already runs"; fi
  launch_node "$dir" "$2" "${ports[@]}"
  if [[ "$3" == wait ]]; then
    wait_ready "$ndir" "${ports[$2-1]}" "$(cat "$ndir/kafka.pid")"
    log "node $2 ready on 127.0.0.1:${ports[$2-1]} in $(since "$t0")"
  else
    log "node $2 launched (pid $(cat "$ndir/kafka.pid"), not waiting until it is ready)"
  fi
}

cmd_alter_topic_config() {
  [[ $# -eq 3 ]] || usage
  check_port "$1"
  ensure_libs
  kjava org.apache.kafka.tools.ConfigCommand --bootstrap-server "127.0.0.1:$1" \
    --command-config "$KDIR/admin-client.properties" \
    --alter --entity-type topics --entity-name "$2" --add-config "$3" </dev/null
}

cmd_alter_client_quota() {
  [[ $# -eq 3 ]] || usage
  check_port "$1"
  ensure_libs
  kjava org.apache.kafka.tools.ConfigCommand --bootstrap-server "127.0.0.1:$1" \
    --command-config "$KDIR/admin-client.properties" \
    --alter --entity-type clients --entity-name "$2" --add-config "$3" </dev/null
}

cmd_list_topics() {
  [[ $# -eq 1 ]] || usage
  check_port "$1"
  ensure_libs
  kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$1" \
    --command-config "$KDIR/admin-client.properties" --list </dev/null
}

cmd_partition() {
  ensure_libs
  kjava "$KDIR/Partition.java" "$@"
}

cmd_produce() {
  [[ $# -eq 2 || ( $# -eq 3 && "$3" == --headers ) ]] || usage
  check_port "$1"
  ensure_libs
  local hdr=()
  if [[ $# -eq 3 ]]; then
    hdr=(--reader-property parse.headers=true --reader-property headers.delimiter=$'\t'
         --reader-property 'headers.separator=,' --reader-property headers.key.separator=:)
  fi
  kjava org.apache.kafka.tools.ConsoleProducer --bootstrap-server "127.0.0.1:$1" --topic "$2" \
    --reader-property parse.key=true --reader-property key.separator=$'\t' "${hdr[@]}" \
    --command-property acks=all --command-property linger.ms=0 --sync
}

cmd_consume() {
  [[ $# -ge 3 && $# -le 5 ]] || usage
  check_port "$1"
  ensure_libs
  kjava "$KDIR/DumpTopic.java" "127.0.0.1:$1" "${@:2}" </dev/null
}

# exec: a SIGTERM to this script's pid reaches the JVM (its shutdown hook flushes the files).
cmd_plain_producer() {
  [[ $# -ge 6 ]] || usage
  [[ "$3" =~ ^[0-9]+$ && "$3" -ge 1 ]] || die "bad rate '$3'"
  ensure_libs
  exec "${KJAVA[@]}" "$KDIR/PlainProducer.java" "$@" </dev/null
}

main() {
  [[ $# -ge 1 ]] || usage
  local cmd="$1"
  shift
  case "$cmd" in
    fetch) [[ $# -eq 0 ]] || usage; check_java; cmd_fetch; echo "$LIBS" ;;
    start) cmd_start "$@" ;;
    topic-defaults) topic_defaults "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    create-topic) cmd_create_topic "$@" ;;
    alter-topic-config) cmd_alter_topic_config "$@" ;;
    alter-client-quota) cmd_alter_client_quota "$@" ;;
    list-topics) cmd_list_topics "$@" ;;
    partition) cmd_partition "$@" ;;
    produce) cmd_produce "$@" ;;
    consume) cmd_consume "$@" ;;
    add-partitions) cmd_add_partitions "$@" ;;
    describe-topic) cmd_describe_topic "$@" ;;
    start-cluster) cmd_start_cluster "$@" ;;
    stop-cluster) cmd_stop_cluster "$@" ;;
    kill) cmd_kill_node "$@" ;;
    stop-node) cmd_stop_node "$@" ;;
    start-node) cmd_start_node "$@" ;;
    launch-node) cmd_launch_node "$@" ;;
    freeze) cmd_signal_node STOP "$@" ;;
    thaw) cmd_signal_node CONT "$@" ;;
    node-pid) cmd_node_pid "$@" ;;
    plain-producer) cmd_plain_producer "$@" ;;
    classpath) [[ $# -eq 0 ]] || usage; ensure_libs; echo "$LIBS/*" ;;
    launch-broker) cmd_launch_broker "$@" ;;
    wait-started) cmd_wait_started "$@" ;;
    -h|--help|help) usage 0 ;;
    *) log "unknown command '$cmd'"; usage ;;
  esac
}

main "$@"
