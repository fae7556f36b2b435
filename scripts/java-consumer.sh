#!/usr/bin/env bash
# The reference Java consumer of pin.crm.booking-expired.v1 (consumers/java): builds its fat jar
# when it is missing or older than its sources (pom.xml, src/, proto/), then runs it.
#
#   scripts/java-consumer.sh [CONSUMER ARGS...]     build if needed, then
#                                                   java -jar consumers/java/target/booking-expired-consumer.jar ARGS
#                                                   (see --help; e.g. --bootstrap-servers 127.0.0.1:9092 --json)
#   scripts/java-consumer.sh --build                (re)build now, running the unit tests
#   scripts/java-consumer.sh --sample-producer ARGS
#                                                   the test-scope SampleProducer (consumers/java/src/test):
#                                                   writes sample events, e.g. --bootstrap-servers H:P --count 6
#   scripts/java-consumer.sh --jar                  build if needed, print the jar's path
#
# Environment: MVN (default mvn; may carry options, e.g. MVN="mvn -s settings.xml"), JAVA_HOME or
# JAVA, JAVA_CONSUMER_OPTS (JVM options, default -XX:+UseSerialGC). Maven keeps its repository
# where it normally does (~/.m2/repository). Needs a JDK 17+ and Maven 3.6.3+; protoc comes from
# Maven Central.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PROJ="$ROOT/consumers/java"
JAR="$PROJ/target/booking-expired-consumer.jar"
PRODUCER_CLASS="$PROJ/target/test-classes/pin/crm/consumer/SampleProducer.class"

if [[ -n "${JAVA:-}" ]]; then
  :
elif [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA=java
fi
read -r -a MVN <<<"${MVN:-mvn}"
read -r -a JOPTS <<<"${JAVA_CONSUMER_OPTS:--XX:+UseSerialGC}"

log() { echo "java-consumer.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

outdated() {
  [[ -f "$JAR" && -f "$PRODUCER_CLASS" ]] || return 0
  [[ -n "$(find "$PROJ/pom.xml" "$PROJ/src" "$ROOT/proto" -newer "$JAR" -print -quit 2>/dev/null)" ]]
}

build() { # force|if-outdated [extra mvn args...]
  local mode="$1"
  shift
  command -v "${MVN[0]}" >/dev/null 2>&1 || die "mvn not found (needed to build $JAR)"
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (set JAVA_HOME or JAVA)"
  # one build at a time (parallel CI steps); a second caller then finds the jar fresh
  exec 9>"$PROJ/.build.lock"
  flock 9
  if [[ "$mode" == force ]] || outdated; then
    local t0 ms log_file
    log_file="$(mktemp "${TMPDIR:-/tmp}/java-consumer-build.XXXXXX")"
    t0=$(date +%s%3N)
    log "building $JAR ..."
    # clean: a deleted source file must not live on in the jar
    if ! "${MVN[@]}" -B -q -f "$PROJ/pom.xml" clean package "$@" </dev/null >"$log_file" 2>&1; then
      cat "$log_file" >&2
      die "maven build failed (log above, also in $log_file)"
    fi
    [[ -f "$JAR" ]] || die "the build did not produce $JAR"
    if [[ "$mode" == force ]]; then
      grep -h '^Tests run:' "$PROJ"/target/surefire-reports/*.txt >&2 2>/dev/null || true
    fi
    rm -f "$log_file"
    ms=$(( $(date +%s%3N) - t0 ))
    log "built in $(( ms / 1000 )).$(( ms % 1000 / 100 )) s"
  fi
  exec 9>&-
}

case "${1:-}" in
  --build)
    shift
    [[ $# -eq 0 ]] || die "--build takes no arguments"
    build force
    echo "$JAR"
    ;;
  --jar)
    build if-outdated -DskipTests
    echo "$JAR"
    ;;
  --sample-producer)
    shift
    build if-outdated -DskipTests
    exec "$JAVA" "${JOPTS[@]}" -cp "$PROJ/target/test-classes:$JAR" pin.crm.consumer.SampleProducer "$@"
    ;;
  *)
    build if-outdated -DskipTests
    exec "$JAVA" "${JOPTS[@]}" -jar "$JAR" "$@"
    ;;
esac
