#!/usr/bin/env bash
# Offline checks of deploy/kubernetes/ (no cluster, no Docker engine):
#   1. kustomize build of the base and of the example overlay;
#   2. tools/k8s-validate on both renderings: a strict decode of every object into
#      the official API types (k8s.io/api; prometheus-operator's monitoring/v1 for
#      ServiceMonitor and PrometheusRule), then semantic checks against the
#      worker's sources (probe paths, grace > stop grace, securityContext,
#      memory vs the measured RSS, env names, migrate's session past a pooler,
#      Kafka security and OTLP settings, certificate paths, scrape job);
#   3. go test of tools/k8s-validate: it breaks the rendered overlay one way at a
#      time (an unknown field, a short grace, a loopback METRICS_ADDR, ...) and
#      expects each to be caught.
# The PrometheusRule's freshness (scripts/gen-prometheus-rule.py --check) is a
# separate step of scripts/check-deploy.sh.
#
# Needs Go (>= 1.26, on PATH or /usr/local/go/bin). kustomize is built once from
# the Go module proxy into $TOOLS_DIR (default /var/cache/booking-expiration/tools);
# Go's module and build caches live in /var/cache/booking-expiration/go unless
# GOMODCACHE/GOCACHE are set. Exit status 0 = every check passed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
KUSTOMIZE_VERSION=v5.8.2 # its go.mod asks for Go 1.26.0; v5.8.3 needs 1.27
TOOLS="${TOOLS_DIR:-/var/cache/booking-expiration/tools}"
GO_CACHE_ROOT=/var/cache/booking-expiration/go
[[ -w /var/cache ]] || GO_CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/booking-expiration/go"
export GOMODCACHE="${GOMODCACHE:-$GO_CACHE_ROOT/mod}" GOCACHE="${GOCACHE:-$GO_CACHE_ROOT/build}"
# Never fetch another Go toolchain; module versions are pinned by go.mod/go.sum.
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly"
PATH="$PATH:/usr/local/go/bin"

log() { echo "check-kubernetes: $*" >&2; }

command -v go >/dev/null 2>&1 || { log "go not found (needs Go >= 1.26)"; exit 1; }

KUSTOMIZE="$TOOLS/kustomize-$KUSTOMIZE_VERSION/kustomize"
if [[ ! -x "$KUSTOMIZE" ]]; then
  log "building kustomize $KUSTOMIZE_VERSION from the Go module proxy (once, ~2 min on 2 cores)"
  started=$SECONDS
  mkdir -p "$(dirname "$KUSTOMIZE")"
  GOBIN="$(dirname "$KUSTOMIZE")" go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
  log "kustomize built in $((SECONDS - started)) s"
fi
echo "kustomize $("$KUSTOMIZE" version)"

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

unformatted="$(gofmt -l tools/k8s-validate)"
if [[ -n "$unformatted" ]]; then
  log "not gofmt-formatted: $unformatted"
  exit 1
fi
started=$SECONDS
(cd tools/k8s-validate && go vet ./... && go build -o "$OUT/k8s-validate" .)
log "tools/k8s-validate built in $((SECONDS - started)) s"

"$KUSTOMIZE" build deploy/kubernetes/base >"$OUT/base.yaml"
"$KUSTOMIZE" build deploy/kubernetes/overlays/example >"$OUT/example.yaml"
echo "kustomize build: base $(grep -c '^kind:' "$OUT/base.yaml") objects, overlays/example $(grep -c '^kind:' "$OUT/example.yaml") objects"

"$OUT/k8s-validate" -repo "$ROOT" "$OUT/base.yaml" "$OUT/example.yaml"

cd tools/k8s-validate
K8S_VALIDATE_RENDERED="$OUT/example.yaml" K8S_VALIDATE_REPO="$ROOT" go test -count=1 ./...
