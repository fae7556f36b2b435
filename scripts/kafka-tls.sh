#!/usr/bin/env bash
# A single-node Apache Kafka 4.4.0 broker with TLS listeners for tests
# (tests/it/kafka_tls.rs), from the same Maven jars as scripts/kafka.sh.
# Certificates are made with openssl by scripts/pg-tls-certs.sh (CA, server
# for localhost/127.0.0.1, wrong host name, expired, client) plus a client
# certificate signed by another CA; the broker reads them as PEM key and
# trust stores (ssl.keystore.type=PEM), so no keytool is needed.
#
#   scripts/kafka-tls.sh start DIR PORT
#       listeners on 127.0.0.1, advertised as localhost:
#         PORT     PLAINTEXT  (inter-broker, admin tools)
#         PORT+1   CONTROLLER
#         PORT+2   SSL        server.crt
#         PORT+3   SSL        server.crt, client certificate required (ca.crt)
#         PORT+4   SASL_SSL   server.crt, SCRAM-SHA-512 user $KAFKA_TLS_USER
#         PORT+5   SSL        wrong-name.crt (SAN db.example.invalid only)
#         PORT+6   SSL        expired.crt
#       certificates in DIR/tls (see scripts/pg-tls-certs.sh) and
#       stranger.crt/.key: a client certificate signed by other-ca.
#       The SCRAM user is created when the storage is formatted
#       (StorageTool --add-scram). Returns once the broker serves metadata.
#   scripts/kafka-tls.sh stop DIR
#
# Environment: KAFKA_TLS_OWNER_PID (stop the broker when that process ends:
# a test binary that shares one broker among its tests), KAFKA_TLS_USER (default alice), KAFKA_TLS_PASSWORD (default
# alice-secret), and those of scripts/kafka.sh (KAFKA_HEAP_OPTS, ...).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_SH="$HERE/kafka.sh"
user="${KAFKA_TLS_USER:-alice}"
password="${KAFKA_TLS_PASSWORD:-alice-secret}"

log() { echo "kafka-tls.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

certs() { # DIR
  local tls="$1/tls"
  bash "$HERE/pg-tls-certs.sh" "$1" >/dev/null
  (
    cd "$tls"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out stranger.key 2>/dev/null
    openssl req -new -key stranger.key -subj "/CN=stranger" -out stranger.csr 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' \
      >stranger.ext
    openssl x509 -req -in stranger.csr -CA other-ca.crt -CAkey other-ca.key -CAcreateserial \
      -days 365 -sha256 -extfile stranger.ext -out stranger.crt 2>/dev/null
    # The broker's PEM key stores: PKCS#8 key, then the certificate.
    for name in server wrong-name expired; do
      openssl pkcs8 -topk8 -nocrypt -in "$name.key" -out "$name.pk8" 2>/dev/null
      cat "$name.pk8" "$name.crt" >"$name.keystore.pem"
    done
    chmod 600 ./*.key ./*.pk8 ./*.keystore.pem
  )
}

write_config() { # DIR PORT
  local dir="$1" p="$2" tls="$1/tls"
  local ssl=$((p + 2)) mtls=$((p + 3)) sasl=$((p + 4)) wrong=$((p + 5)) expired=$((p + 6))
  cat >"$dir/server.properties" <<EOF
# written by scripts/kafka-tls.sh start: single-node KRaft test broker with TLS listeners
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$((p + 1))
listeners=PLAINTEXT://127.0.0.1:$p,CONTROLLER://127.0.0.1:$((p + 1)),SSL://127.0.0.1:$ssl,MTLS://127.0.0.1:$mtls,SASL_SSL://127.0.0.1:$sasl,WRONGNAME://127.0.0.1:$wrong,EXPIRED://127.0.0.1:$expired
advertised.listeners=PLAINTEXT://127.0.0.1:$p,SSL://localhost:$ssl,MTLS://localhost:$mtls,SASL_SSL://localhost:$sasl,WRONGNAME://localhost:$wrong,EXPIRED://localhost:$expired
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL,WRONGNAME:SSL,EXPIRED:SSL
ssl.keystore.type=PEM
ssl.keystore.location=$tls/server.keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.crt
ssl.client.auth=none
listener.name.mtls.ssl.client.auth=required
listener.name.wrongname.ssl.keystore.location=$tls/wrong-name.keystore.pem
listener.name.expired.ssl.keystore.location=$tls/expired.keystore.pem
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
$(bash "$KAFKA_SH" topic-defaults "$dir" 1 1)
num.io.threads=4
EOF
}

cmd_start() {
  [[ $# -eq 2 && "$2" =~ ^[0-9]+$ ]] || die "usage: kafka-tls.sh start DIR PORT"
  local dir port pid t0
  mkdir -p "$1"
  dir="$(cd "$1" && pwd -P)"
  port="$2"
  t0=$(date +%s%3N)
  [[ -f "$dir/tls/stranger.crt" ]] || certs "$dir"
  write_config "$dir" "$port"
  pid="$(KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}" bash "$KAFKA_SH" launch-broker "$dir" \
    --add-scram "SCRAM-SHA-512=[name=$user,password=$password]")"
  # Ready: every listener accepts TCP and the broker's registration is done.
  bash "$KAFKA_SH" wait-started "$dir" "$pid" $((port + 6))
  if [[ -n "${KAFKA_TLS_OWNER_PID:-}" ]]; then
    # A watcher, detached from the caller, that stops the broker when its owner is gone.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; bash "$2" stop "$3" >/dev/null 2>&1' \
      _ "$KAFKA_TLS_OWNER_PID" "$KAFKA_SH" "$dir" </dev/null >/dev/null 2>&1 &
  fi
  log "broker with TLS listeners ready on 127.0.0.1:$port-$((port + 6)) (pid $pid) in $(( $(date +%s%3N) - t0 )) ms"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; bash "$KAFKA_SH" stop "$@" ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
