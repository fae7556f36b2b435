#!/usr/bin/env bash
# A minimal OpenTelemetry Collector (OTLP receiver + file exporter,
# scripts/otelcol/main.go, modules pinned in scripts/otelcol/go.mod and
# go.sum) for the tracing tests. Built with Go from the Go module proxy when
# missing, cached outside the clone (the first build takes minutes).
#
#   bash scripts/otelcol.sh        build if needed, print the binary's path
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$HERE/otelcol"
VERSION=0.161.0
cache="${BOOKING_EXPIRATION_CACHE:-$HOME/.cache/booking-expiration}"
# The sources' hash names the build, so a change to them rebuilds.
hash="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-12)"
bin="$cache/otelcol-$VERSION-$hash/otelcol"
if [[ ! -x "$bin" ]]; then
  command -v go >/dev/null || { echo "otelcol.sh: needs Go (1.25+) to build the collector" >&2; exit 1; }
  echo "otelcol.sh: building the OpenTelemetry Collector $VERSION (first time: several minutes)" >&2
  mkdir -p "$(dirname "$bin")"
  start=$SECONDS
  (cd "$SRC" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$bin.tmp" .)
  mv "$bin.tmp" "$bin"
  echo "otelcol.sh: built in $((SECONDS - start)) s: $bin" >&2
fi
echo "$bin"
