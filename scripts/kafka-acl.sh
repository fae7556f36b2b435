#!/usr/bin/env bash
# A single-node Apache Kafka 4.4.0 broker with an authorizer, for tests
# (tests/it/kafka_acl.rs), from the same Maven jars as scripts/kafka.sh:
# KRaft's StandardAuthorizer, SASL/PLAIN users, no ACL = no access.
#
#   scripts/kafka-acl.sh start DIR PORT WORKER_PORT
#       listeners on 127.0.0.1:
#         PORT     PLAINTEXT       inter-broker; principal User:ANONYMOUS (a super
#                                  user: the broker's own traffic, and the tests
#                                  read topics back here)
#         PORT+1   CONTROLLER      (User:ANONYMOUS, a super user)
#         PORT+2   WORKER          SASL_PLAINTEXT, PLAIN; advertised as
#                                  127.0.0.1:WORKER_PORT, where the test puts a
#                                  proxy in front of it (every connection of the
#                                  worker goes through that port)
#         PORT+3   ADMIN           SASL_PLAINTEXT, PLAIN, advertised as itself:
#                                  the admin tools, as the super user `admin`
#       users (PLAIN): admin (super user), and $KAFKA_ACL_USER, who gets
#       nothing until ACLs grant it. Returns once the broker is started and
#       every listener accepts connections.
#   scripts/kafka-acl.sh create-topic DIR TOPIC PARTITIONS
#       as `admin` (replication factor 1)
#   scripts/kafka-acl.sh allow DIR PRINCIPAL OPERATION TOPIC
#       adds the ACL "PRINCIPAL may OPERATION on TOPIC" (AclCommand, as
#       `admin`), e.g. `allow DIR User:worker Describe my-topic`
#   scripts/kafka-acl.sh acls DIR TOPIC   lists the ACLs of TOPIC
#   scripts/kafka-acl.sh stop DIR
#
# Environment: KAFKA_ACL_USER (default worker), KAFKA_ACL_PASSWORD (default
# worker-secret), KAFKA_ACL_ADMIN_PASSWORD (default admin-secret), and those
# of scripts/kafka.sh (KAFKA_HEAP_OPTS, KAFKA_START_TIMEOUT, JAVA, ...).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_SH="$HERE/kafka.sh"
user="${KAFKA_ACL_USER:-worker}"
password="${KAFKA_ACL_PASSWORD:-worker-secret}"
admin_password="${KAFKA_ACL_ADMIN_PASSWORD:-admin-secret}"

log() { echo "kafka-acl.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

java_bin() { echo "${JAVA:-${JAVA_HOME:+$JAVA_HOME/bin/}java}"; }

write_config() { # DIR PORT WORKER_PORT
  local dir="$1" p="$2" worker_port="$3"
  local plain="org.apache.kafka.common.security.plain.PlainLoginModule required"
  local users="user_admin=\"$admin_password\" user_$user=\"$password\";"
  cat >"$dir/server.properties" <<EOF
# written by scripts/kafka-acl.sh start: single-node KRaft test broker with an authorizer
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$((p + 1))
listeners=PLAINTEXT://127.0.0.1:$p,CONTROLLER://127.0.0.1:$((p + 1)),WORKER://127.0.0.1:$((p + 2)),ADMIN://127.0.0.1:$((p + 3))
advertised.listeners=PLAINTEXT://127.0.0.1:$p,WORKER://127.0.0.1:$worker_port,ADMIN://127.0.0.1:$((p + 3))
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,WORKER:SASL_PLAINTEXT,ADMIN:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.worker.plain.sasl.jaas.config=$plain $users
listener.name.admin.plain.sasl.jaas.config=$plain $users
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false
$(bash "$KAFKA_SH" topic-defaults "$dir" 1 1)
num.io.threads=4
EOF
  cat >"$dir/admin.properties" <<EOF
$(grep -v '^#' "$HERE/kafka/admin-client.properties")
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=$plain username="admin" password="$admin_password";
EOF
  echo "$p" >"$dir/port"
}

port_of() { # DIR -> the PLAINTEXT port start wrote
  [[ -f "$1/port" ]] || die "$1 holds no broker started by kafka-acl.sh"
  cat "$1/port"
}

admin_tool() { # DIR CLASS ARGS...: a Kafka tool as `admin` on the ADMIN listener
  local dir="$1" class="$2" port
  shift 2
  port="$(port_of "$dir")"
  "$(java_bin)" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dlog4j2.configurationFile="$HERE/kafka/tools-log4j2.properties" -Dlog4j2.shutdownHookEnabled=false \
    -cp "$(bash "$KAFKA_SH" classpath)" "$class" \
    --bootstrap-server "127.0.0.1:$((port + 3))" --command-config "$dir/admin.properties" "$@" </dev/null
}

cmd_start() {
  [[ $# -eq 3 && "$2" =~ ^[0-9]+$ && "$3" =~ ^[0-9]+$ ]] || die "usage: kafka-acl.sh start DIR PORT WORKER_PORT"
  local dir port pid t0
  mkdir -p "$1"
  dir="$(cd "$1" && pwd -P)"
  port="$2"
  t0=$(date +%s%3N)
  write_config "$dir" "$port" "$3"
  pid="$(bash "$KAFKA_SH" launch-broker "$dir")"
  # Ready: registered ("Kafka Server started") and every listener accepts TCP.
  bash "$KAFKA_SH" wait-started "$dir" "$pid" "$port" $((port + 2)) $((port + 3))
  log "broker with an authorizer ready on 127.0.0.1:$port-$((port + 3)), worker listener advertised as 127.0.0.1:$3 (pid $pid) in $(( $(date +%s%3N) - t0 )) ms"
}

cmd_create_topic() {
  [[ $# -eq 3 && "$3" =~ ^[0-9]+$ ]] || die "usage: kafka-acl.sh create-topic DIR TOPIC PARTITIONS"
  admin_tool "$1" org.apache.kafka.tools.TopicCommand \
    --create --if-not-exists --topic "$2" --partitions "$3" --replication-factor 1
}

cmd_allow() {
  [[ $# -eq 4 ]] || die "usage: kafka-acl.sh allow DIR PRINCIPAL OPERATION TOPIC"
  admin_tool "$1" org.apache.kafka.tools.AclCommand \
    --add --allow-principal "$2" --operation "$3" --topic "$4"
}

cmd_acls() {
  [[ $# -eq 2 ]] || die "usage: kafka-acl.sh acls DIR TOPIC"
  admin_tool "$1" org.apache.kafka.tools.AclCommand --list --topic "$2"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  create-topic) shift; cmd_create_topic "$@" ;;
  allow) shift; cmd_allow "$@" ;;
  acls) shift; cmd_acls "$@" ;;
  stop) shift; bash "$KAFKA_SH" stop "$@" ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
