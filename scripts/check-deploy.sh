#!/usr/bin/env bash
# Checks the operator-facing files: Prometheus alerts (syntax and unit tests),
# the Prometheus config, the Grafana dashboard and provisioning, the
# runbook links of the alerts, and the Kubernetes manifests (deploy/kubernetes:
# kustomize build and a strict offline validation, scripts/check-kubernetes.sh).
#
#   scripts/check-deploy.sh            all checks
#   CHECK_DEPLOY_LIVE=0 scripts/check-deploy.sh
#                                      without the live check: it starts a real Prometheus
#                                      on 127.0.0.1 for ~15 s and runs every dashboard query
#
# Needs promtool. It is installed from Debian's `prometheus` package when it is
# missing, as root (that package also ships the `prometheus` binary the live check
# uses). Also needs python3 (PyYAML for the PrometheusRule generator, installed
# with pip when missing) and Go >= 1.26 for the Kubernetes checks.
# Exit status 0 = every check passed. The last line is "check-deploy: N passed, N failed".
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "check-deploy: $*" >&2; }

ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then
    return 0
  fi
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "promtool not found; install Debian's 'prometheus' package (apt-get install prometheus)"
    exit 1
  fi
  log "promtool not found; installing Debian's 'prometheus' package"
  local started=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  log "installed in $((SECONDS - started)) s"
}

passed=0
failed=0
failures=()

# check NAME COMMAND...: runs COMMAND, records the result, and goes on.
check() {
  local name=$1
  shift
  echo "== $name"
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "-- FAILED: $name"
  fi
}

ensure_promtool
promtool --version 2>&1 | head -n 1

check "promtool check rules"  promtool check rules deploy/prometheus/alerts.yml
check "promtool test rules"   promtool test rules deploy/prometheus/alerts_test.yml
# prometheus.yml has static targets (worker:9464). `check config` does not resolve
# them, so it runs without the compose network. It also checks the rule files it loads.
check "promtool check config" promtool check config deploy/prometheus/prometheus.yml
check "grafana JSON valid"    python3 scripts/check_deploy.py json
check "dashboard pin-crm"     python3 scripts/check_deploy.py dashboard
check "grafana provisioning"  python3 scripts/check_deploy.py grafana
check "runbook links"         python3 scripts/check_deploy.py runbooks
check "metric names vs src"   python3 scripts/check_deploy.py metrics
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install --quiet pyyaml
check "PrometheusRule = alerts.yml" python3 scripts/gen-prometheus-rule.py --check
check "kubernetes manifests"  bash scripts/check-kubernetes.sh
if [[ "${CHECK_DEPLOY_LIVE:-1}" != 0 ]]; then
  check "live prometheus"     python3 scripts/check_deploy.py live
else
  echo "== live prometheus: skipped (CHECK_DEPLOY_LIVE=0)"
fi

if ((failed)); then
  printf -- '-- failed: %s\n' "${failures[@]}"
fi
echo "check-deploy: $passed passed, $failed failed"
((failed == 0))
