#!/usr/bin/env bash
# Certificates for a TLS-only test PostgreSQL (tests/it/pg_tls.rs), made
# with openssl, and the pg_hba.conf that refuses plaintext over TCP.
#
#   scripts/pg-tls-certs.sh DIR [CLIENT_USER]
#       writes into DIR/tls (EC P-256 keys, SHA-256 signatures):
#         ca.crt ca.key               the test CA
#         other-ca.crt                a CA that signed nothing here (wrong CA)
#         server.crt server.key       signed by ca, SAN DNS:localhost, IP:127.0.0.1
#         wrong-name.crt .key         signed by ca, SAN DNS:db.example.invalid only
#         expired.crt expired.key     signed by ca, SAN localhost/127.0.0.1, expired in 2020
#         client.crt client.key       client certificate, CN=CLIENT_USER (default tlsuser)
#         client2.crt client2.key     a renewed one: CN=CLIENT_USER, O=rotated, new key (rotation)
#       and DIR/pg_hba.conf: Unix socket trusted (the test's admin), TCP only
#       with TLS and SCRAM; CLIENT_USER must also present a client
#       certificate (clientcert=verify-full); plaintext TCP is rejected.
#       Prints the `postgres -c` options for scripts/postgres.sh start.
set -euo pipefail

dir="${1:?usage: pg-tls-certs.sh DIR [CLIENT_USER]}"
client_user="${2:-tlsuser}"
tls="$dir/tls"
mkdir -p "$tls"
cd "$tls"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# sign NAME SUBJECT EXTENSIONS: a key, a CSR and a certificate signed by ca (1 year).
sign() {
  local name="$1" subject="$2" ext="$3"
  key "$name.key"
  openssl req -new -key "$name.key" -subj "$subject" -out "$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days 365 -sha256 -extfile "$name.ext" -out "$name.crt" 2>/dev/null
}

server_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth'
client_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth'

for ca in ca other-ca; do
  key "$ca.key"
  openssl req -x509 -new -key "$ca.key" -sha256 -days 365 -subj "/CN=booking-expiration test $ca" \
    -out "$ca.crt" 2>/dev/null
done
sign server "/CN=localhost" "$server_ext
subjectAltName=DNS:localhost,IP:127.0.0.1"
sign wrong-name "/CN=db.example.invalid" "$server_ext
subjectAltName=DNS:db.example.invalid"
sign client "/CN=$client_user" "$client_ext"
sign client2 "/CN=$client_user/O=rotated" "$client_ext"

# Expired: `openssl x509` (3.0) cannot back-date, `openssl ca` can.
key expired.key
openssl req -new -key expired.key -subj "/CN=localhost" -out expired.csr 2>/dev/null
mkdir -p ca-db
: >ca-db/index.txt
echo 1000 >ca-db/serial
cat >ca-db/ca.cnf <<EOF
[ ca ]
default_ca = test_ca
[ test_ca ]
database = $tls/ca-db/index.txt
new_certs_dir = $tls/ca-db
serial = $tls/ca-db/serial
default_md = sha256
policy = any
x509_extensions = expired_ext
[ any ]
commonName = supplied
[ expired_ext ]
$server_ext
subjectAltName=DNS:localhost,IP:127.0.0.1
EOF
openssl ca -batch -config ca-db/ca.cnf -cert ca.crt -keyfile ca.key -in expired.csr \
  -startdate 20200101000000Z -enddate 20200102000000Z -notext -out expired.crt 2>/dev/null

chmod 600 ./*.key
cat >"$dir/pg_hba.conf" <<EOF
local     all all                    trust
hostssl   all $client_user 127.0.0.1/32 scram-sha-256 clientcert=verify-full
hostssl   all all          127.0.0.1/32 scram-sha-256
hostnossl all all          127.0.0.1/32 reject
host      all all          ::1/128      reject
EOF
echo "-c ssl=on -c ssl_ca_file=$tls/ca.crt -c hba_file=$dir/pg_hba.conf"
